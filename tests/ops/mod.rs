//! Operating turnstile: `check` and `serve`, health and status, metrics, traces, the bench's
//! smoke run.

mod bench_smoke;
mod disk_full;
mod metrics;
mod operations;
mod reload;
mod traces;
