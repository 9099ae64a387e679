//! Three real instances on one database behind a round-robin client: each request goes to the
//! next live instance, and one that refuses the connection or answers 503 (not listening yet,
//! draining, the database away) passes it on to the next; only an answer counts.

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use crate::common::Http;

/// How long one request may take before it counts as unanswered (a hang).
pub const REQUEST_WAIT: Duration = Duration::from_secs(20);

/// How long a request looks for an instance that answers it.
const FIND_WAIT: Duration = Duration::from_secs(15);

/// One instance's place: its client while it runs, and how many times it was started.
#[derive(Clone, Default)]
struct Slot {
    http: Option<Http>,
    generation: u64,
}

/// A `2xx` to a POST: which instance (and which start of it) answered, and when.
#[derive(Clone, Copy, Debug)]
pub struct Success {
    pub slot: usize,
    pub generation: u64,
    pub sent: Instant,
    pub answered: Instant,
}

/// What came of a request.
pub enum Outcome {
    /// A `2xx`, with its JSON body (`Null` when none could be read).
    Ok(Value),
    /// Another status, and for a 5xx its error's message.
    Refused(u16, Option<String>),
    /// No answer (the connection broke after the request went out, or none came in time): the
    /// request may or may not have been carried out, so it is not counted as accepted.
    Unanswered(String),
}

/// The instances' folders (one `tools.toml` each) and the clients of those running.
pub struct Cluster {
    dirs: Vec<tempfile::TempDir>,
    slots: Mutex<Vec<Slot>>,
    next: AtomicUsize,
    /// Every HTTP request sent, passed-on ones included.
    pub attempts: AtomicU64,
    successes: Mutex<Vec<Success>>,
}

impl Cluster {
    /// `n` folders, each with `config` as its `tools.toml`; nothing started.
    pub fn new(config: &str, n: usize) -> Cluster {
        let dirs: Vec<_> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
        for d in &dirs {
            std::fs::write(d.path().join("tools.toml"), config).unwrap();
        }
        Cluster {
            dirs,
            slots: Mutex::new(vec![Slot::default(); n]),
            next: AtomicUsize::new(0),
            attempts: AtomicU64::new(0),
            successes: Mutex::new(Vec::new()),
        }
    }

    pub fn len(&self) -> usize {
        self.dirs.len()
    }

    pub fn dir(&self, i: usize) -> &Path {
        self.dirs[i].path()
    }

    /// Starts instance `i` (again) and puts it in the rotation; its process and generation.
    pub async fn start(&self, i: usize) -> (Child, u64) {
        let generation = self.slots.lock().unwrap()[i].generation + 1;
        let (child, http) = spawn(self.dir(i), generation).await;
        let mut slots = self.slots.lock().unwrap();
        slots[i] = Slot {
            http: Some(http),
            generation,
        };
        (child, generation)
    }

    /// Every `2xx` to a POST so far.
    pub fn successes(&self) -> Vec<Success> {
        self.successes.lock().unwrap().clone()
    }

    /// The next instance in the rotation, other than `avoid` if another runs.
    fn pick(&self, avoid: Option<usize>) -> Option<(usize, Http, u64)> {
        let slots = self.slots.lock().unwrap();
        let n = slots.len();
        let mut fallback = None;
        for _ in 0..n {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
            if let Some(http) = &slots[i].http {
                let found = (i, http.clone(), slots[i].generation);
                if Some(i) != avoid {
                    return Some(found);
                }
                fallback = Some(found);
            }
        }
        fallback
    }

    /// Sends the request to the next instance that answers it (not `avoid`, when another
    /// runs): the instance and its response's head, or why none came.
    pub async fn send_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        avoid: Option<usize>,
    ) -> (usize, Result<hyper::Response<Incoming>, String>) {
        let deadline = Instant::now() + FIND_WAIT;
        let bytes = body.map(|b| serde_json::to_vec(b).unwrap());
        loop {
            let Some((slot, http, generation)) = self.pick(avoid) else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let sent = Instant::now();
            let asked = http.try_request_raw(method, path, bytes.clone());
            match tokio::time::timeout(REQUEST_WAIT, asked).await {
                Err(_) => return (slot, Err(format!("no answer within {REQUEST_WAIT:?}"))),
                Ok(Err(e)) if !e.is_connect() => return (slot, Err(e.to_string())),
                Ok(Err(_)) => {}
                Ok(Ok(resp)) if resp.status() == 503 => {}
                Ok(Ok(resp)) => {
                    if method == "POST" && resp.status().is_success() {
                        self.successes.lock().unwrap().push(Success {
                            slot,
                            generation,
                            sent,
                            answered: Instant::now(),
                        });
                    }
                    return (slot, Ok(resp));
                }
            }
            if Instant::now() > deadline {
                return (
                    slot,
                    Err(format!("no instance answered within {FIND_WAIT:?}")),
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`Cluster::send_raw`] with the whole JSON answer read.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        avoid: Option<usize>,
    ) -> (usize, Outcome) {
        let (slot, resp) = self.send_raw(method, path, body, avoid).await;
        let resp = match resp {
            Ok(resp) => resp,
            Err(e) => return (slot, Outcome::Unanswered(e)),
        };
        let status = resp.status().as_u16();
        let read = tokio::time::timeout(REQUEST_WAIT, resp.into_body().collect()).await;
        let body = match read {
            Ok(Ok(b)) => serde_json::from_slice(&b.to_bytes()).unwrap_or(Value::Null),
            _ => Value::Null,
        };
        if (200..300).contains(&status) {
            (slot, Outcome::Ok(body))
        } else {
            let error = (status >= 500).then(|| format!("{status} {}", body["error"]));
            (slot, Outcome::Refused(status, error))
        }
    }
}

/// `turnstile serve` of `dir/tools.toml` on a free port; its log is appended to `dir/log.txt`,
/// each start marked. An instance that exits before it listens (it cannot reach PostgreSQL while
/// the agitator restarts it: turnstile fails fast at start) is started again, as a supervisor
/// would, for up to a minute.
async fn spawn(dir: &Path, generation: u64) -> (Child, Http) {
    use std::io::Write;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("log.txt"))
            .expect("log.txt");
        let mut child = crate::common::binary::serve_command(&dir.join("tools.toml"))
            .spawn()
            .expect("spawn turnstile");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let _ = writeln!(log, "--- start #{generation}");
        let listening = async {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = writeln!(log, "{line}");
                if let Some(addr) = crate::common::binary::listening_addr(&line) {
                    return Some(addr);
                }
            }
            None
        };
        let addr = tokio::time::timeout_at(deadline, listening)
            .await
            .ok()
            .flatten();
        let Some(addr) = addr else {
            let _ = child.kill().await;
            assert!(
                tokio::time::Instant::now() < deadline,
                "instance {} did not listen within a minute (its log: log.txt)",
                dir.display()
            );
            // A supervisor's restart delay.
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                let _ = writeln!(log, "{l}");
            }
        });
        return (child, Http::new(addr));
    }
}
