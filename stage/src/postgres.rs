//! A throwaway PostgreSQL cluster for a test: `initdb` and `pg_ctl` from Debian's
//! `postgresql` on a temp dir and a free port (as the `postgres` user when run as root).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Debian's PostgreSQL binaries (`/usr/lib/postgresql/<newest>/bin`).
pub fn pg_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.exists())
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// A running cluster, stopped on drop.
pub struct PgCluster {
    dir: tempfile::TempDir,
    port: u16,
    tls: bool,
    /// `postgres`'s password, for a cluster that takes none without one.
    password: Option<String>,
}

/// The PEM files a cluster serves TLS with.
#[derive(Debug, Clone)]
pub struct PgTls {
    /// The server's certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// The CA that signs the client certificates it accepts.
    pub ca: PathBuf,
}

impl PgCluster {
    /// `initdb` + `pg_ctl start` on a free port, trust authentication for `postgres`.
    ///
    /// # Panics
    /// When PostgreSQL cannot start (scripts/setup.sh installs it).
    pub fn start() -> PgCluster {
        PgCluster::init(None, false)
    }

    /// A cluster where `postgres`, the only role, must give a password made now (scram-sha-256,
    /// over TCP and the socket alike): another local user cannot use it. [`PgCluster::url`]
    /// carries the password.
    ///
    /// # Panics
    /// When PostgreSQL cannot start.
    pub fn start_with_password() -> PgCluster {
        PgCluster::init(None, true)
    }

    /// A cluster that takes TCP connections over TLS only: `postgres` without a password
    /// (for the harness), `podstream_cert` by client certificate, everyone else by password
    /// (scram-sha-256).
    ///
    /// # Panics
    /// When PostgreSQL cannot start.
    pub fn start_with_tls(tls: &PgTls) -> PgCluster {
        PgCluster::init(Some(tls), false)
    }

    fn init(tls: Option<&PgTls>, with_password: bool) -> PgCluster {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let _ = Command::new("chmod").arg("777").arg(dir.path()).status();
        let port = crate::free_port();
        let data = dir.path().join("data");
        let password = with_password.then(crate::random_token);
        let mut initdb = as_postgres(&pg_bin().join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--no-sync"]);
        // initdb reads the password from a file the server's user can read: removed after.
        let password_file = dir.path().join("password");
        match &password {
            Some(password) => {
                write_for_postgres(&password_file, password);
                initdb
                    .arg("--auth=scram-sha-256")
                    .arg(format!("--pwfile={}", password_file.display()));
            }
            None => {
                initdb.arg("--auth=trust");
            }
        }
        let status = initdb.stdout(Stdio::null()).stderr(Stdio::null()).status();
        let _ = std::fs::remove_file(&password_file);
        assert!(
            matches!(status, Ok(s) if s.success()),
            "initdb failed: {status:?}"
        );
        if let Some(tls) = tls {
            // The server reads its key only when the key is its own and private.
            for (from, to) in [
                (&tls.cert, "server.crt"),
                (&tls.key, "server.key"),
                (&tls.ca, "root.crt"),
            ] {
                let to = data.join(to);
                std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copying {to:?}: {e}"));
                let _ = Command::new("chmod").arg("600").arg(&to).status();
                if is_root() {
                    let _ = Command::new("chown").arg("postgres").arg(&to).status();
                }
            }
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\n\
                 hostssl all postgres 127.0.0.1/32 trust\n\
                 hostssl all podstream_cert 127.0.0.1/32 cert\n\
                 hostssl all all 127.0.0.1/32 scram-sha-256\n\
                 hostnossl all all 127.0.0.1/32 reject\n",
            )
            .unwrap_or_else(|e| panic!("writing pg_hba.conf: {e}"));
        }
        let cluster = PgCluster {
            dir,
            port,
            tls: tls.is_some(),
            password,
        };
        cluster.pg_ctl_start();
        cluster.stop_when_this_process_ends();
        cluster
    }

    /// Starts a watcher that stops the server and removes its files once this process has
    /// ended: a cluster in a `static` is never dropped, and a test process killed outright
    /// drops nothing, yet its PostgreSQL must not outlive it.
    fn stop_when_this_process_ends(&self) {
        let pg_ctl = pg_bin().join("pg_ctl");
        let runner = if is_root() {
            "runuser -u postgres -- "
        } else {
            ""
        };
        let then = format!(
            "{runner}'{pg_ctl}' -D '{data}' -m immediate -w stop >/dev/null 2>&1; rm -rf '{dir}'",
            pg_ctl = pg_ctl.display(),
            data = self.dir.path().join("data").display(),
            dir = self.dir.path().display(),
        );
        crate::when_this_process_ends(
            &then,
            &format!("the PostgreSQL cluster at {}", self.dir.path().display()),
        );
    }

