//! A real `nats-server` with JetStream for a test: a free port, a temp storage dir, stop and
//! restart on the same dir. The launcher is `podstream run`'s own (`podstream_bus::local_server`).

use podstream_bus::local_server::LocalServer;
/// The `nats-server` binary, found as `podstream run` and `demo` find it.
pub use podstream_bus::local_server::find_binary as nats_server_binary;

use crate::free_port;

/// The users of `deploy/nats/podstream-users.conf`, each `podstream-<name>`.
pub const SHIPPED_USERS: [&str; 7] = [
    "ingest", "process", "sink", "reader", "airflow", "spark", "collect",
];

/// A running (or stopped) nats-server owned by the test.
pub struct NatsServer {
    server: LocalServer,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server with JetStream on a free port and a fresh storage dir.
    ///
    /// # Panics
    /// When it cannot start: every test that asks for one needs it.
    pub fn start() -> NatsServer {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let server = LocalServer::start(&nats_server_binary(), dir.path(), free_port())
            .unwrap_or_else(|e| panic!("{e}"));
        NatsServer::watched(server, dir)
    }

    /// [`NatsServer::start`], taking only clients that present a token made now (kept in
    /// [`NatsServer::token_file`]), as `podstream run` and `demo` start theirs.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start_with_token() -> NatsServer {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let server = LocalServer::start_with_token(&nats_server_binary(), dir.path(), free_port())
            .unwrap_or_else(|e| panic!("{e}"));
        NatsServer::watched(server, dir)
    }

    /// A server on the shipped `deploy/nats/podstream-users.conf`, its files in `dir`: user
    /// `podstream-<name>`'s password is `<name>-<password_suffix>`, also written to
    /// `dir/<name>` for a `--nats-password-file`, for each of [`SHIPPED_USERS`].
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start_with_shipped_users(dir: &std::path::Path, password_suffix: &str) -> NatsServer {
        let mut env = Vec::new();
        for name in SHIPPED_USERS {
            let password = format!("{name}-{password_suffix}");
            std::fs::write(dir.join(name), &password).unwrap_or_else(|e| panic!("{e}"));
            env.push((
                format!("PODSTREAM_{}_PASSWORD", name.to_uppercase()),
                password,
            ));
        }
        let users = crate::workspace_root().join("deploy/nats/podstream-users.conf");
        std::fs::copy(&users, dir.join("podstream-users.conf"))
            .unwrap_or_else(|e| panic!("{}: {e}", users.display()));
        let config = dir.join("nats-server.conf");
        std::fs::write(&config, "include \"podstream-users.conf\"\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        NatsServer::start_with_config(&config, &env)
    }

    /// The file holding the token of a server started by [`NatsServer::start_with_token`].
    pub fn token_file(&self) -> Option<std::path::PathBuf> {
        self.server.token_file()
    }

    /// The URL to connect with: [`NatsServer::url`], with the token as its user info when the
    /// server has one.
    pub fn client_url(&self) -> String {
        self.server.client_url()
    }

    fn watched(server: LocalServer, dir: tempfile::TempDir) -> NatsServer {
        if let Some(pid) = server.pid() {
            crate::kill_when_this_process_ends(crate::Doomed::Process(pid));
        }
        NatsServer { server, _dir: dir }
    }

    /// [`NatsServer::start`] with the nats-server configuration file `config` too (TLS,
    /// users and their permissions), and `env` for the variables it refers to.
    ///
    /// # Panics
    /// When it cannot start.
    pub fn start_with_config(config: &std::path::Path, env: &[(&str, &str)]) -> NatsServer {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let config = podstream_bus::local_server::ServerConfig {
            file: config.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        let server = LocalServer::start_configured(
            &nats_server_binary(),
            dir.path(),
            free_port(),
            Some(config),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        NatsServer::watched(server, dir)
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The server's log, for what it refused.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.server.log()).unwrap_or_default()
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// Stops the server gracefully (SIGTERM), keeping its storage.
    pub fn stop(&mut self) {
        self.server.stop();
    }

    /// Starts it again on the same port and storage.
    ///
    /// # Panics
    /// When it cannot start again.
    pub fn restart(&mut self) {
        self.server.restart().unwrap_or_else(|e| panic!("{e}"));
        if let Some(pid) = self.server.pid() {
            crate::kill_when_this_process_ends(crate::Doomed::Process(pid));
        }
    }
}

/// The variable in each node's environment that holds its storage directory: a configuration
/// with its own `store_dir` names it (`store_dir: $NATS_STORE_DIR`).
pub const STORE_DIR_VARIABLE: &str = "NATS_STORE_DIR";

/// What every node of a [`NatsCluster`] runs with beyond its ports, name, routes and storage
/// (given on the command line).
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    /// A configuration file's text, written beside the node's storage.
    pub text: Option<String>,
    /// Files copied beside it (by name), for its `include`s.
    pub files: Vec<(String, std::path::PathBuf)>,
    /// More command-line flags (TLS, say).
    pub args: Vec<String>,
    /// The environment its configuration reads (`$VARIABLE`s).
    pub env: Vec<(String, String)>,
}

/// Three (or more) nats-servers with JetStream clustered over routes, each on its own ports
/// and storage, for replicated streams.
pub struct NatsCluster {
    nodes: Vec<Option<std::process::Child>>,
    ports: Vec<u16>,
    /// Every node's storage and log, removed with the cluster.
    dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts `size` nodes routed to each other and waits until each is ready. JetStream
    /// elects its meta leader after that: ask for one with a retrying client. A node that
    /// exits at start (a port another test took between `free_port` and its bind) makes the
    /// whole cluster start again on new ports, up to three times.
    ///
    /// # Panics
    /// When the nodes cannot start.
    pub fn start(size: usize) -> NatsCluster {
        NatsCluster::start_configured(size, &NodeConfig::default())
    }

    /// [`NatsCluster::start`] with `config` on every node.
    ///
    /// # Panics
    /// When the nodes cannot start.
    pub fn start_configured(size: usize, config: &NodeConfig) -> NatsCluster {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match NatsCluster::try_start(size, config) {
                Ok(cluster) => return cluster,
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "the nats-server cluster did not start:\n{}",
            failures.join("\n")
        );
    }

    fn try_start(size: usize, config: &NodeConfig) -> Result<NatsCluster, String> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let ports: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let routes: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let route_urls = routes
            .iter()
            .map(|port| format!("nats://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = NatsCluster {
            nodes: Vec::with_capacity(size),
            ports,
            dir,
        };
        let mut logs = Vec::with_capacity(size);
        for (index, (port, route)) in cluster.ports.iter().zip(&routes).enumerate() {
            let node_dir = cluster.dir.path().join(format!("node-{index}"));
            std::fs::create_dir_all(&node_dir).unwrap_or_else(|e| panic!("node dir: {e}"));
            let log = node_dir.join("nats-server.log");
            let store = node_dir.join("jetstream");
            let mut command = std::process::Command::new(nats_server_binary());
            command.env(STORE_DIR_VARIABLE, &store);
            if let Some(text) = &config.text {
                for (name, source) in &config.files {
                    std::fs::copy(source, node_dir.join(name))
                        .unwrap_or_else(|e| panic!("{}: {e}", source.display()));
                }
                let file = node_dir.join("nats-server.conf");
                std::fs::write(&file, text).unwrap_or_else(|e| panic!("node config: {e}"));
                command.arg("-c").arg(file);
            }
            // nats-server refuses `-sd` beside a configuration's own `store_dir`.
            if !config
                .text
                .as_ref()
                .is_some_and(|t| t.contains("store_dir"))
            {
                command.arg("-sd").arg(&store);
            }
            let child = command
                .args(&config.args)
                .envs(config.env.iter().map(|(k, v)| (k, v)))
                .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js"])
                .args([
                    "-n",
                    &format!("node-{index}"),
                    "--cluster_name",
                    "podstream",
                ])
                .args(["--cluster", &format!("nats://127.0.0.1:{route}")])
                .args(["--routes", &route_urls])
                .arg("-l")
                .arg(&log)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting nats-server node {index}: {e}"));
            crate::kill_when_this_process_ends(crate::Doomed::Process(child.id()));
            cluster.nodes.push(Some(child));
            logs.push(log);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for (index, log) in logs.iter().enumerate() {
            while !std::fs::read_to_string(log).is_ok_and(|l| l.contains("Server is ready")) {
                let exited = cluster.nodes[index]
                    .as_mut()
                    .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))));
                if exited || std::time::Instant::now() >= deadline {
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(5).collect();
                    let state = if exited {
                        "exited"
                    } else {
                        "was not ready in 60 s"
                    };
                    // Dropping the cluster stops the nodes that did start.
                    return Err(format!("node {index} {state}: {tail:?}"));
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        Ok(cluster)
    }

    /// Waits until JetStream answers with a meta leader elected (up to 60 s).
    ///
    /// # Panics
    /// When it does not.
    pub async fn ready(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let servers: Vec<String> = self.urls().split(',').map(str::to_owned).collect();
        loop {
            if let Ok(client) = async_nats::connect(servers.as_slice()).await {
                let js = async_nats::jetstream::new(client);
                if js.query_account().await.is_ok() {
                    return;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the JetStream cluster elected no leader within 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Every node's URL, comma-separated, as `--nats` takes them.
    pub fn urls(&self) -> String {
        self.ports
            .iter()
            .map(|port| format!("nats://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILLs node `index`.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes.get_mut(index).and_then(Option::take) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for index in 0..self.nodes.len() {
            self.kill(index);
        }
    }
}
