//! Test and benchmark support: scripted fake upstreams that speak the real wire format and record
//! every request. Used by `tests/`, the benchmark and examples. Compiled only with the cargo
//! feature `testkit` (which the package's dev-dependency on itself turns on for them) and in the
//! library's own unit tests: `cargo build` and `cargo install` leave it out.

pub mod fake_anthropic;
pub mod fake_openai;
mod fake_upstream;
pub mod sinks;
