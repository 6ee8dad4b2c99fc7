//! A local `nats-server` with JetStream, for `podstream run` and `podstream demo` without
//! `--nats`, and for the tests: a child process on a storage dir, stopped with SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

/// Why the local server did not come up.
#[derive(Debug, Error)]
pub enum LocalServerError {
    /// The binary could not be started.
    #[error(
        "cannot start {binary}: {source} (install it with scripts/setup.sh, put nats-server on PATH, or pass --nats)"
    )]
    Spawn {
        /// The binary tried.
        binary: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It started but did not report ready.
    #[error("nats-server did not become ready within {seconds} s; see {log}: {last}")]
    NotReady {
        /// How long we waited.
        seconds: u64,
        /// Its log file.
        log: String,
        /// The last lines it wrote (a configuration error goes to stderr, not the log).
        last: String,
    },
    /// The token or the configuration holding it could not be written.
    #[error("cannot write {file}: {source}")]
    Token {
        /// The file.
        file: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The storage dir could not be made.
    #[error("cannot create {dir}: {source}")]
    Dir {
        /// The dir.
        dir: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The `nats-server` binary to run: `$PODSTREAM_NATS_SERVER`, else one installed by
/// `scripts/setup.sh` in a `target/tools/bin` above the running executable, else the one on
/// PATH.
pub fn find_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PODSTREAM_NATS_SERVER") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().ok();
    let installed = exe.iter().flat_map(|e| e.ancestors()).find_map(|dir| {
        let candidate = dir.join("tools/bin/nats-server");
        candidate.is_file().then_some(candidate)
    });
    installed.unwrap_or_else(|| PathBuf::from("nats-server"))
}

/// A running `nats-server`; killed when dropped, stopped gracefully by [`LocalServer::stop`].
#[derive(Debug)]
pub struct LocalServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    binary: PathBuf,
    config: Option<ServerConfig>,
    token: Option<String>,
}

/// A nats-server configuration file (TLS, users), and the environment its `$VARIABLE`
/// references are read from.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The configuration file.
    pub file: PathBuf,
    /// Variables set for the server process.
    pub env: Vec<(String, String)>,
}

impl LocalServer {
    /// Starts `binary` with JetStream on 127.0.0.1:`port`, storage and log under `dir`, and
    /// waits until it is ready.
    pub fn start(binary: &Path, dir: &Path, port: u16) -> Result<LocalServer, LocalServerError> {
        LocalServer::start_configured(binary, dir, port, None)
    }

    /// [`LocalServer::start`] with a nats-server configuration file too (TLS, users); the
    /// address, port, JetStream storage and log given on the command line win over it.
    pub fn start_configured(
        binary: &Path,
        dir: &Path,
        port: u16,
        config: Option<ServerConfig>,
    ) -> Result<LocalServer, LocalServerError> {
        let mut server = LocalServer {
            child: None,
            port,
            dir: dir.to_owned(),
            binary: binary.to_owned(),
            config,
            token: None,
        };
        server.launch()?;
        Ok(server)
    }

    /// [`LocalServer::start`] for `podstream run` and `demo`: the server takes only clients
    /// that present a token made now, so another local user's process cannot read or publish
    /// task states through it. The token sits in [`LocalServer::token_file`] (mode 0600) for
    /// other tools of the same user (`podstream tail --nats-token-file`), and in the
    /// configuration file nats-server reads, never on a command line.
    pub fn start_with_token(
        binary: &Path,
        dir: &Path,
        port: u16,
    ) -> Result<LocalServer, LocalServerError> {
        std::fs::create_dir_all(dir).map_err(|source| LocalServerError::Dir {
            dir: dir.display().to_string(),
            source,
        })?;
        let token = new_token().map_err(|source| LocalServerError::Token {
            file: "/dev/urandom".to_owned(),
            source,
        })?;
        let file = dir.join(TOKEN_CONFIG);
        write_private(&file, &format!("authorization {{ token: \"{token}\" }}\n"))?;
        write_private(&dir.join(TOKEN_FILE), &format!("{token}\n"))?;
        let config = ServerConfig {
            file,
            env: Vec::new(),
        };
        let mut server = LocalServer::start_configured(binary, dir, port, Some(config))?;
        server.token = Some(token);
        Ok(server)
    }

    /// The file holding the token of a server started by [`LocalServer::start_with_token`].
    pub fn token_file(&self) -> Option<PathBuf> {
        self.token.as_ref().map(|_| self.dir.join(TOKEN_FILE))
    }

    /// The URL podstream's own components connect with: [`LocalServer::url`], with the token
    /// as its user info when the server has one (never print it; `url` is for showing).
    pub fn client_url(&self) -> String {
        match &self.token {
            Some(token) => format!("nats://{token}@127.0.0.1:{}", self.port),
            None => self.url(),
        }
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's log file.
    pub fn log(&self) -> PathBuf {
        self.dir.join("nats-server.log")
    }

    fn launch(&mut self) -> Result<(), LocalServerError> {
        std::fs::create_dir_all(&self.dir).map_err(|source| LocalServerError::Dir {
            dir: self.dir.display().to_string(),
            source,
        })?;
        let log = self.log();
        // A fresh log, so "ready" below is this run's.
        let _ = std::fs::remove_file(&log);
        let mut command = Command::new(&self.binary);
        if let Some(config) = &self.config {
            command.arg("-c").arg(&config.file);
            command.envs(config.env.iter().map(|(k, v)| (k, v)));
        }
        let child = command
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.join("jetstream"))
            .arg("-l")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.join("nats-server.stderr"))
                    .map_or_else(|_| Stdio::null(), Stdio::from),
            )
            .spawn()
            .map_err(|source| LocalServerError::Spawn {
                binary: self.binary.display().to_string(),
                source,
            })?;
        self.child = Some(child);
        let started = Instant::now();
        let limit = Duration::from_secs(20);
        loop {
            if std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Server is ready")) {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited || started.elapsed() > limit {
                let written = [log.clone(), self.dir.join("nats-server.stderr")]
                    .iter()
                    .filter_map(|file| std::fs::read_to_string(file).ok())
                    .collect::<Vec<_>>()
                    .join("\n");
                let lines: Vec<&str> = written.lines().filter(|l| !l.is_empty()).collect();
                return Err(LocalServerError::NotReady {
                    seconds: limit.as_secs(),
                    log: log.display().to_string(),
                    last: lines[lines.len().saturating_sub(5)..].join(" | "),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server with SIGTERM (JetStream flushes its store), killing it after 10 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts it again on the same port and storage.
    pub fn restart(&mut self) -> Result<(), LocalServerError> {
        self.stop();
        self.launch()
    }
}

/// The file a token-guarded local server's token is kept in, under its storage dir.
const TOKEN_FILE: &str = "token";
/// The nats-server configuration holding that token.
const TOKEN_CONFIG: &str = "token.conf";

/// 32 random bytes from the kernel, as hex.
fn new_token() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `text` to a new `file` only its owner can read (mode 0600), replacing an older one.
fn write_private(file: &Path, text: &str) -> Result<(), LocalServerError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let written = (|| {
        let _ = std::fs::remove_file(file);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(file)?;
        out.write_all(text.as_bytes())
    })();
    written.map_err(|source| LocalServerError::Token {
        file: file.display().to_string(),
        source,
    })
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
