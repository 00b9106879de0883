//! The pipeline file's text: every carried-over choice with a comment saying where it came from, the notes at
//! the end.

use super::{Note, NoteKind, Plan};

/// Comment lines are wrapped at this many characters.
const WIDTH: usize = 112;

/// A TOML basic string.
fn q(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// `text` as `# ` comment lines of at most [`WIDTH`] characters (a word longer than that stays whole).
fn comment(out: &mut String, text: &str) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > WIDTH && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

/// The pipeline file of `plan`, with `notes` at the end.
pub(super) fn render(plan: &Plan, notes: &[Note]) -> String {
    let mut o = String::new();
    comment(
        &mut o,
        &format!(
            "A replaysafe pipeline imported by `replaysafe import connector` from {} — the Kafka Connect connector \
             `{}` ({}). Review it: each choice says where it came from, and what could not be carried over is listed \
             at the end (also printed on stderr). Then `replaysafe check --config <this file>`; docs/switching.md \
             \"From a Kafka Connect JDBC sink\".",
            plan.file, plan.name, plan.class
        ),
    );
    o.push_str("#\n");
    comment(
        &mut o,
        "The topics must hold Debezium change events as the source connector writes them: records flattened on the \
         source side (ExtractNewRecordState in the source connector) are quarantined as flattened-record. The \
         brokers are the Connect worker's, not in the connector config: [kafka] brokers, --brokers or KAFKA_BROKERS.",
    );
    o.push_str("\n[kafka]\n");
    comment(
        &mut o,
        &format!(
            "Not the connector's group (connect-{}): replaysafe keeps its own checkpoints in PostgreSQL, so both can \
             read the topics at once.",
            plan.name
        ),
    );
    o.push_str(&format!("group-id = {}\n", q(&plan.group)));
    comment(&mut o, &format!("From {}.", plan.topics_why));
    let topics: Vec<String> = plan.topics.iter().map(|t| q(t)).collect();
    o.push_str(&format!("topics = [{}]\n", topics.join(", ")));
    comment(&mut o, &format!("start: {}.", plan.start_why));
    match plan.start {
        Some(s) => o.push_str(&format!("start = {}\n", q(s))),
        None => o.push_str("# start = \"earliest\"\n"),
    }

    o.push_str("\n[source]\n");
    comment(&mut o, "The JDBC sink's records are Debezium change events (the sink, or its ExtractNewRecordState transform, unwraps them; replaysafe reads the envelope itself and orders each row's changes by their source position).");
    o.push_str("format = \"debezium\"\n");
    comment(&mut o, &format!("From {}.", plan.encoding.why));
    o.push_str(&format!("encoding = {}\n", q(plan.encoding.encoding)));
    if let Some(r) = &plan.encoding.registry {
        let mut parts = vec![format!("url = {}", q(&r.url))];
        if let Some(u) = &r.username {
            parts.push(format!("username = {}", q(u)));
        }
        if let Some(f) = &r.password_file {
            parts.push(format!("password-file = {}", q(f)));
        }
        o.push_str(&format!("schema-registry = {{ {} }}\n", parts.join(", ")));
    }

    o.push_str("\n[postgres]\n");
    match &plan.database {
        Some(d) => {
            comment(&mut o, "From connection.url and the connector's user; a password is never copied into this file.");
            o.push_str(&format!("url = {}\n", q(&d.url)));
            if let Some(f) = &d.password_file {
                comment(
                    &mut o,
                    "The file's first line is the password (connection.password, not copied).",
                );
                o.push_str(&format!("password-file = {}\n", q(f)));
            }
        }
        None => comment(
            &mut o,
            "No connection.url: the database is DATABASE_URL's at run time.",
        ),
    }
    comment(
        &mut o,
        "A schema of its own beside the connector's tables, so that both can run side by side until the switch \
         (replaysafe's own tables — ledger, checkpoints, dead letters — live here too).",
    );
    o.push_str(&format!("schema = {}\n", q(&plan.schema)));

    if let Some(t) = plan.tolerance {
        o.push_str("\n[errors]\n");
        comment(&mut o, &format!("From {}.", plan.tolerance_why));
        o.push_str(&format!("tolerance = {}\n", q(t)));
    }

    for p in &plan.projections {
        o.push('\n');
        comment(
            &mut o,
            &format!(
                "The connector's table {} (from topic{} {}). No `columns`: the connector config has no column types, \
                 so the table must exist before init/run — e.g. a copy of the connector's{}:",
                p.connector_table,
                if p.topics.len() == 1 { "" } else { "s" },
                p.topics.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", "),
                if p.foreign_columns.is_empty() { "" } else { " without the columns replaysafe does not write" },
            ),
        );
        // One line, as it is pasted into psql.
        o.push_str(&format!(
            "#   CREATE TABLE {}.{} (LIKE {} INCLUDING ALL);",
            plan.schema, p.table, p.connector_table
        ));
        if !p.foreign_columns.is_empty() {
            o.push_str(&format!(
                " ALTER TABLE {}.{} {};",
                plan.schema,
                p.table,
                p.foreign_columns
                    .iter()
                    .map(|c| format!("DROP COLUMN {c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        o.push('\n');
        o.push_str("[[projection]]\nkind = \"row\"\n");
        comment(&mut o, &format!("From {}.", p.table_why));
        o.push_str(&format!("table = {}\n", q(&p.table)));
        match &p.source_table {
            Some(s) => {
                comment(&mut o, "Read from the topic's name (<topic.prefix>.<schema>.<table>): check it.");
                o.push_str(&format!("source-table = {}\n", q(s)));
            }
            None => comment(
                &mut o,
                &format!(
                    "source-table not known from the topic: this takes the changes of a source table named `{}`; \
                     set source-table = \"<schema>.<table>\" if yours is named otherwise.",
                    p.table
                ),
            ),
        }
        comment(&mut o, &format!("From {}.", p.key_why));
        match &p.key {
            Some(k) => {
                let k: Vec<String> = k.iter().map(|c| q(c)).collect();
                o.push_str(&format!("key = [{}]\n", k.join(", ")));
            }
            None => o.push_str("# key = [...]  (default: the table's primary key)\n"),
        }
        comment(&mut o, &p.tombstones_why);
        o.push_str(&format!("tombstones = {}\n", q(p.tombstones)));
        comment(&mut o, &p.truncate_why);
        o.push_str(&format!("truncate = {}\n", q(p.truncate)));
        comment(&mut o, &format!("From {}.", p.new_columns_why));
        o.push_str(&format!("new-columns = {}\n", q(p.new_columns)));
    }

    for kind in [NoteKind::NotCarried, NoteKind::Differs, NoteKind::Check] {
        let of_kind: Vec<&Note> = notes.iter().filter(|n| n.kind == kind).collect();
        if of_kind.is_empty() {
            continue;
        }
        o.push('\n');
        comment(
            &mut o,
            &format!("{} (printed on stderr too):", capitalized(kind.heading())),
        );
        for n in of_kind {
            comment(&mut o, &format!("- `{}`: {}", n.key, n.text));
        }
    }
    o
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}
