//! The suites that start no server: `podstream decide` through the built binary, the
//! repository's own docs, and the house's rooms.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod decide_cli;
mod docs;
mod house;
