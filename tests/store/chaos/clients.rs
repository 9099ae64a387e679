//! A client: two sessions of its own, and until the end a seeded mix of AAP turns (`none`,
//! `delta` and `message` streams), turns that call the trusted MCP tool, turns that stop on the
//! `ask` tool and are answered (granted or denied) through another instance than the one that
//! stopped, and messages queued through the events API. Every request answered `2xx` is noted
//! with what finds its turn in the log: its turn id, or the tag in its text.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::{json, Value};

use super::cluster::{Cluster, Outcome, REQUEST_WAIT};
use super::Rng;

/// What finds an accepted request's turn in its session's log.
#[derive(Clone, Debug)]
pub enum Key {
    /// The `turn_id` of a `202`.
    Turn(String),
    /// `[[tag]]` in the turn's `user.message`.
    Tag(String),
    /// The call a `tool_permission` answer names.
    Permission(String),
}

/// A request answered `2xx`.
#[derive(Clone, Debug)]
pub struct Accepted {
    pub session: String,
    pub key: Key,
    pub kind: &'static str,
}

/// What a client did.
#[derive(Default)]
pub struct Tally {
    pub sessions: Vec<String>,
    pub accepted: Vec<Accepted>,
    /// Requests made (each once, however many instances it was passed on to).
    pub requests: u64,
    /// Answers other than `2xx` (or 503, which is passed on), by status.
    pub refused: BTreeMap<u16, u64>,
    /// The errors of 5xx answers other than 503.
    pub errors: Vec<String>,
    /// Requests that got no answer (an instance killed under them), and why.
    pub unanswered: Vec<String>,
}

struct Client {
    name: String,
    cluster: Arc<Cluster>,
    rng: Rng,
    n: u64,
    tally: Tally,
    /// Sessions whose next request is a queued message: an AAP turn was refused 409 (a turn
    /// running, or calls waiting for an answer, which a message answers "Not answered").
    needs_message: HashSet<String>,
}

/// Runs client `c` until `until`; its sessions are added to `sessions` as they are made.
pub async fn run(
    c: usize,
    cluster: Arc<Cluster>,
    rng: Rng,
    until: Instant,
    sessions: Arc<Mutex<Vec<String>>>,
) -> Tally {
    let mut me = Client {
        name: format!("c{c}"),
        cluster,
        rng,
        n: 0,
        tally: Tally::default(),
        needs_message: HashSet::new(),
    };
    for _ in 0..2 {
        if let Some(sid) = me.create(until).await {
            sessions.lock().unwrap().push(sid.clone());
            me.tally.sessions.push(sid);
        }
    }
    assert!(
        !me.tally.sessions.is_empty(),
        "{}: no session made",
        me.name
    );
    while Instant::now() < until {
        let i = me.rng.below(me.tally.sessions.len() as u64) as usize;
        let sid = me.tally.sessions[i].clone();
        if me.needs_message.remove(&sid) {
            me.queue(&sid).await;
            continue;
        }
        match me.rng.below(100) {
            0..=19 => me.turn(&sid, "plain", "none").await,
            20..=34 => {
                let mode = if me.rng.chance(50) {
                    "delta"
                } else {
                    "message"
                };
                me.turn(&sid, "plain", mode).await
            }
            35..=54 => {
                let mode = if me.rng.chance(50) { "delta" } else { "none" };
                me.turn(&sid, "mcp", mode).await
            }
            55..=74 => me.ask(&sid).await,
            _ => me.queue(&sid).await,
        }
        let pause = me.rng.millis(0, 80);
        tokio::time::sleep(pause).await;
    }
    me.tally
}

impl Client {
    /// A new tag, for a request's text (and the model's calls for it).
    fn tag(&mut self) -> String {
        self.n += 1;
        format!("{}n{}", self.name, self.n)
    }

