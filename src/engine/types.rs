//! The engine's public types: what a caller orders (a session, a turn and what its watcher
//! needs), what it is answered (views of a session) and what can go wrong.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::log::{FileRef, StoreError};
use crate::message::{Message, ToolSpec};

use std::sync::Arc;

use crate::log::Event;

use super::session_record::{Pending, SessionRecord, ToolGrant};

/// What can go wrong asking the engine for something. Mapped to HTTP once, at the edge.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    #[error("session is busy: turn {turn_id} is running; wait for it to end or cancel it")]
    Busy { turn_id: String },
    /// The request conflicts with the session's state.
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed or names things that do not exist.
    #[error("{0}")]
    Invalid(String),
    /// The caller's principal may not do this (`[keys.NAME]`: an agent it may not use).
    #[error("{0}")]
    Forbidden(String),
    #[error("the server is shutting down; retry against another instance or after restart")]
    ShuttingDown,
    /// A quota of `[limits]` is reached: 429 (what the caller holds: its sessions, its
    /// session's queue or streams) or 503 (the whole server's capacity), with `Retry-After`.
    #[error("{message}")]
    OverLimit {
        /// The error type (snake_case).
        kind: &'static str,
        message: String,
        /// Server-wide capacity (503) rather than the caller's own quota (429).
        server_wide: bool,
        /// Seconds for `Retry-After`.
        retry_after: u64,
    },
    /// The principal's rate limit or a budget of its refuses a new turn (429, `rate_limited`
    /// or `budget_exceeded`, with `Retry-After`); boxed, as it is rare.
    #[error("{0}")]
    Refused(Box<crate::usage::Refusal>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A new session.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    /// `None`: the default agent with every permitted tool enabled and trusted per policy.
    pub agent: Option<AgentChoice>,
    pub seed: Vec<Message>,
    pub client_tools: Vec<ToolSpec>,
}

/// An agent picked by name, with its AAP `tools` and `options`.
#[derive(Debug, Clone, Default)]
pub struct AgentChoice {
    pub name: String,
    /// `None` (AAP: omitted): every exposed server tool disabled.
    pub tools: Option<Vec<ToolGrant>>,
    pub options: BTreeMap<String, String>,
}

/// Session-level overrides sent with a turn (AAP: persisted for the session's lifetime).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SessionUpdate {
    pub tools: Option<Vec<ToolGrant>>,
    /// Merged by key.
    pub options: Option<BTreeMap<String, String>>,
    pub client_tools: Option<Vec<ToolSpec>>,
}

/// An order to start a turn: what starts it, the session settings it changes, and what its
/// watcher needs.
#[derive(Debug, Clone)]
pub struct TurnOrder {
    pub input: TurnInput,
    pub update: SessionUpdate,
    /// What the turn's watcher needs (see [`Delivery`]).
    pub delivery: Delivery,
    /// What a turn already running means for this one.
    pub when_busy: WhenBusy,
    /// Plan mode: the first model call proposes a plan and waits for its approval.
    pub plan: bool,
    /// Overrides the agent's `max_steps` for this turn (a ceiling: never more than the agent's).
    pub max_steps: Option<u32>,
}

/// What a turn's watcher needs, said in the engine's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Whether a client attends the turn to run its client tools and answer permissions.
    pub client: Client,
    /// Whether text shown to the watcher as it streams can be taken back.
    pub text: ShownText,
    /// Who runs the turn.
    pub runner: Runner,
    /// The request is answered once the turn is accepted (a `202`): its start is committed at
    /// once rather than within `SYNC_AFTER` (see `engine/turn/mod.rs`), so that the answer
    /// never waits for a timer. A request answered with the turn's events (a stream, a `none`
    /// answer) has no need: its first byte waits for the first event, durable by then.
    pub confirm: bool,
}

/// Whether a client attends a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// A client attends: a call of a client tool, or a server call that needs permission,
    /// stops the turn for the client's answer.
    Attends,
    /// No client attends: such a call gets an error result saying that it runs only in a turn
    /// made with `attend_at` (the caller's words for where a client can attend a turn). A new
    /// message goes on past the calls the session waits on (its turn answers them first).
    Absent { attend_at: &'static str },
}

/// Whether streamed text shown to the watcher can be taken back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShownText {
    /// An upstream attempt that fails after streaming text is retracted (an empty
    /// `agent.message`) and retried.
    Retractable,
    /// The watcher shows streamed text as it arrives and has no way to take it back: an upstream
    /// attempt that fails after streaming text is then kept in the log and ends the turn,
    /// instead of being retracted and retried, so the client never holds text the history does
    /// not.
    Irrevocable,
}

