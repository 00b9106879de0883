//! A private PgBouncer in front of the test PostgreSQL (`scripts/pgbouncer-start`; Debian's `pgbouncer`, run as
//! the postgres user with its own config, pid and log files), stopped when dropped.

use std::path::Path;
use std::process::Command;

/// A running PgBouncer: `url` reaches the test PostgreSQL through it.
pub struct Bouncer {
    /// `postgresql://postgres@127.0.0.1:PORT/postgres?sslmode=disable`.
    pub url: String,
    dir: tempfile::TempDir,
}

impl Bouncer {
    /// Starts one in `mode` (transaction, session, statement) with `pool` server connections per database/user.
    pub fn start(mode: &str, pool: u32) -> Bouncer {
        let dir = tempfile::tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/pgbouncer-start");
        let out = Command::new("bash")
            .arg(script)
            .arg(dir.path())
            .arg(mode)
            .arg(pool.to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let url = stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("PGBOUNCER_URL="))
            .unwrap_or_else(|| {
                panic!(
                    "scripts/pgbouncer-start failed:\n{stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
            .to_string();
        Bouncer { url, dir }
    }

    /// Its log (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("pgbouncer.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
    }
}
