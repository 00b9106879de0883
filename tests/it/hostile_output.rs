//! Issue 35.4: what a terminal or a script reads. Dead letters whose key, value and detail hold terminal escape
//! sequences (ECMA-48 CSI and OSC), newlines and tabs: `dead-letters list` prints one line per dead letter
//! without a raw control byte, and `--format json` prints one JSON object per line whose key and value decode
//! (base64) to the stored bytes.

use base64::Engine as _;

use crate::cases::ORDERS;
use crate::common::*;

/// Bytes that would clear the screen, set the terminal's title, ring the bell, forge a line and a column.
const HOSTILE: &str = "\u{1b}[2J\u{1b}]0;owned\u{7}\nforged\tline\r\u{9b}";

/// A dead letter as stored: reason, detail, key, value.
type Stored = (String, String, Option<Vec<u8>>, Option<Vec<u8>>);

#[test]
fn dead_letters_list_escapes_control_characters_and_json_round_trips_the_bytes() {
    let (db, topic) = stage("hostout", 2);
    let good = r#"{"event_id":"7a6f1c2e-0000-4000-8000-000000000001","event_type":"OrderPlaced","entity_id":"o-1",
                   "version":1,"occurred_at":"2024-04-26T10:00:00Z","data":{"customer_id":"c-1"}}"#;
    let bad_field = serde_json::json!({
        "event_id": HOSTILE, "event_type": "OrderPlaced", "entity_id": "o-2", "version": 1,
        "occurred_at": "2024-04-26T10:00:00Z", "data": {}
    })
    .to_string();
    let bad_json = format!("{{{HOSTILE} not json");
    let recs = [
        Rec::json(0, "k-good", &good.replace('\n', " "), 1_714_125_600_000),
        Rec {
            partition: 0,
            key: Some(format!("k{HOSTILE}").into_bytes()),
            value: Some(bad_field.clone().into_bytes()),
            timestamp_ms: Some(1_714_125_600_000),
        },
        Rec {
            partition: 1,
            key: Some(HOSTILE.as_bytes().to_vec()),
            value: Some(bad_json.clone().into_bytes()),
            timestamp_ms: Some(1_714_125_600_000),
        },
    ];
    produce(&topic, &recs);
    let text = ORDERS.replace("MAXBYTES", "");
    let p = pipeline(&text, &topic, &unique("g"), &db.schema);
    let t = run_caught_up(&p.path).tally();
    assert_eq!((t.consumed, t.landed, t.quarantined), (3, 1, 2), "{t:?}");
    let stored: Vec<Stored> = db
        .query(
            "SELECT reason, detail, key, value FROM {s}.replaysafe_dead_letters ORDER BY partition",
            &[],
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert!(
        stored[0].1.contains('\u{1b}'),
        "the detail quotes the hostile field, so the test shows its escaping: {stored:?}"
    );

    let listed = replaysafe(&["dead-letters", "list", "--config", arg(&p.path)]);
    listed.assert_ok();
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "one line per dead letter:\n{}",
        listed.stdout
    );
    for (line, (reason, ..)) in lines.iter().zip(&stored) {
        assert_eq!(line.split('\t').count(), 5, "five columns: {line}");
        assert!(line.contains(&format!("\t{reason}\t")), "{line}");
        assert!(
            !line.chars().any(|c| c.is_control() && c != '\t'),
            "no raw control character: {line:?}"
        );
    }
    assert!(
        lines[0].contains("\\u{1b}[2J\\u{1b}]0;owned\\u{7}\\nforged\\tline\\r\\u{9b}"),
        "{}",
        lines[0]
    );
    assert!(!listed.stderr.contains('\u{1b}'), "{}", listed.stderr);

    let json = replaysafe(&[
        "dead-letters",
        "list",
        "--config",
        arg(&p.path),
        "--format",
        "json",
    ]);
    json.assert_ok();
    let objects: Vec<serde_json::Value> = json
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(objects.len(), 2, "{}", json.stdout);
    assert!(!json.stdout.contains('\u{1b}'));
    let b64 = |v: &serde_json::Value| {
        v.as_str().map(|s| {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .expect("base64")
        })
    };
    for (i, (o, (reason, detail, key, value))) in objects.iter().zip(&stored).enumerate() {
        assert_eq!(o["topic"].as_str(), Some(topic.as_str()));
        assert_eq!(o["partition"].as_i64(), Some(i as i64));
        assert_eq!(o["offset"].as_i64(), Some(if i == 0 { 1 } else { 0 }));
        assert_eq!(o["reason"].as_str(), Some(reason.as_str()));
        assert_eq!(
            o["detail"].as_str(),
            Some(detail.as_str()),
            "the detail round-trips"
        );
        assert_eq!(b64(&o["key"]), *key, "the key round-trips");
        assert_eq!(b64(&o["value"]), *value, "the value round-trips");
        assert_eq!(o["timestamp_ms"].as_i64(), Some(1_714_125_600_000));
    }
    assert_eq!(b64(&objects[0]["value"]), Some(bad_field.into_bytes()));
    assert_eq!(b64(&objects[1]["key"]), Some(HOSTILE.as_bytes().to_vec()));
    assert_eq!(b64(&objects[1]["value"]), Some(bad_json.into_bytes()));
}
