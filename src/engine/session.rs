//! A session: its persisted record, its in-memory state, and the one place events are appended.
//!
//! All state of a session sits behind one mutex that is never held across an await. Appending an
//! event assigns its sequence number and id, queues it for the store, folds it into the history
//! projection and publishes it to live subscribers, all under that lock, so the log, the
//! projection and every live stream see one order.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::history::Projector;
use crate::log::{Event, EventBody, StopReason, Store};
use crate::message::{Message, ToolCall, ToolSpec};
use crate::{clock, ids};

/// A server tool enabled for a session, and whether the session trusts it (AAP `ServerToolRef`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolGrant {
    pub name: String,
    #[serde(default)]
    pub trust: bool,
}

/// What is persisted about a session besides its events.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionRecord {
    pub agent: String,
    /// `None`: made without an `agent` object, so every permitted tool is enabled and trusted
    /// per policy. `Some(list)`: exactly these server tools are enabled.
    pub tools: Option<Vec<ToolGrant>>,
    pub options: BTreeMap<String, String>,
    pub client_tools: Vec<ToolSpec>,
    /// Seed history (`POST /sessions` `messages`).
    pub seed: Vec<Message>,
}

/// A live item: a stored event, or a fragment of streamed text (never stored).
#[derive(Debug, Clone)]
pub enum Feed {
    Event(Arc<Event>),
    TextDelta { turn_id: Arc<str>, text: String },
    ThinkingDelta { turn_id: Arc<str>, text: String },
}

/// Who must act on a pending tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingKind {
    /// A client tool: the client runs it and posts the result.
    Client,
    /// A server tool that needs the client's permission.
    Permission,
}

/// A tool call the last turn stopped on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pending {
    #[serde(rename = "toolCallId")]
    pub call_id: String,
    pub name: String,
    pub input: serde_json::Value,
    pub kind: PendingKind,
}

impl Pending {
    pub fn call(&self) -> ToolCall {
        ToolCall {
            id: self.call_id.clone(),
            name: self.name.clone(),
            input: self.input.clone(),
        }
    }
}

/// Why a running turn is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    Cancelled,
    Shutdown,
}

/// The handle of a running turn.
#[derive(Debug)]
pub struct TurnControl {
    pub turn_id: String,
    pub token: CancellationToken,
    cause: Mutex<Option<StopCause>>,
}

impl TurnControl {
    pub fn new(turn_id: String) -> Arc<TurnControl> {
        Arc::new(TurnControl {
            turn_id,
            token: CancellationToken::new(),
            cause: Mutex::new(None),
        })
    }

    /// Ask the turn to stop; the first cause wins.
    pub fn stop(&self, cause: StopCause) {
        let mut c = self.cause.lock().unwrap_or_else(|p| p.into_inner());
        c.get_or_insert(cause);
        self.token.cancel();
    }

