//! The NATS side every podstream component shares.
//!
//! - `backoff`: doubling, jittered delays between retries, shared by every retry loop.
//! - [`config`]: the bus configuration every component shares (server, prefix, stream
//!   settings) and its defaults.
//! - [`connect`](mod@connect): connecting to NATS with credentials and TLS, retrying with backoff while no
//!   server answers, and URLs redacted wherever they are shown.
//! - [`streams`]: the JetStream streams podstream writes, their settings, and creating or
//!   updating them idempotently (a conflicting stream is refused, never overwritten).
//! - [`start`](mod@start): a component's start on the bus: connect, then make its streams ready.
//! - [`local_server`]: a local `nats-server` child process, for `run`, `demo` and the tests.
//! - [`in_flight`]: the messages a stage holds unacked, kept from redelivery with progress
//!   acks while it works on them (the consumers' ack wait is short, for crash recovery).
//! - [`history`]: a stream's stored messages read in order by batched direct gets, with no
//!   consumer, for `replay` and other read-only users.
//! - [`consume`]: the one consumer loop every stage runs: pull with a bound, hold, decode
//!   or dead-letter, hand over to the stage's handler, pull again after a failure, drain on
//!   stop.
//! - [`fault`]: whose move a failure is (configuration, a service away, data), said by its
//!   type, for the exit status.
//! - [`retry`]: what a failed effect calls for, from the failure's type: again, wait, or a
//!   dead letter.
//! - [`pinned`]: a consumer pinned to one instance at a time, bound and let go.
//! - [`dead`]: dead letters: the original bytes and the reason, on `podstream.dead.<stage>`.
//! - [`role`]: the `Podstream-Role` header that marks the copy for a pod's previous owner.
//! - `health`: the readiness conditions a component declares and flips.
//! - [`metrics`]: the name of every exported metric.

pub(crate) mod backoff;
pub mod config;
pub mod connect;
pub mod consume;
pub mod dead;
pub mod fault;
pub(crate) mod health;
pub mod history;
pub mod in_flight;
pub mod local_server;
pub mod metrics;
pub mod pinned;
pub mod retry;
pub mod role;
pub mod start;
pub mod streams;

pub use backoff::Backoff;
pub use config::BusConfig;
pub use config::StreamSettings;
pub use connect::{NatsCredentials, NatsSecurity, NatsTls, connect};
pub use health::{Condition, Health};
pub use in_flight::{Held, InFlight, Inbox};
pub use start::{OnTheBus, StageError, StartError, start};
pub use streams::StreamError;
