//! A real PostgreSQL for the tests: `initdb` + `pg_ctl` from the Debian `postgresql` package
//! (`/usr/lib/postgresql/<version>/bin`) into a temporary folder, on a free port, stopped when
//! the [`PgCluster`] is dropped. PostgreSQL refuses to run as root, so as root the server runs
//! as the `postgres` system user (`runuser`), owning the folder.
//!
//! `TURNSTILE_TEST_STORE=postgres` makes [`super::config_text`] put every test server on a
//! fresh database of one cluster shared by the test binary ([`shared`]), stopped at exit
//! (`postgres-pair`: two instances on that database, see `pair.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// A running PostgreSQL server in a temporary folder.
pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    /// The server's options (`pg_ctl -o`): the same port, socket folder and settings on a
    /// restart.
    opts: String,
}

/// The folder of the newest installed PostgreSQL's server binaries.
fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed: apt-get install -y postgresql")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("no initdb under /usr/lib/postgresql/*/bin: apt-get install -y postgresql")
        .1
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A command run as the server's user: `postgres` when we are root, else ourselves.
fn as_server_user(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(mut c: Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl PgCluster {
    /// A new cluster with `fsync = off` (tests do not survive power loss; commits stay cheap).
    pub fn start() -> PgCluster {
        PgCluster::start_with(&["-c", "fsync=off"])
    }

    /// A new cluster with these extra server options (`-c name=value` pairs).
    pub fn start_with(options: &[&str]) -> PgCluster {
        let bin = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("turnstile-pg-")
            .tempdir()
            .expect("tempdir");
        if is_root() {
            let (uid, gid) = postgres_ids();
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let data = dir.path().join("data");
        let mut initdb = as_server_user(&bin.join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(initdb, "initdb");
        // Another test may take the port between our probe and the server's bind: try again.
        for _ in 0..5 {
            let port = free_port();
            let opts = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 {}",
                dir.path().display(),
                options.join(" ")
            );
            if pg_ctl_start(&bin, dir.path(), &opts) {
                return PgCluster {
                    dir,
                    bin,
                    port,
                    opts,
                };
            }
        }
        let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
        panic!("pg_ctl start failed five times:\n{log}");
    }

    /// Stop the server as an operator restarting it would (`pg_ctl stop -m fast`: sessions
    /// are ended, the server shuts down cleanly); the data stays for [`PgCluster::start_again`].
    pub fn stop_fast(&self) {
        let mut ctl = as_server_user(&self.bin.join("pg_ctl"));
        ctl.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "fast", "-w", "-t", "60", "stop"]);
        run(ctl, "pg_ctl stop -m fast");
    }

    /// Start the server stopped by [`PgCluster::stop_fast`] again, on the same port and data.
    pub fn start_again(&self) {
        assert!(
            pg_ctl_start(&self.bin, self.dir.path(), &self.opts),
            "pg_ctl start (again) failed:\n{}",
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }

    /// Create a database; its connection string.
    pub fn database(&self, name: &str) -> String {
        let mut c = Command::new(self.bin.join("createdb"));
        c.args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            name,
        ]);
        run(c, "createdb");
        self.url(name)
    }

    /// The connection string of a database of this cluster.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Run SQL on a database with `psql` (for a test's setup or checks); its output.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .args([
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &self.url(db),
                "-c",
                sql,
            ])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The server's log lines that report an error (for a failing test's message).
    pub fn errors(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("STATEMENT"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn stop(&self) {
        let mut ctl = as_server_user(&self.bin.join("pg_ctl"));
        ctl.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"]);
        let _ = ctl.output();
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `pg_ctl start` on the cluster in `dir` with these options; whether it started.
fn pg_ctl_start(bin: &Path, dir: &Path, opts: &str) -> bool {
    let mut ctl = as_server_user(&bin.join("pg_ctl"));
    ctl.arg("-D")
        .arg(dir.join("data"))
        .arg("-l")
        .arg(dir.join("server.log"))
        .args(["-w", "-t", "60", "-o", opts, "start"]);
    ctl.output().map(|o| o.status.success()).unwrap_or(false)
}

fn postgres_ids() -> (u32, u32) {
    let out = Command::new("id")
        .args(["-u", "postgres"])
        .output()
        .expect("id");
    let uid = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the postgres user");
    let out = Command::new("id")
        .args(["-g", "postgres"])
        .output()
        .expect("id");
    let gid = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("its group");
    (uid, gid)
}

/// Whether the tests run against PostgreSQL (`TURNSTILE_TEST_STORE=postgres`, or
/// `postgres-pair`: two instances on it, see `pair.rs`).
pub fn selected() -> bool {
    std::env::var("TURNSTILE_TEST_STORE").is_ok_and(|v| v == "postgres" || v == "postgres-pair")
}

/// The cluster of this test binary, started on first use and stopped at exit.
pub fn shared() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        extern "C" fn stop_at_exit() {
            if let Some(c) = CLUSTER.get() {
                c.stop();
                // A static is never dropped: its folder goes here.
                let _ = std::fs::remove_dir_all(c.dir.path());
            }
        }
        // SAFETY: registers a plain function with no arguments to run at exit.
        unsafe { libc::atexit(stop_at_exit) };
        PgCluster::start()
    })
}

/// The variables naming the databases made so far (`TURNSTILE_TEST_PG_URL_<n>`, each set
/// once), for the environment of a test server or a spawned binary.
pub fn vars() -> Vec<(String, String)> {
    URLS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

static URLS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// A `[store]` table on a fresh database of the shared cluster.
pub fn store_table() -> String {
    shared().store_table("")
}

impl PgCluster {
    /// A `[store]` table (plus `more` lines in it) on a fresh database of this cluster, its URL
    /// in a variable of its own: one of [`vars`], which test servers and spawned binaries are
    /// given (the process's own environment is never changed: the tests share the process).
    pub fn store_table(&self, more: &str) -> String {
        self.store_table_and_url(more).0
    }

    /// [`PgCluster::store_table`] and the database's connection string.
    pub fn store_table_and_url(&self, more: &str) -> (String, String) {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let url = self.database(&format!("t{}_{n}", std::process::id()));
        let var = format!("TURNSTILE_TEST_PG_URL_{n}");
        URLS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((var.clone(), url.clone()));
        let table = format!("\n[store]\nbackend = \"postgres\"\nurl_env = \"{var}\"\n{more}\n");
        (table, url)
    }
}

/// Two real instances' data folders on one fresh database, each with the same `tools.toml`.
pub struct Pair {
    pub dirs: [tempfile::TempDir; 2],
    /// The database's connection string.
    pub url: String,
}

impl PgCluster {
    /// A [`Pair`] whose `tools.toml` is `config` plus a `[store]` table with `lease_s`, on a
    /// fresh database of this cluster.
    pub fn pair(&self, config: &str, lease_s: u64) -> Pair {
        let (table, url) = self.store_table_and_url(&format!("lease_s = {lease_s}"));
        let text = format!("{config}{table}");
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        for d in &dirs {
            std::fs::write(d.path().join("tools.toml"), &text).unwrap();
        }
        Pair { dirs, url }
    }
}
