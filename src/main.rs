//! The `replaysafe` binary: parses the command line ([`cli`]), sets up logging, dispatches to the command,
//! maps errors to exit codes (see docs/operations.md "Exit codes") and prints the error chain.

mod cli;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use cli::{
    brokers, database_url, parse_time, read_json, write_json, Cli, Command, LedgerCommand,
    OffsetsCommand, StartFrom, VerifyCommand,
};
use replaysafe::error::{Error, EXIT_FAILURE, EXIT_OK, EXIT_SHUTDOWN_TIMEOUT};
use replaysafe::ops::{self, backfill::Report};
use replaysafe::{config, sink};

fn signals(flag: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("signal runtime");
        rt.block_on(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            tracing::info!("signal received: finishing in-flight batches");
            flag.store(true, Ordering::Relaxed);
        });
    });
}

/// `run`'s signal handling: the first SIGINT/SIGTERM starts the drain (`shutdown`); if the process is still
/// running `timeout` later, the drain's database retries are ended (`give_up`), the accounting line so far is
/// printed (records not confirmed applied counted `buffered`: [`replaysafe::engine::Reporter::tally`]) and the process
/// exits with [`EXIT_SHUTDOWN_TIMEOUT`].
fn signals_with_deadline(
    shutdown: Arc<AtomicBool>,
    give_up: Arc<AtomicBool>,
    state: Arc<std::sync::OnceLock<replaysafe::engine::Reporter>>,
    timeout: Duration,
) {
    let fired = Arc::new(AtomicBool::new(false));
    signals(fired.clone());
    std::thread::spawn(move || {
        while !fired.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        shutdown.store(true, Ordering::Relaxed);
        std::thread::sleep(timeout);
        give_up.store(true, Ordering::Relaxed);
        tracing::error!(
            timeout_s = timeout.as_secs(),
            "the drain did not finish within --shutdown-timeout (a batch still waiting for the database?): \
             exiting with code {EXIT_SHUTDOWN_TIMEOUT}; what was committed stays, records not applied yet \
             (`buffered`) are read again from the checkpoints on restart"
        );
        // Bounded: when the loop itself is stuck holding the state, the accounting it last published.
        match state.get() {
            Some(r) => println!("{}", r.tally(Duration::from_secs(1)).line()),
            None => tracing::error!("no accounting line: the engine had not started"),
        }
        std::process::exit(EXIT_SHUTDOWN_TIMEOUT);
    });
}

