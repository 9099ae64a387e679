//! The real `turnstile` binary, started as a child process: for tests of what only a process
//! shows (descriptors, RSS, signals, `kill -9`).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// `turnstile serve --config CONFIG` on a free loopback port, logging at INFO. Returns the child
/// (killed on drop) and the address it listens on, read from its log; the rest of its log is
/// drained so that the child never blocks on a full pipe.
pub async fn serve(config: &Path) -> (Child, SocketAddr) {
    serve_with_env(config, &[]).await
}

/// [`serve`] with these variables in its environment too (API keys, secrets).
pub async fn serve_with_env(config: &Path, vars: &[(&str, &str)]) -> (Child, SocketAddr) {
    let (child, mut lines, addr) = start(config, vars).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

/// [`serve`] of `dir/tools.toml`, with the WARN and ERROR lines of its log written to
/// `dir/log.txt` (for a failing test to show what the instance said), and a client of it.
pub async fn serve_in(dir: &Path) -> (Child, super::Http) {
    let (child, mut lines, addr) = start(&dir.join("tools.toml"), &[]).await;
    let log = dir.join("log.txt");
    tokio::spawn(async move {
        use std::io::Write;
        let mut f = std::fs::File::create(log).expect("log.txt");
        while let Ok(Some(l)) = lines.next_line().await {
            if l.contains("WARN") || l.contains("ERROR") {
                let _ = writeln!(f, "{l}");
            }
        }
    });
    (child, super::Http::new(addr))
}

/// The `turnstile` binary, to be given its arguments. Its environment is this process's plus
/// the variables of the test databases ([`super::postgres::vars`]), which a config of
/// [`super::config_text`] may name.
pub fn command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    cmd.envs(super::postgres::vars());
    cmd
}

/// [`command`] for a test that waits for the process itself.
pub fn blocking_command() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"));
    cmd.envs(super::postgres::vars());
    cmd
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStderr>>;

/// `turnstile serve` of `config` on a free loopback port, logging at `info` to a pipe.
pub fn serve_command(config: &Path) -> Command {
    let mut cmd = command();
    cmd.args(["serve", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// The address a `listening on http://ADDR` line of the log names, if it is that line.
pub fn listening_addr(line: &str) -> Option<SocketAddr> {
    let rest = line.split("listening on http://").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// The child serving `config`, the rest of its log, and the address it listens on.
async fn start(config: &Path, vars: &[(&str, &str)]) -> (Child, Lines, SocketAddr) {
    let mut child = serve_command(config)
        .envs(vars.iter().copied())
        .spawn()
        .expect("spawn turnstile");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
    let addr = loop {
        let line = lines
            .next_line()
            .await
            .expect("stderr")
            .expect("turnstile exited before listening");
        if let Some(addr) = listening_addr(&line) {
            break addr;
        }
    };
    (child, lines, addr)
}
