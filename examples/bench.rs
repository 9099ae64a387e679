//! The benchmark: turnstile's added latency, streaming, MCP, memory and throughput figures
//! against the scripted fake upstream.
//!
//! ```text
//! cargo run --release --example bench              # the full run (~100 s)
//! cargo run --release --example bench -- --smoke   # tiny counts, same code paths (seconds)
//! cargo run --release --example bench -- --only latency,mcp   # some sections (see below)
//! cargo run --release --example bench -- --store postgres      # SQLite vs PostgreSQL (1 and 2 instances)
//! cargo run --release --example bench -- --only failover       # kill -9 of an instance mid-turn
//! ```
//!
//! Sections: `latency` (added latency, stream none, c=1 and c=32), `delta` (time to first delta
//! and inter-delta gaps), `fanout` (delta events/s through `events/stream`), `mcp` (a trusted
//! MCP tool in a turn), `tput` (turns/s with fsync off and on), `rss` (memory per idle stream);
//! and, only when named (they start a PostgreSQL cluster of their own, see `bench/pg.rs`): `pg`
//! (`--store postgres` adds it: added latency at c=1 and turns/s at c=32 on SQLite, PostgreSQL
//! with one instance and with two, side by side) and `failover` (the time until another instance
//! closes a killed instance's turn `worker_lost` and runs the next one, `lease_s` 2 and 10).
//! Figures of sections not run are left out of the table and `null` in the JSON.
//!
//! Prints a table (figure, value, target, met?) and, last, one JSON line with every figure.
//! The logic lives in `examples/bench/lib.rs` (the smoke test runs it too). The `mcp_example`
//! binary is built first if it is missing. `--serve CONFIG` (internal) runs turnstile alone, so
//! that the bench can read the server's own memory.

// A tool for measuring and testing, not the server: a panic is its error message.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

#[path = "bench/lib.rs"]
mod bench_lib;

/// The allocator the `turnstile` binary uses (see `src/main.rs`), so that the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        let config = args
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("--serve needs a config path"))?;
        return bench_lib::serve_main(Path::new(config));
    }
    let mut smoke = false;
    let mut only: Option<Vec<String>> = None;
    let mut store_pg = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--smoke" => smoke = true,
            "--only" => {
                let list: Vec<String> = it
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--only needs a list of sections"))?
                    .split(',')
                    .map(str::to_string)
                    .collect();
                if let Some(bad) = list
                    .iter()
                    .find(|s| !bench_lib::SECTIONS.contains(&s.as_str()))
                {
                    anyhow::bail!(
                        "unknown section {bad:?}; sections: {}",
                        bench_lib::SECTIONS.join(",")
                    );
                }
                only = Some(list);
            }
            "--store" => match it.next().map(String::as_str) {
                Some("postgres") => store_pg = true,
                Some("sqlite") => {}
                other => anyhow::bail!("--store takes sqlite or postgres, not {other:?}"),
            },
            other => anyhow::bail!(
                "unknown argument {other:?}; usage: bench [--smoke] [--store sqlite|postgres] [--only {}]",
                bench_lib::SECTIONS.join(",")
            ),
        }
    }
    if store_pg {
        only.get_or_insert_with(Vec::new).push("pg".into());
    }
    if cfg!(debug_assertions) {
        eprintln!("[bench] this is a debug build: run it with --release for real figures");
    }
    bench_lib::raise_nofile();
    let exe = std::env::current_exe()?;
    let mcp_example = bench_lib::ensure_mcp_example(&exe)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(bench_lib::run(&bench_lib::Options {
        smoke,
        mcp_example,
        rss: bench_lib::RssMode::Child(exe),
        verbose: true,
        only,
    }))?;
    print!("{}", report.table());
    println!("{}", report.json_line());
    Ok(())
}
