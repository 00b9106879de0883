//! The `replaysafe` binary: parses the command line ([`cli`]), sets up logging, runs the command ([`cmd`]),
//! maps errors to exit codes (see docs/operations.md "Exit codes") and prints the error chain.

mod cli;
mod cmd;

use std::time::Duration;

use clap::Parser;
use cli::{Cli, Command};
use replaysafe::error::{Error, EXIT_FAILURE, EXIT_OK};

/// Runs the command.
///
/// # Errors
/// The command's (its exit code: docs/operations.md "Exit codes").
fn execute(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(a) => cmd::run::run(a),
        Command::Load(a) => cmd::load::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Init(a) => cmd::init::run(a),
        Command::Outbox { command } => cmd::outbox::run(command),
        Command::Offsets { command } => cmd::offsets::run(command),
        Command::Projection { command } => cmd::projection::run(command),
        Command::Backfill(a) => cmd::backfill::run(a),
        Command::Rebuild(a) => cmd::rebuild::run(a),
        Command::Verify { command } => cmd::verify::run(command),
        Command::DeadLetters { command } => cmd::dead_letters::run(command),
        Command::Ledger { command } => cmd::ledger::run(command),
        Command::Import { command } => cmd::import::run(command),
        Command::Prove(a) => cmd::prove::run(a),
        Command::Demo(a) => cmd::demo::run(a),
    }
}

/// Logs go to stderr (`REPLAYSAFE_LOG`, default `info,tokio_postgres=warn`); the demo's go to the file
/// [`replaysafe::demo::log_path`] so that its narrative on stdout reads as one story.
fn logging(cli: &Cli) {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("REPLAYSAFE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn"))
    };
    if matches!(cli.command, Command::Demo(_)) {
        let path = replaysafe::demo::log_path();
        if let Ok(file) = std::fs::File::create(&path) {
            tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false)
                .init();
            return;
        }
    }
    // Every line with URL passwords masked (librdkafka names a broker by its URL, registry URLs hold credentials).
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(replaysafe::printable::MaskedStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// `replaysafe check … | head`: Rust ignores SIGPIPE, so `println!` to a closed pipe panics. A reader that
/// stopped reading is not an error of ours: exit quietly with 0, like other Unix filters (what was committed
/// stays committed; nothing in flight is lost — a batch not committed is read again from the checkpoints).
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.contains("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(EXIT_OK);
        }
        default(info);
    }));
}

fn main() {
    quiet_on_broken_pipe();
    let cli = Cli::parse();
    logging(&cli);
    replaysafe::endpoint::set_connect_timeout(Duration::from_secs(cli.connect_timeout));
    // REPLAYSAFE_FAILPOINTS="name=action;…" (the `fail` crate's syntax), test builds only.
    #[cfg(feature = "failpoints")]
    if let Ok(spec) = std::env::var("REPLAYSAFE_FAILPOINTS") {
        for part in spec.split(';').filter(|s| !s.is_empty()) {
            if let Some((name, action)) = part.split_once('=') {
                fail::cfg(name, action).expect("valid failpoint spec");
            }
        }
    }
    let code = match execute(cli.command) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            let code = e
                .chain()
                .find_map(|c| c.downcast_ref::<Error>())
                .map_or(EXIT_FAILURE, Error::exit_code);
            // Record text or a server's answer in a message cannot act on the terminal, and a URL's password
            // never shows (as in every log line).
            let safe = |t: &str| {
                replaysafe::printable::terminal_safe(&replaysafe::endpoint::mask_urls(t))
                    .into_owned()
            };
            eprintln!("error: {}", safe(&e.to_string()));
            // Each cause once: a wrapped error often repeats its source's text.
            let mut said = vec![e.to_string()];
            for cause in e.chain().skip(1).map(|c| c.to_string()) {
                if !said.iter().any(|s| s.contains(&cause)) {
                    eprintln!("  caused by: {}", safe(&cause));
                    said.push(cause);
                }
            }
            code
        }
    };
    std::process::exit(code);
}