    pub fn cause(&self) -> Option<StopCause> {
        *self.cause.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) struct State {
    pub record: SessionRecord,
    pub next_seq: u64,
    pub history: Projector,
    pub pending: Vec<Pending>,
    pub running: Option<Arc<TurnControl>>,
    /// The events of the current (or last) turn, for subscribers that join mid-turn.
    pub tail: Vec<Arc<Event>>,
    pub deleted: bool,
}

/// A session in memory.
pub struct Session {
    pub id: Arc<str>,
    pub owner: Option<String>,
    pub created_at: String,
    state: Mutex<State>,
    feed: broadcast::Sender<Feed>,
}

/// Live subscribers may lag this many items behind before they must refill from the log.
const FEED_CAPACITY: usize = 4096;

impl Session {
    /// A session with this record and these stored events.
    pub(crate) fn restore(
        id: String,
        owner: Option<String>,
        created_at: String,
        record: SessionRecord,
        events: Vec<Event>,
    ) -> Session {
        let mut history = Projector::with_seed(&record.seed);
        let mut next_seq = 0;
        let mut last_turn: Vec<Arc<Event>> = Vec::new();
        for ev in events {
            history.apply(&ev.body);
            next_seq = ev.seq;
            if matches!(ev.body, EventBody::UserMessage { .. }) {
                last_turn.clear();
            }
            last_turn.push(Arc::new(ev));
        }
        let pending = pending_calls(&last_turn, &record);
        Session {
            id: id.into(),
            owner,
            created_at,
            state: Mutex::new(State {
                record,
                next_seq,
                history,
                pending,
                running: None,
                tail: last_turn,
                deleted: false,
            }),
            feed: broadcast::channel(FEED_CAPACITY).0,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Append an event to the log. `publish: false` holds it back from live subscribers (the
    /// caller publishes it with [`Session::publish`] once it is durable). `None` when the
    /// session has been deleted.
    pub(crate) fn append(
        &self,
        store: &Store,
        turn_id: &str,
        body: EventBody,
        publish: bool,
    ) -> Option<Arc<Event>> {
        let mut st = self.lock();
        self.append_locked(&mut st, store, turn_id, body, publish)
    }

    pub(crate) fn append_locked(
        &self,
        st: &mut State,
        store: &Store,
        turn_id: &str,
        body: EventBody,
        publish: bool,
    ) -> Option<Arc<Event>> {
        if st.deleted {
            return None;
        }
        st.next_seq += 1;
        if matches!(body, EventBody::UserMessage { .. }) {
            st.tail.clear();
        }
        let ev = Arc::new(Event::new(
            st.next_seq,
            ids::new("evt"),
            turn_id.to_string(),
            clock::now(),
            body,
        ));
        store.append(&self.id, &ev);
        st.history.apply(&ev.body);
        st.tail.push(ev.clone());
        if publish {
            let _ = self.feed.send(Feed::Event(ev.clone()));
        }
        Some(ev)
    }

    /// Send an item to live subscribers.
    pub fn publish(&self, item: Feed) {
        let _ = self.feed.send(item);
    }

    /// Subscribe to live items, with the events of the current turn so far (taken atomically,
    /// so nothing falls between them).
    pub fn subscribe(&self) -> (Vec<Arc<Event>>, broadcast::Receiver<Feed>) {
        let st = self.lock();
        (st.tail.clone(), self.feed.subscribe())
    }

    pub fn record(&self) -> SessionRecord {
        self.lock().record.clone()
    }

    pub fn history(&self) -> Vec<Message> {
        self.lock().history.messages()
    }

    pub fn pending(&self) -> Vec<Pending> {
        self.lock().pending.clone()
    }

    pub fn running_turn(&self) -> Option<String> {
        self.lock().running.as_ref().map(|r| r.turn_id.clone())
    }
}

/// The calls a turn stopped on: its `agent.tool_use`s without a result, when it completed with
/// `stop_reason: tool_use`.
fn pending_calls(turn: &[Arc<Event>], record: &SessionRecord) -> Vec<Pending> {
    let stopped_on_tools = matches!(
        turn.last().map(|e| &e.body),
        Some(EventBody::TurnCompleted {
            stop_reason: StopReason::ToolUse,
            ..
        })
    );
    if !stopped_on_tools {
        return Vec::new();
    }
    let mut out: Vec<Pending> = Vec::new();
    for ev in turn {
        match &ev.body {
            EventBody::ToolUse {
                tool_use_id,
                name,
                input,
            } => out.push(Pending {
                call_id: tool_use_id.clone(),
                name: name.clone(),
                input: input.clone(),
                kind: if record.client_tools.iter().any(|t| &t.name == name) {
                    PendingKind::Client
                } else {
                    PendingKind::Permission
                },
            }),
            EventBody::ToolResult { tool_use_id, .. } => out.retain(|p| &p.call_id != tool_use_id),
            _ => {}
        }
    }
    out
}