    async fn create(&mut self, until: Instant) -> Option<String> {
        let deadline = until + Duration::from_secs(15);
        while Instant::now() < deadline {
            self.tally.requests += 1;
            let (_, out) = self
                .cluster
                .send("POST", "/sessions", Some(&json!({})), None)
                .await;
            if let Outcome::Ok(v) = out {
                if let Some(id) = v["sessionId"].as_str() {
                    return Some(id.to_string());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    fn accept(&mut self, session: &str, key: Key, kind: &'static str) {
        self.tally.accepted.push(Accepted {
            session: session.to_string(),
            key,
            kind,
        });
    }

    /// Notes a refusal or a missing answer.
    fn not_accepted(&mut self, session: &str, out: Outcome) {
        match out {
            Outcome::Ok(..) => unreachable!("an accepted request"),
            Outcome::Refused(status, error) => {
                *self.tally.refused.entry(status).or_default() += 1;
                self.tally.errors.extend(error);
                if status == 409 {
                    self.needs_message.insert(session.to_string());
                }
            }
            Outcome::Unanswered(why) => self.tally.unanswered.push(why),
        }
    }

    /// An AAP turn whose text is `what [[tag]]`, in stream mode `mode`.
    async fn turn(&mut self, sid: &str, what: &str, mode: &str) {
        let tag = self.tag();
        let kind = if what == "mcp" { "turn_mcp" } else { "turn" };
        let body = json!({"stream": mode, "messages": [
            {"role": "user", "content": format!("{what} [[{tag}]]")}
        ]});
        let path = format!("/sessions/{sid}/turns");
        self.tally.requests += 1;
        if mode == "none" {
            match self.cluster.send("POST", &path, Some(&body), None).await.1 {
                Outcome::Ok(..) => self.accept(sid, Key::Tag(tag), kind),
                out => self.not_accepted(sid, out),
            }
            return;
        }
        let resp = match self
            .cluster
            .send_raw("POST", &path, Some(&body), None)
            .await
            .1
        {
            Ok(resp) => resp,
            Err(why) => return self.not_accepted(sid, Outcome::Unanswered(why)),
        };
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            return self.not_accepted(sid, Outcome::Refused(status, None));
        }
        // The response head says the turn is accepted; the frames are read to the end or
        // until the instance goes away.
        self.accept(sid, Key::Tag(tag), "turn_stream");
        let _ = tokio::time::timeout(REQUEST_WAIT, resp.into_body().collect()).await;
    }

    /// A turn that stops on the `ask` tool, then its calls answered through another instance.
    async fn ask(&mut self, sid: &str) {
        let tag = self.tag();
        let body = json!({"messages": [{"role": "user", "content": format!("ask [[{tag}]]")}]});
        let path = format!("/sessions/{sid}/turns");
        self.tally.requests += 1;
        let (slot, stopped) = match self.cluster.send("POST", &path, Some(&body), None).await {
            (slot, Outcome::Ok(v)) => (slot, v),
            (_, out) => return self.not_accepted(sid, out),
        };
        self.accept(sid, Key::Tag(tag), "turn_ask");
        let calls: Vec<String> = stopped["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["toolCallId"].as_str().map(str::to_string))
            .collect();
        if stopped["stopReason"] != "tool_use" || calls.is_empty() {
            return;
        }
        let granted = self.rng.chance(60);
        let answers: Vec<Value> = calls
            .iter()
            .map(|id| {
                json!({"role": "tool_permission", "toolCallId": id, "granted": granted,
                    "reason": "the chaos client says no"})
            })
            .collect();
        let answer = json!({"messages": answers});
        self.tally.requests += 1;
        match self
            .cluster
            .send("POST", &path, Some(&answer), Some(slot))
            .await
            .1
        {
            Outcome::Ok(..) => {
                let kind = if granted { "granted" } else { "denied" };
                self.accept(sid, Key::Permission(calls[0].clone()), kind);
            }
            out => self.not_accepted(sid, out),
        }
    }

    /// One to three messages through the events API (`202 {"turn_id"}`), queued behind each
    /// other; some call the trusted tool.
    async fn queue(&mut self, sid: &str) {
        let n = 1 + self.rng.below(3);
        for _ in 0..n {
            let tag = self.tag();
            let what = if self.rng.chance(30) { "mcp" } else { "plain" };
            let body = json!({"content": format!("{what} [[{tag}]]")});
            self.tally.requests += 1;
            let path = format!("/sessions/{sid}/messages");
            match self.cluster.send("POST", &path, Some(&body), None).await.1 {
                Outcome::Ok(v) => {
                    let key = match v["turn_id"].as_str() {
                        Some(id) => Key::Turn(id.to_string()),
                        None => Key::Tag(tag),
                    };
                    self.accept(sid, key, "message");
                }
                out => self.not_accepted(sid, out),
            }
        }
    }
}
