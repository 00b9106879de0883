//! What `prove` prints: the pipeline's four answers, one row per boundary (pass/fail, runs, time) and, for a
//! failure, the first differing rows per table (expected vs got); or the same as JSON (`--json`).

use serde::Serialize;

use super::state::TableDiff;

/// One boundary's result.
#[derive(Debug, Clone, Serialize)]
pub struct Boundary {
    /// Its number in the list (1–10).
    pub number: u8,
    /// Its name.
    pub name: &'static str,
    /// `pass`, `fail`, or `n/a` (does not apply to this pipeline, said in `note`).
    pub result: &'static str,
    /// Engine runs it took.
    pub runs: u64,
    /// Wall time, ms.
    pub ms: u64,
    /// What was checked, or why it failed.
    pub note: String,
    /// The tables that differ from the reference (first rows each way).
    pub diff: Vec<TableDiff>,
}

impl Boundary {
    /// Whether it did not fail.
    pub fn ok(&self) -> bool {
        self.result != "fail"
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The pipeline file.
    pub pipeline: String,
    /// The four answers (as `replaysafe check` prints them).
    pub answers: String,
    /// Records in the fixture, and partitions.
    pub records: usize,
    /// Partitions the records are on.
    pub partitions: usize,
    /// The shuffles' seed.
    pub seed: u64,
    /// The scratch schemas' id (`rsprove_<id>_<n>`).
    pub run_id: String,
    /// Scratch schemas left (`--keep`).
    pub kept: Vec<String>,
    /// Scratch topics left on `--brokers` (`--keep`; without it they are deleted at the end).
    pub kept_topics: Vec<String>,
    /// One per boundary, in order.
    pub boundaries: Vec<Boundary>,
    /// Whether every boundary passed.
    pub passed: bool,
}

impl Report {
    /// The text report. Row values (record content: `--from-topic` samples a live topic), the tables' names and
    /// the notes (which may quote a record or a server) have their control characters escaped
    /// ([`crate::printable::escape_controls`]): a value can neither act on the terminal nor forge a line of the
    /// report. The JSON form (`--json`) keeps them exactly.
    pub fn text(&self) -> String {
        use crate::printable::escape_controls as e;
        let mut out = format!(
            "replaysafe prove — {}\n\n{}\n",
            self.pipeline,
            self.answers.trim_end()
        );
        out.push_str(&format!(
            "\n{} records on {} partitions; shuffles seeded {}\n\n",
            self.records, self.partitions, self.seed
        ));
        out.push_str(&format!(
            "{:>3}  {:<34} {:<6} {:>5} {:>8}  {}\n",
            "#", "boundary", "result", "runs", "time", "checked"
        ));
        for b in &self.boundaries {
            out.push_str(&format!(
                "{:>3}  {:<34} {:<6} {:>5} {:>6.1} s  {}\n",
                b.number,
                b.name,
                b.result.to_uppercase(),
                b.runs,
                b.ms as f64 / 1000.0,
                e(&b.note)
            ));
        }
        for b in self.boundaries.iter().filter(|b| !b.diff.is_empty()) {
            out.push_str(&format!(
                "\n── {} {}: the state differs from the reference (apply once)\n",
                b.number, b.name
            ));
            for d in &b.diff {
                out.push_str(&format!(
                    "   table {} ({} rows expected, {} got)\n",
                    e(&d.table),
                    d.counts.0,
                    d.counts.1
                ));
                for r in &d.expected {
                    out.push_str(&format!("     expected  {}\n", e(r)));
                }
                for r in &d.got {
                    out.push_str(&format!("     got       {}\n", e(r)));
                }
            }
        }
        if !self.kept.is_empty() {
            out.push_str(&format!(
                "\nscratch schemas kept: {}\n",
                self.kept.join(", ")
            ));
        }
        if !self.kept_topics.is_empty() {
            out.push_str(&format!(
                "scratch topics kept: {}\n",
                self.kept_topics.join(", ")
            ));
        }
        let failed: Vec<String> = self
            .boundaries
            .iter()
            .filter(|b| !b.ok())
            .map(|b| format!("{} {}", b.number, b.name))
            .collect();
        out.push_str(&if failed.is_empty() {
            "\nevery boundary passed: replay is harmless for this pipeline on these records\n"
                .to_string()
        } else {
            format!("\nFAILED: {}\n", failed.join("; "))
        });
        out
    }
}
