//! `replaysafe load`: records from a `kcat -C -J` file through the same decode → batch → transaction →
//! checkpoint path as `run`, no broker involved.

use std::path::Path;

use crate::common::*;
use crate::core::{counts, seed_events, SEED};

/// One kcat `-J` line.
pub fn kcat_line(topic: &str, partition: i32, offset: i64, r: &Rec) -> String {
    let s = |b: &Option<Vec<u8>>| match b {
        Some(b) => serde_json::to_string(&String::from_utf8_lossy(b)).unwrap(),
        None => "null".into(),
    };
    let ts = match r.timestamp_ms {
        Some(t) => format!(r#","tstype":"create","ts":{t}"#),
        None => String::new(),
    };
    format!(
        r#"{{"topic":"{topic}","partition":{partition},"offset":{offset}{ts},"broker":1,"key":{},"payload":{}}}"#,
        s(&r.key),
        s(&r.value)
    )
}

fn load(p: &Path, file: &Path, extra: &[&str]) -> Out {
    let mut args = vec!["load", "--config", p.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(file.to_str().unwrap());
    replaysafe(&args)
}

#[test]
fn load_applies_a_kcat_file_once_and_a_second_load_is_all_duplicates() {
    let db = Db::fresh("file_source");
    let topic = unique("file.source");
    let group = unique("file-group");
    let (mut recs, truth) = seed_events(600, 3);
    // A copy of a record (same event, later offset) and a malformed value, both in the file.
    let mut copy = recs[0].clone();
    copy.partition = 1;
    recs.push(copy);
    recs.push(Rec::json(2, "k", "not json", 1_714_003_200_000));
    let mut next = [0i64; 3];
    let lines: Vec<String> = recs
        .iter()
        .map(|r| {
            let p = r.partition as usize;
            // Offsets with a gap every 50 records, as compaction or transaction markers leave them.
            next[p] += if next[p] % 50 == 49 { 2 } else { 1 };
            kcat_line(&topic, r.partition, next[p] - 1, r)
        })
        .collect();
    let p = pipeline(SEED, &topic, &group, &db.schema);
    let file = p.dir.path().join("records.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();

    let out = load(&p.path, &file, &[]);
    out.assert_ok();
    let t = out.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.quarantined),
        (602, 600, 1, 1),
        "{}",
        out.stderr
    );
    // Under a group of its own, named after the file; the pipeline's group has no checkpoint.
    let groups = db.strings("SELECT DISTINCT consumer_group FROM {s}.replaysafe_checkpoints");
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert!(
        groups[0].starts_with("replaysafe-load-records-"),
        "{groups:?}"
    );
    let loaded = groups[0].clone();
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);
    assert_eq!(counts(&db), truth);
    assert_eq!(
        db.i64("SELECT count(*) FROM {s}.replaysafe_dead_letters WHERE reason = 'invalid-json'"),
        1
    );
    for (part, end) in next.iter().enumerate() {
        assert_eq!(db.checkpoint(&loaded, &topic, part as i32), Some(*end));
        assert_eq!(db.checkpoint(&group, &topic, part as i32), None);
    }

    // The same file under the same group: everything is below the checkpoints, nothing is applied.
    let again = load(&p.path, &file, &[]);
    again.assert_ok();
    assert_eq!(again.tally().consumed, 0, "{}", again.stderr);
    assert_eq!(counts(&db), truth);

    // Under a fresh group: every record is read again and recognised in the ledger.
    let other = unique("file-other");
    let replay = load(&p.path, &file, &["--group-id", &other]);
    replay.assert_ok();
    let t = replay.tally();
    assert_eq!(
        (t.consumed, t.landed, t.duplicate, t.quarantined),
        (602, 0, 601, 1)
    );
    assert_eq!(counts(&db), truth);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 600);
    assert_eq!(
        db.i64("SELECT coalesce(sum(n), 0)::bigint FROM {s}.daily_counts"),
        600
    );
    for (part, end) in next.iter().enumerate() {
        assert_eq!(db.checkpoint(&other, &topic, part as i32), Some(*end));
    }
}

#[test]
fn load_refuses_a_bad_file() {
    let db = Db::fresh("file_bad");
    let topic = unique("file.bad");
    let group = unique("file-bad-group");
    let p = pipeline(SEED, &topic, &group, &db.schema);
    let missing = p.dir.path().join("missing.jsonl");
    let out = load(&p.path, &missing, &[]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);

    // Offsets going backwards within a partition: the records before the bad line are applied, then exit 1.
    let (recs, _) = seed_events(3, 1);
    let file = p.dir.path().join("records.jsonl");
    let lines = [
        kcat_line(&topic, 0, 0, &recs[0]),
        kcat_line(&topic, 0, 1, &recs[1]),
        kcat_line(&topic, 0, 1, &recs[2]),
    ];
    std::fs::write(&file, lines.join("\n")).unwrap();
    let own = unique("file-bad-load");
    let out = load(&p.path, &file, &["--group-id", &own]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("records.jsonl:3"), "{}", out.stderr);
    assert!(out.stderr.contains("does not ascend"), "{}", out.stderr);
    assert_eq!(db.i64("SELECT count(*) FROM {s}.replaysafe_ledger"), 2);
    assert_eq!(db.checkpoint(&own, &topic, 0), Some(2));

    // A topic the pipeline does not consume.
    std::fs::write(&file, kcat_line("another.topic", 0, 0, &recs[0]) + "\n").unwrap();
    let out = load(&p.path, &file, &[]);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("not in the pipeline"), "{}", out.stderr);
}
