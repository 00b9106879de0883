//! Issue 42 item 1: a shadow pipeline beside a hand-made consumer, then `verify compare` — the rows of the user's
//! table that differ from the projection, the totals, and which differences are redeliveries (the same event id
//! at other offsets, as the ledger's claims say).

use std::collections::BTreeMap;

use crate::common::*;
use crate::core::SEED;

const APR25: i64 = 1_714_003_200_000; // 2024-04-25T00:00:00Z

/// One event: (record, day, customer, amount).
fn event(i: usize, id: uuid::Uuid, day: i64, customer: &str, amount: &str) -> Rec {
    let ts = APR25 + day * 86_400_000 + (i as i64) * 60_000;
    let occurred = chrono::DateTime::from_timestamp_millis(ts)
        .unwrap()
        .to_rfc3339();
    Rec::json(
        (i % 2) as i32,
        customer,
        &format!(
            r#"{{"event_id":"{id}","customer_id":"{customer}","amount":"{amount}","occurred_at":"{occurred}"}}"#
        ),
        ts,
    )
}

/// The `(key, theirs, ours, difference, explanation)` lines of `verify compare`'s table.
fn rows(stdout: &str) -> BTreeMap<String, (String, String, String, String)> {
    stdout
        .lines()
        .filter(|l| l.starts_with("2024-"))
        .map(|l| {
            let cells: Vec<&str> = l.splitn(5, char::is_whitespace).collect();
            let mut parts = l.split_whitespace();
            let key = parts.next().unwrap().to_string();
            let (theirs, ours, diff) = (
                parts.next().unwrap().to_string(),
                parts.next().unwrap().to_string(),
                parts.next().unwrap().to_string(),
            );
            assert!(cells.len() >= 2, "{l}");
            let why = l.split_once("   ").map(|x| x.1).unwrap_or_default();
            let why = why.rsplit("   ").next().unwrap().trim().to_string();
            (key, (theirs, ours, diff, why))
        })
        .collect()
}

fn compare(p: &Pipeline, table: &str, with: &str) -> Out {
    replaysafe(&[
        "verify",
        "compare",
        "--config",
        arg(&p.path),
        "--table",
        table,
        "--with",
        with,
    ])
}

