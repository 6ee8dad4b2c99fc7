//! What every test needs: fixture paths and the built binary (later: nats-server, PostgreSQL and simulator launchers).
