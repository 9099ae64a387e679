//! Test and benchmark support shipped with the crate: a scripted fake upstream that speaks the
//! real wire format and records every request. Used by `tests/`, the benchmark and examples.

pub mod fake_anthropic;
pub mod fake_openai;
mod server;