/// A topic where a producer's retries wrote three events again at other offsets (one of them twice); a
/// hand-made consumer's tables that count and sum every record, plus one count lost and one row of a day the
/// shadow does not cover; the shadow pipeline run into its own schema. `verify compare` names exactly the doubled
/// rows as explained by their redeliveries (with their counts and amounts) and the lost count as not explained,
/// prints the totals, exits 1; a table equal to the projection exits 0; a table without the value column is
/// refused (exit 2) naming what it lacks and what it has.
#[test]
fn compare_names_the_rows_a_hand_made_consumer_counted_twice_as_redeliveries() {
    let (db, topic) = stage("shadow", 2);
    let theirs = Db::fresh("shadow_theirs");
    let customers = ["c-0", "c-1", "c-2", "c-3"];
    let mut recs = Vec::new();
    let mut ids = Vec::new();
    for i in 0..48 {
        let id = uuid::Uuid::new_v4();
        let amount = if i % 5 == 0 { "-5.25" } else { "12.50" };
        recs.push(event(i, id, (i % 3) as i64, customers[i % 4], amount));
        ids.push((id, (i % 3) as i64, customers[i % 4], amount));
    }
    // The producer's retries: event 1 twice more, events 6 and 10 (a refund) once more, on both partitions.
    // The same bytes each time (the same event id at another offset, on the same partition or the other).
    for (n, &i) in [1usize, 1, 6, 10].iter().enumerate() {
        let mut again = recs[i].clone();
        again.partition = (n % 2) as i32;
        recs.push(again);
    }
    let offsets = produce(&topic, &recs);
    assert_eq!(offsets.len(), 52);
    // The hand-made consumer counted and summed every record it read.
    let mut counts: BTreeMap<(String, String), (i64, f64)> = BTreeMap::new();
    for r in &recs {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
        let day = v["occurred_at"].as_str().unwrap()[..10].to_string();
        let c = v["customer_id"].as_str().unwrap().to_string();
        let e = counts.entry((day, c)).or_default();
        e.0 += 1;
        e.1 += v["amount"].as_str().unwrap().parse::<f64>().unwrap();
    }
    theirs.execute(
        "CREATE TABLE {s}.daily_counts (day date, customer_id text, n bigint); \
         CREATE TABLE {s}.daily_totals (day date, customer_id text, total numeric); \
         CREATE TABLE {s}.no_value (day date, customer_id text, count bigint)",
    );
    for ((d, c), (n, total)) in &counts {
        // One count lost on 2024-04-27 c-1.
        let n = if (d.as_str(), c.as_str()) == ("2024-04-27", "c-1") {
            n - 1
        } else {
            *n
        };
        theirs.execute(&format!(
            "INSERT INTO {{s}}.daily_counts VALUES ('{d}', '{c}', {n}); \
             INSERT INTO {{s}}.daily_totals VALUES ('{d}', '{c}', {total})"
        ));
    }
    // A day before the shadow's first: not compared.
    theirs.execute("INSERT INTO {s}.daily_counts VALUES ('2024-04-20', 'c-0', 3)");
    let day_of = |i: usize| format!("2024-04-{}", 25 + ids[i].1);
    let doubled = [
        (format!("{}|{}", day_of(1), ids[1].2), 2),
        (format!("{}|{}", day_of(6), ids[6].2), 1),
        (format!("{}|{}", day_of(10), ids[10].2), 1),
    ];
    // The events 1, 6 and 10 fall on three different rows, none of them the lost count's.
    assert_eq!(
        doubled
            .iter()
            .map(|d| d.0.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3
    );
    assert!(
        doubled.iter().all(|d| d.0 != "2024-04-27|c-1"),
        "{doubled:?}"
    );

    // The shadow: the same pipeline into its own schema under its own group; the ledger holds the group-by
    // fields and the summed field.
    let text = format!("{SEED}\n[ledger]\ncolumns = [\"customer_id\", \"amount\"]\n");
    let shadow = pipeline(&text, &topic, &unique("shadow"), &db.schema);
    // Before the shadow ran: refused, saying so (no table yet; then, after init, no checkpoint).
    let with = format!("{}.daily_counts", theirs.schema);
    let out = compare(&shadow, "daily_counts", &with);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("does not exist: run `replaysafe run"),
        "{}",
        out.stderr
    );
    replaysafe(&["init", "--config", arg(&shadow.path)]).assert_ok();
    let out = compare(&shadow, "daily_counts", &with);
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("has consumed nothing yet"),
        "{}",
        out.stderr
    );
    let t = run_caught_up(&shadow.path).tally();
    assert_eq!((t.landed, t.duplicate), (48, 4), "{t:?}");

    let with = format!("{}.daily_counts", theirs.schema);
    let out = compare(&shadow, "daily_counts", &with);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    let got = rows(&out.stdout);
    let mut want: BTreeMap<String, (String, String, String, String)> = BTreeMap::new();
    for (k, n) in &doubled {
        let (d, c) = k.split_once('|').unwrap();
        let theirs_n = counts[&(d.to_string(), c.to_string())].0;
        want.insert(
            k.clone(),
            (
                theirs_n.to_string(),
                (theirs_n - n).to_string(),
                n.to_string(),
                explained(*n),
            ),
        );
    }
    let lost = counts[&("2024-04-27".to_string(), "c-1".to_string())].0;
    want.insert(
        "2024-04-27|c-1".into(),
        (
            (lost - 1).to_string(),
            lost.to_string(),
            "-1".into(),
            "not explained: no redelivery of its claims in the topic".into(),
        ),
    );
    assert_eq!(got, want, "{}", out.stdout);
    let rows_theirs = counts.len();
    assert!(
        out.stdout.contains(&format!(
            "totals: theirs 51 ({rows_theirs} rows), ours 48 ({rows_theirs} rows), difference 3\n"
        )),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("4 row(s) differ: 3 explained by redeliveries, 1 not explained"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("days compared: 2024-04-25 … 2024-04-27")
            && out
                .stdout
                .contains("not compared (before the later first day of the two): 1 row(s) of the table, 0 of the projection"),
        "{}",
        out.stdout
    );

    // The sum: the doubled rows differ by the redelivered events' amounts, all explained.
    let out = compare(
        &shadow,
        "daily_totals",
        &format!("{}.daily_totals", theirs.schema),
    );
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    let got = rows(&out.stdout);
    let mut want = BTreeMap::new();
    for (k, n) in &doubled {
        let i = [1usize, 6, 10]
            .into_iter()
            .find(|&i| format!("{}|{}", day_of(i), ids[i].2) == *k)
            .unwrap();
        let added: f64 = (0..*n).map(|_| ids[i].3.parse::<f64>().unwrap()).sum();
        want.insert(k.clone(), (bigdecimal(added), explained(*n)));
    }
    let got: BTreeMap<String, (String, String)> = got
        .into_iter()
        .map(|(k, (_, _, d, w))| (k, (d, w)))
        .collect();
    assert_eq!(got, want, "{}", out.stdout);

    // The replaysafe projection itself, copied as the user's table: they agree, exit 0.
    theirs.execute(&format!(
        "CREATE TABLE {{s}}.agree AS SELECT day, customer_id, n FROM \"{}\".daily_counts",
        db.schema
    ));
    let out = compare(&shadow, "daily_counts", &format!("{}.agree", theirs.schema));
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("0 row(s) differ"), "{}", out.stdout);
    assert!(rows(&out.stdout).is_empty(), "{}", out.stdout);

    // A table without the value column is refused, naming what it lacks and what it has.
    let out = compare(
        &shadow,
        "daily_counts",
        &format!("{}.no_value", theirs.schema),
    );
    assert_eq!(out.code, Some(2), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("has no column `n`")
            && out.stderr.contains("it has: day, customer_id, count"),
        "{}",
        out.stderr
    );
    let out = compare(&shadow, "daily_counts", "no_such_schema.daily_counts");
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("no such table"), "{}", out.stderr);
    // A bare name is refused (the sessions pin their own search_path): the schema is asked for.
    let out = compare(&shadow, "daily_counts", "daily_counts");
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("name its schema (e.g. `public.daily_counts`)"),
        "{}",
        out.stderr
    );

    // A table that lost the newest day (2024-04-27) differs on every row of it; rows with a NULL customer
    // are each their own row, named `(null)`; a row of 0 the projection lacks is no difference.
    theirs.execute(&format!(
        "CREATE TABLE {{s}}.lost AS SELECT day, customer_id, n FROM \"{}\".daily_counts \
         WHERE day < '2024-04-27'; INSERT INTO {{s}}.lost VALUES ('2024-04-25', NULL, 7), \
         ('2024-04-26', NULL, 9), ('2024-04-26', 'c-9', 0)",
        db.schema
    ));
    let newest: Vec<String> = db.strings(
        "SELECT day || '|' || customer_id FROM {s}.daily_counts WHERE day = '2024-04-27' ORDER BY 1",
    );
    let out = compare(&shadow, "daily_counts", &format!("{}.lost", theirs.schema));
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    let got: Vec<String> = rows(&out.stdout).into_keys().collect();
    let mut want = newest.clone();
    want.extend([
        "2024-04-25|(null)".to_string(),
        "2024-04-26|(null)".to_string(),
    ]);
    want.sort();
    assert_eq!(got, want, "{}", out.stdout);
}

/// The explanation of a row doubled by `n` redeliveries.
fn explained(n: i64) -> String {
    let s = if n == 1 { "redelivery" } else { "redeliveries" };
    format!("explained: {n} {s} (same event id at other offsets)")
}

/// A decimal as `verify compare` prints it (normalized: no trailing zeros).
fn bigdecimal(x: f64) -> String {
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}
