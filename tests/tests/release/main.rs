//! What a release ships, checked as a user gets it: `deploy/` rendered and validated, the
//! install page run as written, and the production build without the test world.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod deploy;
mod install_page;
mod production_build;