    fn pg_ctl_start(&self) {
        // `PODSTREAM_TEST_PG_OPTIONS` adds server options, e.g. statement logging when
        // looking into a benchmark.
        let mut extra = std::env::var("PODSTREAM_TEST_PG_OPTIONS").unwrap_or_default();
        if self.tls {
            extra.push_str(" -c ssl=on -c ssl_ca_file=root.crt");
        }
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off {extra}",
            self.port,
            self.dir.path().display()
        );
        let status = as_postgres(&pg_bin().join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-l")
            .arg(self.dir.path().join("log"))
            .args(["-w", "-o", &options, "start"])
            .stdout(Stdio::null())
            .status();
        assert!(
            matches!(status, Ok(s) if s.success()),
            "pg_ctl start failed: {status:?}"
        );
    }

    /// Stops the server (fast shutdown: connections are cut) and starts it again.
    pub fn restart(&self) {
        self.stop();
        self.pg_ctl_start();
    }

    /// Stops the server.
    pub fn stop(&self) {
        let _ = as_postgres(&pg_bin().join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .stdout(Stdio::null())
            .status();
    }

    /// The URL of a database on this cluster, as `postgres` (with its password, if it has one).
    pub fn url(&self, database: &str) -> String {
        let user = match &self.password {
            Some(password) => format!("postgres:{password}"),
            None => "postgres".to_owned(),
        };
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a database, loaded from an SQL file (a `pg_dump`) when given.
    ///
    /// # Panics
    /// When psql fails.
    pub fn create_database(&self, name: &str, dump: Option<&Path>) {
        self.psql("postgres", &["-c", &format!("CREATE DATABASE \"{name}\"")]);
        if let Some(dump) = dump {
            self.psql(name, &["-f", &dump.display().to_string()]);
        }
    }

    /// Rows of a query, each a list of its columns as text (NULL as an empty string).
    ///
    /// # Panics
    /// When psql fails.
    pub fn query(&self, database: &str, sql: &str) -> Vec<Vec<String>> {
        let output = self.psql(database, &["-A", "-t", "-F", "\t", "-c", sql]);
        output
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| line.split('\t').map(str::to_owned).collect())
            .collect()
    }

    fn psql(&self, database: &str, args: &[&str]) -> String {
        let output = Command::new(pg_bin().join("psql"))
            .args([
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                database,
            ])
            .args(args)
            .envs(self.password.iter().map(|p| ("PGPASSWORD", p)))
            .output()
            .unwrap_or_else(|e| panic!("psql: {e}"));
        assert!(
            output.status.success(),
            "psql {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

/// Writes `text` to `file`, readable by its owner only: the server's user when run as root.
fn write_for_postgres(file: &Path, text: &str) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    out.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
    if is_root() {
        let _ = Command::new("chown").arg("postgres").arg(file).status();
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = as_postgres(&pg_bin().join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// How PgBouncer hands server connections to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client session.
    Session,
    /// A server connection per transaction, shared between clients.
    Transaction,
}

/// Debian's PgBouncer in front of one database of a [`PgCluster`], killed on drop.
pub struct PgBouncer {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl PgBouncer {
    /// PgBouncer for `database` of `cluster`, trusting `postgres`, in `mode`; with
    /// `ignore_extra_float_digits`, told to ignore that startup parameter (as installs that
    /// serve drivers sending it are).
    ///
    /// # Panics
    /// When it cannot start (scripts/setup.sh installs Debian's `pgbouncer`).
    pub fn start(
        cluster: &PgCluster,
        database: &str,
        mode: PoolMode,
        ignore_extra_float_digits: bool,
    ) -> PgBouncer {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let _ = Command::new("chmod").arg("777").arg(dir.path()).status();
        let port = crate::free_port();
        let mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let ignore = if ignore_extra_float_digits {
            "ignore_startup_parameters = extra_float_digits\n"
        } else {
            ""
        };
        let users = dir.path().join("users.txt");
        let log = dir.path().join("pgbouncer.log");
        let ini = dir.path().join("pgbouncer.ini");
        let text = format!(
            "[databases]\n{database} = host=127.0.0.1 port={} dbname={database} user=postgres\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {}\npool_mode = {mode}\ndefault_pool_size = 4\n\
             logfile = {}\n{ignore}",
            cluster.port,
            users.display(),
            log.display(),
        );
        std::fs::write(&users, "\"postgres\" \"\"\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&ini, text).unwrap_or_else(|e| panic!("{e}"));
        for file in [&users, &ini] {
            let _ = Command::new("chmod").arg("644").arg(file).status();
        }
        // It refuses to run as root, as PostgreSQL does; in a process group of its own, so
        // that ending the group ends it and runuser together.
        let child = std::os::unix::process::CommandExt::process_group(
            as_postgres(Path::new("/usr/sbin/pgbouncer"))
                .arg(&ini)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            0,
        )
        .spawn()
        .unwrap_or_else(|e| panic!("starting pgbouncer: {e}"));
        crate::kill_when_this_process_ends(crate::Doomed::Group(child.id()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "pgbouncer did not listen: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        PgBouncer {
            child,
            port,
            _dir: dir,
        }
    }

    /// The URL of its database, as the sink would be given it.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}