/// Who runs a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// A task spawned for it.
    OwnTask,
    /// The watcher: it reads the handle until the turn ends, on a task of its own, and the turn
    /// runs there while it reads; on a task of its own only if the handle is dropped first (or
    /// not read for a while: see `run_by_watcher.rs`). Not for a watcher that may stop reading while it
    /// holds the handle (an SSE body that a slow client does not drain): the turn would wait on
    /// it.
    Watcher,
}

/// What to do when a turn is already running in the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenBusy {
    /// Fail with [`EngineError::Busy`].
    Refuse,
    /// Wait behind the running turn (and the turns queued already).
    Queue,
}

impl TurnOrder {
    /// A turn no client attends: client tools and `ask` tools get an error result naming
    /// `attend_at`, and the turn waits behind a running one.
    pub fn unattended(input: TurnInput, attend_at: &'static str) -> TurnOrder {
        TurnOrder {
            input,
            update: SessionUpdate::default(),
            delivery: Delivery {
                client: Client::Absent { attend_at },
                text: ShownText::Retractable,
                runner: Runner::OwnTask,
                confirm: true,
            },
            when_busy: WhenBusy::Queue,
            plan: false,
            max_steps: None,
        }
    }

    pub fn with_max_steps(mut self, max_steps: Option<u32>) -> TurnOrder {
        self.max_steps = max_steps;
        self
    }

    /// A turn its client attends: not queued, no plan.
    pub fn attended(input: TurnInput, update: SessionUpdate) -> TurnOrder {
        TurnOrder {
            input,
            update,
            delivery: Delivery {
                client: Client::Attends,
                text: ShownText::Retractable,
                runner: Runner::OwnTask,
                confirm: false,
            },
            when_busy: WhenBusy::Refuse,
            plan: false,
            max_steps: None,
        }
    }
}

/// What starts a turn.
#[derive(Debug, Clone)]
pub enum TurnInput {
    /// A new user message.
    User {
        content: Value,
        files: Vec<FileRef>,
        skills: Vec<Value>,
    },
    /// Answers to the calls the last turn stopped on: one per pending call.
    Resume {
        results: Vec<ClientResult>,
        permissions: Vec<Permission>,
    },
}

/// A client tool's result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ClientResult {
    pub call_id: String,
    /// A string or content blocks.
    pub content: Value,
    pub is_error: bool,
}

/// The client's decision on a server tool call.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Permission {
    pub call_id: String,
    pub granted: bool,
    pub reason: Option<String>,
}

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Idle,
    Running,
    AwaitingClient,
    /// A run in plan mode waits for its plan to be confirmed or rejected.
    PlanPendingApproval,
}

/// Whose sessions a request reaches: its principal's own (`Owner(None)`: a server without
/// keys), or every one (an admin principal: `[keys.NAME] admin = true`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach<'a> {
    Owner(Option<&'a str>),
    Every,
}

impl Reach<'_> {
    /// Whether a session of `owner` is within reach.
    pub fn includes(self, owner: Option<&str>) -> bool {
        match self {
            Reach::Owner(o) => o == owner,
            Reach::Every => true,
        }
    }
}

/// A consistent view of a session.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub id: String,
    /// Its owner id (see [`crate::config::Principal`]): the narrowing of its agent's tools.
    pub owner: Option<String>,
    pub created_at: String,
    pub record: SessionRecord,
    pub status: Status,
    pub running_turn: Option<String>,
    pub pending: Vec<Pending>,
    /// Turns waiting behind the running one.
    pub queued: Vec<String>,
    pub pending_plan: Option<String>,
}

/// Which text a delta extends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaKind {
    Message,
    Thinking,
}

/// A live item: a stored event, or streamed text (never stored).
#[derive(Debug, Clone)]
pub enum Feed {
    Event(Arc<Event>),
    /// A fragment exactly as the upstream streamed it: sent only to the watcher of the turn
    /// (AAP `delta` mode), never to session subscribers.
    Fragment {
        kind: DeltaKind,
        text: String,
    },
    /// A coalesced delta (at most 200 characters, or what 50 ms gathered), for subscribers.
    Delta {
        turn_id: Arc<str>,
        kind: DeltaKind,
        text: Arc<str>,
    },
}
