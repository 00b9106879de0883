//! The `replaysafe` binary as a subprocess: its output and accounting line, long-running processes, signals.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{brokers, database_url, try_run};

/// Output of a finished `replaysafe` process.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// The last `consumed …` line of stdout (the accounting line), if any.
    pub fn tally_line(&self) -> Option<&str> {
        self.stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("consumed "))
    }

    /// The final `consumed N = landed a + duplicate b + filtered c + quarantined d` line.
    pub fn tally(&self) -> Tally {
        let line = self.tally_line().unwrap_or_else(|| {
            panic!(
                "no tally line in stdout:\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        });
        let head = line.split(" [").next().unwrap_or(line);
        let num = |label: &str| -> u64 {
            head.replace(" = ", " + ")
                .split(" + ")
                .filter_map(|part| part.trim().strip_prefix(label))
                .filter_map(|rest| rest.trim().parse().ok())
                .next()
                .unwrap_or(0)
        };
        let consumed = head
            .strip_prefix("consumed ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        let t = Tally {
            consumed,
            landed: num("landed "),
            duplicate: num("duplicate "),
            filtered: num("filtered "),
            quarantined: num("quarantined "),
        };
        let stale = num("stale ");
        let buffered = num("buffered ");
        assert_eq!(
            t.landed + t.duplicate + stale + t.filtered + t.quarantined + buffered,
            t.consumed,
            "the tally adds up: {line}"
        );
        t
    }

    /// The `stale N` part of the tally line (0 when absent).
    pub fn stale(&self) -> u64 {
        let line = self.tally_line().unwrap_or("");
        line.split(" + ")
            .filter_map(|p| p.strip_prefix("stale "))
            .filter_map(|n| n.trim().parse().ok())
            .next()
            .unwrap_or(0)
    }

    /// The `buffered N` part of the tally line: records left unapplied at the stop (0 when absent).
    pub fn buffered(&self) -> u64 {
        let line = self.tally_line().unwrap_or("");
        let head = line.split(" [").next().unwrap_or(line);
        head.split(" + ")
            .filter_map(|p| p.strip_prefix("buffered "))
            .filter_map(|n| n.trim().parse().ok())
            .next()
            .unwrap_or(0)
    }

    /// Asserts exit code 0, showing stdout and stderr otherwise.
    pub fn assert_ok(&self) -> &Self {
        assert_eq!(
            self.code,
            Some(0),
            "replaysafe failed\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct Tally {
    pub consumed: u64,
    pub landed: u64,
    pub duplicate: u64,
    pub filtered: u64,
    pub quarantined: u64,
}

/// The `replaysafe` binary cargo built for these tests.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_replaysafe")
}

fn command(args: &[&str], envs: &[(&str, &str)]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env("KAFKA_BROKERS", brokers())
        .env("DATABASE_URL", database_url())
        .env("REPLAYSAFE_LOG", "info");
    for (k, v) in envs {
        c.env(k, v);
    }
    c
}

/// Runs `replaysafe` to completion (killed after `limit`).
pub fn replaysafe_with(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Out {
    let mut child = command(args, envs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out_h = read_pipe(child.stdout.take().unwrap());
    let err_h = read_pipe(child.stderr.take().unwrap());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = Out {
        code: status.and_then(|s| s.code()),
        stdout: out_h.join().unwrap(),
        stderr: err_h.join().unwrap(),
    };
    if status.is_none() {
        panic!(
            "replaysafe {args:?} did not finish in {limit:?}\nstdout:\n{}\nstderr:\n{}",
            out.stdout, out.stderr
        );
    }
    out
}

/// [`replaysafe_with`] without extra environment, killed after two minutes.
pub fn replaysafe(args: &[&str]) -> Out {
    replaysafe_with(args, &[], Duration::from_secs(120))
}

/// `replaysafe run --config P --until-caught-up`, asserted successful.
pub fn run_caught_up(p: &Path) -> Out {
    let out = try_run(p);
    out.assert_ok();
    out
}

fn read_pipe<R: std::io::Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Starts a long-running `replaysafe` (stdout/stderr to files in `dir`).
pub fn spawn(args: &[&str], envs: &[(&str, &str)], dir: &Path, name: &str) -> Child {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{name}.err"))).unwrap();
    command(args, envs).stdout(out).stderr(err).spawn().unwrap()
}

/// Polls `cond` every 100 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends SIGTERM and waits for the exit code.
pub fn terminate(child: &mut Child) -> Option<i32> {
    unsafe_kill(child.id(), "TERM");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        assert!(
            Instant::now() < deadline,
            "replaysafe did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends a signal with the `kill` command (no libc dependency in tests).
pub fn unsafe_kill(pid: u32, signal: &str) {
    // The process may already have exited; that is fine for every caller.
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}
