//! Runs the benchmark's smoke mode (`examples/bench/lib.rs`, included here rather than run through
//! a nested `cargo`) and checks its JSON line: every figure present and a finite number.
//!
//! Needs the `mcp_example` binary: plain `cargo test` builds it; with `--test all -- ops::bench_smoke::` alone,
//! run `cargo build --example mcp_example` first. The idle-stream RSS is measured in process here
//! (the test binary cannot re-execute itself as a server); the bench binary uses a child process.

use serde_json::Value;

const KEYS: &[&str] = &[
    "added_p50_us",
    "added_p99_us",
    "added_p50_us_c32",
    "ratio_p50",
    "ttfd_added_p99_us",
    "gap_added_p99_us",
    "splice_ttfd_added_p99_us",
    "mcp_overhead_p50_us",
    "mcp_endpoint_p50_us",
    "mcp_endpoint_p99_us",
    "mcp_endpoint_direct_p50_us",
    "mcp_endpoint_direct_p99_us",
    "rss_kib_per_stream_1000",
    "rss_kib_per_stream_10000",
    "deltas_per_s",
    "turns_per_s",
    "turns_per_s_fsync",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_run_reports_every_figure() {
    crate::bench::raise_nofile();
    let opts = crate::bench::Options {
        smoke: true,
        mcp_example: crate::common::mcp::example_server_path(),
        rss: crate::bench::RssMode::InProcess,
        verbose: false,
        only: None,
    };
    let report = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        crate::bench::run(&opts),
    )
    .await
    .expect("the smoke run finishes")
    .expect("the smoke run succeeds");
    let table = report.table();
    println!("{table}");
    assert!(
        table.contains("| figure | value | target | met? |"),
        "{table}"
    );
    let line = report.json_line();
    println!("{line}");
    let json: Value = serde_json::from_str(&line).expect("the JSON line parses");
    for key in KEYS {
        let v = json
            .get(*key)
            .unwrap_or_else(|| panic!("{key} missing from {line}"));
        let x = v
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number in {line}"));
        assert!(x.is_finite(), "{key} is not finite in {line}");
    }
    assert!(json["turns_per_s"].as_f64().unwrap() > 0.0, "{line}");
    assert!(json["deltas_per_s"].as_f64().unwrap() > 0.0, "{line}");
    let machine = json["machine"].as_str().expect("machine");
    assert!(machine.contains("cores"), "{machine}");
}
