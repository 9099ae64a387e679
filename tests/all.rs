//! The one integration test binary: every test module, grouped by area, linked once.
//!
//! Run one area with a libtest filter, e.g. `cargo test --test all -- mcp::` or
//! `cargo test --test all -- aap::sessions::`. The tests share this process, so none of them
//! changes process-wide state: the variables a server reads are handed to it (see
//! `common::TestServer::start_with_env` and `turnstile::config::Env`), never set in the
//! process environment.

// Helpers outside #[test] functions unwrap too (a panic there is the failure message), and
// nothing here is a public API.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod common;

mod aap;
mod api;
mod console;
mod hostile;
mod mcp;
mod ops;
mod store;
mod upstream;

/// The benchmark's logic (`examples/bench/lib.rs`), for `ops::bench_smoke`.
#[path = "../examples/bench/lib.rs"]
mod bench;
