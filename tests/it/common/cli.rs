//! The `replaysafe` subcommands the tests run against a pipeline file, one function each, so a test names only
//! the window, the stop and the options it is about.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use super::{replaysafe, replaysafe_with, spawn, Out, Pipeline};

/// A path as the `&str` a command line takes.
pub fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `replaysafe backfill --config <p> --from <from> <stop flag> <stop> --group-id <group> <extra…>`; `stop` is
/// the stop option and its value: `("--to", time)`, `("--to-offsets", file)` or `("--to-group", group)`.
pub fn backfill(p: &Pipeline, from: &str, stop: (&str, &str), group: &str, extra: &[&str]) -> Out {
    let head = [
        "backfill",
        "--config",
        arg(&p.path),
        "--from",
        from,
        stop.0,
        stop.1,
        "--group-id",
        group,
    ];
    replaysafe(&[&head[..], extra].concat())
}

/// `replaysafe rebuild --config <p> --from <from> --to <to> --group-id <group> <extra…>` (dates).
pub fn rebuild(p: &Pipeline, from: &str, to: &str, group: &str, extra: &[&str]) -> Out {
    let head = [
        "rebuild",
        "--config",
        arg(&p.path),
        "--from",
        from,
        "--to",
        to,
        "--group-id",
        group,
    ];
    replaysafe(&[&head[..], extra].concat())
}

/// `replaysafe offsets snapshot --config <p> --group <group> -o <out>`.
pub fn offsets_snapshot(p: &Pipeline, group: &str, out: &Path) -> Out {
    let args = [
        "offsets",
        "snapshot",
        "--config",
        arg(&p.path),
        "--group",
        group,
    ];
    replaysafe(&[&args[..], &["-o", arg(out)]].concat())
}

/// `replaysafe verify snapshot --config <p> --table <table> [--where <filter>] -o <out>`.
pub fn verify_snapshot(p: &Pipeline, table: &str, filter: Option<&str>, out: &Path) -> Out {
    let mut args = vec![
        "verify",
        "snapshot",
        "--config",
        arg(&p.path),
        "--table",
        table,
    ];
    if let Some(f) = filter {
        args.extend(["--where", f]);
    }
    args.extend(["-o", arg(out)]);
    replaysafe(&args)
}

/// `replaysafe verify diff --before <before> --expect <report>`.
pub fn verify_diff(before: &Path, report: &Path) -> Out {
    replaysafe(&[
        "verify",
        "diff",
        "--before",
        arg(before),
        "--expect",
        arg(report),
    ])
}

/// The failpoint that makes `run` exit between the database commit and the Kafka offset commit (as an
/// environment variable for [`try_run_with`]).
pub const CRASH_AFTER_DB_COMMIT: (&str, &str) = (
    "REPLAYSAFE_FAILPOINTS",
    "after-db-commit-before-kafka-commit=return",
);

/// `replaysafe run --config <path> --until-caught-up` with the extra environment `envs`, killed after `limit`;
/// the exit code is the caller's to check.
pub fn try_run_with(path: impl AsRef<Path>, envs: &[(&str, &str)], limit: Duration) -> Out {
    let config = arg(path.as_ref());
    replaysafe_with(
        &["run", "--config", config, "--until-caught-up"],
        envs,
        limit,
    )
}

/// [`try_run_with`] without extra environment, killed after two minutes.
pub fn try_run(path: impl AsRef<Path>) -> Out {
    try_run_with(path, &[], Duration::from_secs(120))
}

/// Starts `replaysafe run --config <p> <extra…>` in the background, its stdout and stderr in `<name>.out` and
/// `<name>.err` of the pipeline's directory.
pub fn spawn_run(p: &Pipeline, extra: &[&str], name: &str) -> Child {
    let head = ["run", "--config", arg(&p.path)];
    spawn(&[&head[..], extra].concat(), &[], p.dir.path(), name)
}
