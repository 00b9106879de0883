//! `/metrics` texts read with a Prometheus exposition-format parser (the `prometheus-parse` crate), so a test
//! names a series by its name and the labels it cares about, whatever global labels (`pipeline`, `group`) the
//! process adds.

/// The parsed samples of a `/metrics` text.
///
/// # Panics
/// When a line is neither a `# HELP`, a `# TYPE`, a sample nor empty (what the parser would skip silently).
pub fn parse_scrape(text: &str) -> prometheus_parse::Scrape {
    use prometheus_parse::LineInfo;
    for line in text.lines() {
        let ok = match LineInfo::parse(line) {
            LineInfo::Doc { .. } | LineInfo::Type { .. } | LineInfo::Empty => true,
            LineInfo::Sample { .. } => !line.starts_with('#'),
            LineInfo::Ignored => false,
        };
        assert!(ok, "not an exposition-format line: {line:?}\nin:\n{text}");
    }
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parsed")
}

/// The value of the counter, gauge or untyped sample `name` whose labels include every `(label, value)` of
/// `labels`; `None` when there is none.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::Value;
    parse_scrape(text)
        .samples
        .into_iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .find_map(|s| match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
            _ => None,
        })
}