fn check(a: cli::CheckArgs) -> anyhow::Result<()> {
    let p = config::load(&a.config)?;
    println!("{}: valid\n\n{}", a.config.display(), p.four_answers());
    for w in ops::check::warnings(&p) {
        println!("\nwarning: {w}");
    }
    if let Ok(url) = database_url(&p) {
        // How the database is reached (TLS, where the password comes from), never a secret.
        println!("\n{}", replaysafe::sink::conninfo::summary(&url)?);
    } else if let Some(f) = &p.postgres.connection.password_file {
        // No URL here (DATABASE_URL may come at run time): the password file is still read, so a wrong path or an
        // empty file is named now rather than at the first connection.
        replaysafe::sink::conninfo::check_password_file(f)?;
        println!(
            "\npostgres: no URL yet ([postgres] url or DATABASE_URL at run time); password from password-file {}",
            f.display()
        );
    }
    let mut failed = Vec::new();
    if a.connect {
        let brokers = brokers(&p, a.brokers)?;
        // With the pipeline's [kafka.properties] (SASL/TLS): a refused password or certificate is named here.
        let probe = replaysafe::source::kafka::consumer_config(&p, &brokers, &[]);
        replaysafe::source::kafka::reachable(&probe, &brokers, &p.kafka.topics[0])?;
        let missing = ops::check::missing_topics(&p, &brokers, &[])?;
        let security = replaysafe::source::kafka::security_summary(&p);
        println!(
            "\nbroker {} ({security}):",
            replaysafe::endpoint::mask_urls(&brokers)
        );
        let ids = ops::check::log_ids(&p, &brokers, &missing)?;
        let shown = |v: Option<&str>| v.unwrap_or("(not answered)").to_string();
        println!(
            "cluster id {} (recorded beside each checkpoint)",
            shown(ids.cluster.as_deref())
        );
        for t in &p.kafka.topics {
            let ok = !missing.contains(t);
            let id = if ok {
                format!(" (topic id {})", shown(ids.topic(t)))
            } else {
                String::new()
            };
            println!("{} topic {t}{id}", if ok { "ok     " } else { "MISSING" });
        }
        if !missing.is_empty() {
            failed.push(format!("topic(s) {} do not exist", missing.join(", ")));
        }
    }
    if a.database {
        let findings = ops::check::database(&p, &database_url(&p)?, a.days)?;
        println!("\ndatabase (read only, schema {}):", p.postgres.schema);
        for f in &findings {
            println!("{f}");
        }
        let bad: Vec<String> = findings
            .into_iter()
            .filter(|f| !f.ok)
            .map(|f| f.what)
            .collect();
        if !bad.is_empty() {
            failed.push(missing_summary(&bad));
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    Err(Error::Usage(format!("{}: {}", a.config.display(), failed.join("; "))).into())
}

/// `check --database`'s error line: how many items are missing and the first three, each without its fix (the
/// lines above give the fixes).
fn missing_summary(bad: &[String]) -> String {
    let names: Vec<&str> = bad
        .iter()
        .take(3)
        .map(|w| w.split(": ").next().unwrap_or(w))
        .collect();
    let more = match bad.len() {
        0..=3 => String::new(),
        n => format!(" (and {} more)", n - 3),
    };
    format!(
        "database: {} item(s) MISSING (each listed above with its fix): {}{more}",
        bad.len(),
        names.join("; ")
    )
}

fn init(config: PathBuf, days: u32) -> anyhow::Result<()> {
    let p = config::load(&config)?;
    let url = database_url(&p)?;
    let rt = tokio::runtime::Runtime::new()?;
    let (dropped, (created, covered), record) = rt.block_on(async {
        let mut client = sink::connect_with(&url, &p.postgres.timeouts).await?;
        sink::schema::init(&mut client, &p).await?;
        let explain = |e| sink::privileges::explain(e, &p);
        let dropped = sink::ledger::drop_expired_partitions(&mut client, &p)
            .await
            .map_err(explain)?;
        let ahead = sink::ledger::create_partitions_ahead(&mut client, &p, days)
            .await
            .map_err(explain)?;
        let record = sink::projset::load(&client, &p).await?;
        Ok::<_, Error>((dropped, ahead, record))
    })?;
    println!(
        "{}: tables ready in schema {}",
        config.display(),
        p.postgres.schema
    );
    if let Some((from, to)) = covered {
        println!(
            "ledger {}: day partitions {from} through {to} ({} created, {} expired dropped)",
            p.ledger.table,
            created.len(),
            dropped.len()
        );
    }
    // A projection added to a live pipeline (by this init or an earlier start) still has history to build.
    let building = record.iter().flat_map(|r| &r.entries);
    for (name, _) in building.filter(|(_, e)| e.state == sink::projset::State::Building) {
        println!(
            "projection `{name}` is building (fed from its hand-over point on): build its history with \
             `replaysafe projection build --config {} --projection {name}`",
            config.display()
        );
    }
    Ok(())
}

fn run(
    (config, no_ddl, relay): (PathBuf, bool, bool),
    flag: Option<String>,
    metrics_addr: Option<std::net::SocketAddr>,
    until_caught_up: bool,
    (summary_interval, prune_interval, shutdown_timeout): (u64, u64, u64),
) -> anyhow::Result<()> {
    let mut p = config::load(&config)?;
    p.postgres.manage_schema &= !no_ddl;
    let p = Arc::new(p);
    let opts = ops::run::RunOptions {
        brokers: brokers(&p, flag)?,
        database_url: database_url(&p)?,
        until_caught_up,
        shutdown: Arc::new(AtomicBool::new(false)),
        give_up: Some(Arc::new(AtomicBool::new(false))),
        summary_interval: Duration::from_secs(summary_interval.max(1)),
        crash_after_batches: None,
        extra_properties: Vec::new(),
        prune_interval: Duration::from_secs(prune_interval.max(1)),
        state: Some(Arc::default()),
    };
    signals_with_deadline(
        opts.shutdown.clone(),
        opts.give_up.clone().expect("set above"),
        opts.state.clone().expect("set above"),
        Duration::from_secs(shutdown_timeout),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(addr) = metrics_addr {
        let _guard = rt.enter();
        replaysafe::metrics_http::install(addr, &replaysafe::metrics_http::labels(&p))?;
        replaysafe::metrics_http::register(&p);
        replaysafe::sink::probe::spawn_probe(rt.handle(), p.clone(), opts.database_url.clone());
        replaysafe::db_gauges::spawn(rt.handle(), p.clone(), opts.database_url.clone());
    }
    let beside = match relay {
        true => Some(ops::outbox::Beside::start(
            rt.handle(),
            p.clone(),
            &relay_options(&opts),
        )?),
        false => None,
    };
    let tally = ops::run::run_on(rt.handle().clone(), p, opts.clone());
    let relayed = beside.map(|b| {
        let drain = tally.is_ok() && !opts.shutdown.load(Ordering::Relaxed);
        b.finish(rt.handle(), drain, Duration::from_secs(shutdown_timeout))
    });
    let tally = tally.context("run failed")?;
    println!("{}", tally.line());
    // The consumer's accounting stands; a relay that could not publish what was left is an error of its own.
    if let Some(n) = relayed.transpose().context("outbox relay")? {
        tracing::info!(published = n, "outbox relay stopped");
    }
    Ok(())
}

/// `run --relay`: the relay's options from `run`'s.
fn relay_options(opts: &ops::run::RunOptions) -> ops::outbox::RelayOptions {
    ops::outbox::RelayOptions {
        brokers: opts.brokers.clone(),
        database_url: opts.database_url.clone(),
        outbox: None,
        topic: None,
        until_empty: false,
        shutdown: opts.shutdown.clone(),
    }
}

fn outbox(command: cli::OutboxCommand) -> anyhow::Result<()> {
    let cli::OutboxCommand::Relay {
        config,
        outbox,
        topic,
        brokers: flag,
        until_empty,
        metrics_addr,
    } = command;
    let p = Arc::new(config::load(&config)?);
    let opts = ops::outbox::RelayOptions {
        brokers: brokers(&p, flag)?,
        database_url: database_url(&p)?,
        outbox,
        topic,
        until_empty,
        shutdown: Arc::new(AtomicBool::new(false)),
    };
    signals(opts.shutdown.clone());
    let _metrics_rt;
    if let Some(addr) = metrics_addr {
        // Its worker serves /metrics until the relay returns.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        {
            let _guard = rt.enter();
            replaysafe::metrics_http::install(addr, &replaysafe::metrics_http::labels(&p))?;
        }
        replaysafe::metrics_http::register(&p);
        // /healthz and /readyz: the relay's loop is the heartbeat, no partitions to hold, the database probed.
        replaysafe::health::relay_only();
        replaysafe::sink::probe::spawn_probe(rt.handle(), p.clone(), opts.database_url.clone());
        replaysafe::db_gauges::spawn(rt.handle(), p.clone(), opts.database_url.clone());
        _metrics_rt = rt;
    }
    let (table, topic, n) = ops::outbox::relay(p, &opts).context("outbox relay failed")?;
    println!("outbox {table} → topic {topic}: published {n}");
    Ok(())
}

/// Exit code of `prove` when a boundary failed (docs/operations.md "Exit codes").
const EXIT_PROVE_FAILED: i32 = 6;

fn prove(
    config: PathBuf,
    (records, from_topic, max): (Option<PathBuf>, Option<String>, Option<usize>),
    scratch: Option<String>,
    (keep, shuffles, seed, json): (bool, u32, Option<u64>, bool),
) -> anyhow::Result<()> {
    let p = config::load(&config)?;
    let fixture = match (records, from_topic) {
        (Some(file), _) => ops::prove::Fixture::File(file),
        (None, Some(topic)) => ops::prove::Fixture::Topic {
            brokers: brokers(&p, None)?,
            topic,
            max: max.unwrap_or(1000),
        },
        (None, None) => unreachable!("clap requires one"),
    };
    let opts = ops::prove::ProveOptions {
        fixture,
        database_url: database_url(&p)?,
        brokers: scratch,
        keep,
        shuffles,
        seed: seed.unwrap_or_else(|| chrono::Utc::now().timestamp_millis() as u64),
        progress: !json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        interrupt: Arc::new(AtomicBool::new(false)),
    };
    signals(opts.interrupt.clone());
    let report = ops::prove::prove(&config, opts).context("prove failed")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    if !report.passed {
        std::process::exit(EXIT_PROVE_FAILED);
    }
    Ok(())
}

fn load(
    config: PathBuf,
    (group, take_over): (Option<String>, bool),
    flag: Option<String>,
    (file, quarantine_invalid_utf8): (PathBuf, bool),
) -> anyhow::Result<()> {
    let p = Arc::new(config::load(&config)?);
    let opts = ops::load::LoadOptions {
        database_url: database_url(&p)?,
        group,
        take_over,
        quarantine_invalid_utf8,
        brokers: brokers(&p, flag).ok(),
        shutdown: Arc::new(AtomicBool::new(false)),
    };
    signals(opts.shutdown.clone());
    let tally = ops::load::load(p, &file, opts).context("load failed")?;
    println!("{}", tally.line());
    Ok(())
}

fn backfill(a: cli::BackfillArgs) -> anyhow::Result<()> {
    let output = a.output.clone();
    let (r, opts) = a.options()?;
    signals(r.shutdown.clone());
    let report =
        ops::backfill::backfill(r.pipeline, &r.brokers, &r.database_url, &opts, r.shutdown)?;
    eprintln!("backfill, this session: {}", report.accounting);
    write_json(&report, output.as_ref())
}

fn projection(command: cli::ProjectionCommand) -> anyhow::Result<()> {
    match command {
        cli::ProjectionCommand::Build {
            config,
            projection,
            from,
            brokers: flag,
        } => {
            let p = Arc::new(config::load(&config)?);
            let opts = ops::projection::BuildOptions {
                brokers: brokers(&p, flag)?,
                database_url: database_url(&p)?,
                projection: projection.clone(),
                from_ms: from.as_deref().map(cli::parse_time).transpose()?,
                shutdown: Arc::new(AtomicBool::new(false)),
            };
            signals(opts.shutdown.clone());
            let s = ops::projection::build(p, opts)?;
            if s.already_complete {
                println!("projection `{projection}`: active, nothing to build");
            } else {
                let t = &s.tally;
                println!(
                    "projection `{projection}` built: applied {}, skipped {} (not claimed at that offset before the \
                     hand-over: claimed elsewhere, after it, or never — e.g. a dead letter), filtered {}, quarantined {}, claimed before --from {}",
                    t.landed,
                    t.duplicate,
                    t.filtered.values().sum::<u64>(),
                    t.quarantined.values().sum::<u64>(),
                    s.before_start
                );
            }
            Ok(())
        }
        cli::ProjectionCommand::Remove { config, projection } => {
            let p = config::load(&config)?;
            let table = ops::projection::remove(&p, &database_url(&p)?, &projection)?;
            println!(
                "projection `{projection}` removed: no longer fed; its table {} is left as it is",
                table.as_deref().unwrap_or("(none)")
            );
            Ok(())
        }
    }
}

fn rebuild(a: cli::RebuildArgs) -> anyhow::Result<()> {
    let output = a.output.clone();
    let (r, opts) = a.options()?;
    signals(r.shutdown.clone());
    let report = ops::rebuild::rebuild(r.pipeline, &r.brokers, &r.database_url, &opts, r.shutdown)?;
    eprintln!("{}", report.accounting);
    write_json(&report, output.as_ref())?;
    // A day that ends with fewer ledger rows than it had: exit 1 (the report says which rows).
    match report.rebuild_shortfall() {
        Some(msg) => Err(Error::Other(msg).into()),
        None => Ok(()),
    }
}

fn dead_letters(command: cli::DeadLettersCommand) -> anyhow::Result<()> {
    use replaysafe::ops::dead_letters as dl;
    match command {
        cli::DeadLettersCommand::List {
            select,
            limit,
            format,
        } => {
            let (p, url, sel) = select.resolve()?;
            let rows = dl::list(&p, &url, &sel, limit)?;
            for r in &rows {
                match format {
                    cli::ListFormat::Text => println!("{}", r.text_line()),
                    cli::ListFormat::Json => println!("{}", r.json()),
                }
            }
            let per_reason = dl::count(&p, &url, &sel)?;
            let total: i64 = per_reason.values().sum();
            let shown = match rows.len() as i64 {
                n if n < total => format!(", the first {n} listed (--limit {limit})"),
                _ => String::new(),
            };
            eprintln!("{total} unresolved dead letter(s){shown}: {per_reason:?}");
            Ok(())
        }
        cli::DeadLettersCommand::Replay { select, group_id } => {
            let (p, url, sel) = select.resolve()?;
            let shutdown = Arc::new(AtomicBool::new(false));
            signals(shutdown.clone());
            let out = dl::replay(p, &url, &sel, group_id.as_deref(), shutdown)
                .context("dead-letters replay failed")?;
            println!("{}", out.line());
            Ok(())
        }
    }
}

/// `ledger stats` / `ledger prune` (docs/replay.md "The ledger's lifecycle").
fn ledger(command: LedgerCommand) -> anyhow::Result<()> {
    let (config, json) = match &command {
        LedgerCommand::Stats { config, json } | LedgerCommand::Prune { config, json, .. } => {
            (config.clone(), *json)
        }
    };
    let p = config::load(&config)?;
    let url = database_url(&p)?;
    let rt = tokio::runtime::Runtime::new()?;
    let out = rt.block_on(async {
        let mut client = sink::connect_with(&url, &p.postgres.timeouts).await?;
        Ok::<_, Error>(match command {
            LedgerCommand::Stats { .. } => {
                let s = ops::ledger::stats(&client, &p).await?;
                match json {
                    true => format!("{:#}\n", ops::ledger::stats_json(&s)),
                    false => ops::ledger::stats_text(&s),
                }
            }
            LedgerCommand::Prune {
                dry_run,
                lock_timeout,
                ..
            } => {
                let wait = Duration::from_secs(lock_timeout);
                let r = ops::ledger::prune(&mut client, &p, dry_run, wait)
                    .await
                    .map_err(|e| sink::privileges::explain(e, &p))?;
                match json {
                    true => format!("{:#}\n", ops::ledger::prune_json(&r)),
                    false => ops::ledger::prune_text(&p, &r),
                }
            }
        })
    })?;
    print!("{out}");
    Ok(())
}

fn verify(command: VerifyCommand) -> anyhow::Result<()> {
    match command {
        VerifyCommand::Snapshot {
            config,
            table,
            column,
            filter,
            output,
        } => {
            let snap =
                ops::verify::snapshot(&config, &table, column.as_deref(), filter.as_deref())?;
            write_json(&snap, Some(&output))
        }
        VerifyCommand::Diff { before, expect } => {
            let before = ops::verify::read_snapshot(&before)?;
            let report: Report = read_json(&expect)?;
            let out = ops::verify::diff(&before, &report)?;
            print!("{}", out.table);
            if out.days.is_empty() && out.rows.is_empty() {
                let rows = match out.rows_exact {
                    true => "and every row ",
                    false => "(each row within its day's claims: see the rows line) ",
                };
                println!(
                    "verified: every day {rows}changed by exactly what the backfill landed and the other groups \
                     claimed"
                );
                Ok(())
            } else {
                let days: Vec<&str> = out.days.iter().map(|m| m.day.as_str()).collect();
                let rows: Vec<String> = out
                    .rows
                    .iter()
                    .take(10)
                    .map(|m| replaysafe::printable::escape_controls(&m.key).into_owned())
                    .collect();
                let more = out.rows.len().saturating_sub(10);
                Err(anyhow::anyhow!(
                    "{} day(s) and {} row(s) not explained by the backfill report and the other groups' ledger \
                     claims: days {}; rows {}{}",
                    out.days.len(),
                    out.rows.len(),
                    days.join(", "),
                    if rows.is_empty() { "(none)".to_string() } else { rows.join(", ") },
                    if more > 0 { format!(" and {more} more") } else { String::new() }
                ))
            }
        }
    }
}

fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Check(a) => check(a),
        Command::Init { config, days } => init(config, days),
        Command::Run {
            config,
            brokers,
            metrics_addr,
            until_caught_up,
            summary_interval,
            prune_interval,
            shutdown_timeout,
            no_ddl,
            relay,
        } => run(
            (config, no_ddl, relay),
            brokers,
            metrics_addr,
            until_caught_up,
            (summary_interval, prune_interval, shutdown_timeout),
        ),
        Command::Load {
            config,
            group_id,
            take_over,
            brokers,
            quarantine_invalid_utf8,
            file,
        } => load(
            config,
            (group_id, take_over),
            brokers,
            (file, quarantine_invalid_utf8),
        ),
        Command::Offsets {
            command:
                OffsetsCommand::Snapshot {
                    config,
                    group,
                    output,
                    brokers: flag,
                },
        } => {
            let p = config::load(&config)?;
            let snap = ops::offsets::snapshot(&p, &brokers(&p, flag)?, &database_url(&p)?, &group)?;
            write_json(&snap, output.as_ref())
        }
        Command::Offsets {
            command:
                OffsetsCommand::Start {
                    config,
                    topic,
                    partition,
                    from,
                    group,
                    brokers: flag,
                },
        } => {
            let p = config::load(&config)?;
            let from = match from {
                f if f.from_earliest => ops::start_at::From::Earliest,
                StartFrom {
                    from_time: Some(t), ..
                } => ops::start_at::From::Time(parse_time(&t)?),
                StartFrom {
                    from_offset: Some(n),
                    ..
                } => ops::start_at::From::Offset(n),
                StartFrom {
                    from_mm2: Some(a), ..
                } => ops::start_at::From::Mm2(a),
                _ => unreachable!("clap requires one of the --from-* options"),
            };
            let opts = ops::start_at::StartOptions {
                group: group.unwrap_or_else(|| p.kafka.group_id.clone()),
                topic,
                partition,
                from,
            };
            for m in ops::start_at::start(&p, &brokers(&p, flag)?, &database_url(&p)?, &opts)? {
                println!("{}", m.line);
            }
            Ok(())
        }
        Command::Projection { command } => projection(command),
        Command::Outbox { command } => outbox(command),
        Command::Backfill(a) => backfill(a),
        Command::Rebuild(a) => rebuild(a),
        Command::Verify { command } => verify(command),
        Command::DeadLetters { command } => dead_letters(command),
        Command::Ledger { command } => ledger(command),
        Command::Prove {
            config,
            records,
            from_topic,
            max,
            brokers: scratch,
            keep,
            shuffles,
            seed,
            json,
        } => prove(
            config,
            (records, from_topic, max),
            scratch,
            (keep, shuffles, seed, json),
        ),
        Command::Demo { brokers, events } => {
            let url = std::env::var("DATABASE_URL")
                .unwrap_or_else(|_| replaysafe::demo::DEFAULT_DATABASE_URL.to_string());
            replaysafe::demo::demo(brokers, &url, events)?;
            Ok(())
        }
    }
}

/// Logs go to stderr (`REPLAYSAFE_LOG`, default `info,tokio_postgres=warn`); the demo's go to the file
/// [`replaysafe::demo::log_path`] so that its narrative on stdout reads as one story.
fn logging(cli: &Cli) {
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("REPLAYSAFE_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn"))
    };
    if matches!(cli.command, Command::Demo { .. }) {
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
    let code = match execute(cli) {
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
