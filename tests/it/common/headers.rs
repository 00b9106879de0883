//! The pipeline-file text every test starts from. A test's pipeline is `HEADER` (or `DEBEZIUM_HEADER`)
//! followed by the sections the test is about, so what a test checks stays visible in the test.
//!
//! In a `const` write `concat!(header!(), r#"…"#)`; in a `format!` write `{HEADER}` (its `{group}` … are not
//! format arguments: [`super::pipeline`] fills them in).

/// The `[kafka]` and `[postgres]` sections of a test pipeline as a string literal: the test's group reads the
/// test's topic from the earliest offset into the test's schema (`{group}`, `{topic}`, `{schema}` are filled in
/// by [`super::pipeline`]).
macro_rules! header {
    () => {
        "[kafka]
group-id = \"{group}\"
topics = [\"{topic}\"]
start = \"earliest\"
[postgres]
schema = \"{schema}\"
"
    };
}
pub(crate) use header;

/// [`header!`] plus `[source] format = "debezium"`.
macro_rules! debezium_header {
    () => {
        concat!(
            $crate::common::header!(),
            "[source]
format = \"debezium\"
"
        )
    };
}
pub(crate) use debezium_header;

/// [`header!`] as a constant.
pub const HEADER: &str = header!();

/// [`debezium_header!`] as a constant.
pub const DEBEZIUM_HEADER: &str = debezium_header!();
