//! The engine: sessions, their turns, and the turn loop. Knows nothing of HTTP or of any one
//! protocol's wire format: protocol adapters call it, renderers read what it logs.
//!
//! Seams for the next pieces:
//! - server tools plug in behind [`crate::tools::ToolHost`] (MCP federation, `deliver_file`);
//! - other APIs start turns with [`Engine::start_turn`] (`Client::Absent` where no client can
//!   run tools or answer permissions) and render the events a turn sends to its sink, or
//!   subscribe to a session's live feed with [`Session::subscribe`].

pub mod approvals;
pub mod catalog;
pub mod context;
mod delivery;
mod driven;
pub mod follow;
pub mod history;
pub mod oversize;
pub mod session;
mod turn;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;

use crate::config::{AgentConfig, Config};
use crate::log::{FailReason, SessionRow, Store, StoreError};
use crate::message::{Message, ToolSpec};
use crate::tools::{ServerTool, ToolHost};
use crate::upstream::Provider;
use crate::{clock, ids};

pub use session::{
    DeltaKind, Feed, Pending, PendingKind, PlanDecision, Session, SessionRecord, StopCause,
    ToolGrant,
};
pub use turn::{ClientResult, Permission, TurnInput};

use crate::sync::lock;

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
#[derive(Debug, Clone, Default)]
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
    /// not read for a while: see `driven.rs`). Not for a watcher that may stop reading while it
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
            },
            when_busy: WhenBusy::Refuse,
            plan: false,
            max_steps: None,
        }
    }
}

/// A started turn: its id and what it sends as it runs (stored events and deltas), read with
/// [`TurnHandle::recv`]. The turn goes on if this is dropped. What it sends waits here bounded
/// (see `delivery/channel.rs`): a reader that falls too far behind reads the rest of the turn from the log.
pub struct TurnHandle {
    pub turn_id: String,
    feed: mpsc::Receiver<Feed>,
    overflow: Arc<delivery::channel::Overflow>,
    /// Once the channel overflowed: the rest of the turn, from the log.
    follow: Option<Box<follow::Follow>>,
    /// For reading from the log.
    engine: Engine,
    session: Arc<Session>,
    /// The turn's terminal event has been returned (read from the log).
    done: bool,
    /// The turn itself, when its watcher runs it (see [`Runner::Watcher`]).
    driven: Option<driven::Driven>,
    /// Counts a driven turn among the running ones until everything it sent is read, so that a
    /// shutdown waits for its watcher to have its terminal event.
    running: Option<tokio_util::task::task_tracker::TaskTrackerToken>,
}

/// What the channel gave a [`TurnHandle`].
enum Step {
    Item(Feed),
    /// The turn has ended and everything it sent is read.
    End,
    /// The channel overflowed: the turn's events from after this seq are in the log only.
    Missed(u64),
}

impl TurnHandle {
    /// The next thing the turn sends: `None` once it has ended and everything it sent is read.
    /// A driven turn runs while this is polled; if it is not polled for a second or two after
    /// the turn was woken, the turn goes on on a task of its own (see `driven.rs`).
    pub async fn recv(&mut self) -> Option<Feed> {
        loop {
            if self.done {
                self.running = None;
                return None;
            }
            if let Some(follow) = self.follow.as_mut() {
                match follow.next().await {
                    Some(Feed::Event(ev)) if *ev.turn_id == *self.turn_id => {
                        self.done = ev.body.is_terminal();
                        return Some(Feed::Event(ev));
                    }
                    Some(_) => continue,
                    None => {
                        self.done = true;
                        continue;
                    }
                }
            }
            match std::future::poll_fn(|cx| self.poll_step(cx)).await {
                Step::Item(item) => return Some(item),
                Step::End => return None,
                Step::Missed(after) => {
                    tracing::debug!(turn = %self.turn_id, "a turn's watcher fell behind: it reads the rest of the turn from the log");
                    if let Some(driven) = self.driven.take() {
                        driven.detach();
                    }
                    let session = self.session.clone();
                    match follow::Follow::new(&self.engine, session, after).await {
                        Ok(f) => self.follow = Some(Box::new(f)),
                        Err(e) => {
                            tracing::warn!(turn = %self.turn_id, error = %e, "a turn's watcher could not read the rest of its turn from the log");
                            self.done = true;
                        }
                    }
                }
            }
        }
    }

    /// Whether streamed fragments were dropped (the watcher fell behind): the stored text then
    /// holds what they missed.
    pub fn fragments_lost(&self) -> bool {
        self.overflow.fragments_lost()
    }

    fn poll_step(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Step> {
        use std::task::Poll;
        // The turn first: what it sends as it runs is then read in the same poll.
        if let Some(driven) = &self.driven {
            if driven.poll(cx).is_ready() {
                self.driven = None;
            }
        }
        match self.feed.poll_recv(cx) {
            Poll::Ready(Some(item)) => Poll::Ready(Step::Item(item)),
            Poll::Ready(None) => match self.overflow.dropped_from() {
                Some(seq) => Poll::Ready(Step::Missed(seq - 1)),
                None => {
                    self.running = None;
                    Poll::Ready(Step::End)
                }
            },
            Poll::Pending => {
                self.overflow.register(cx.waker());
                let Some(seq) = self.overflow.dropped_from() else {
                    return Poll::Pending;
                };
                // Nothing is sent after the first missed event: what the channel still holds
                // (sent since it was last seen empty) comes first.
                match self.feed.try_recv() {
                    Ok(item) => Poll::Ready(Step::Item(item)),
                    Err(_) => Poll::Ready(Step::Missed(seq - 1)),
                }
            }
        }
    }
}

impl Drop for TurnHandle {
    /// A watcher that goes away mid-turn (a client that disconnects) leaves its turn to a task
    /// of its own.
    fn drop(&mut self) {
        if let Some(driven) = self.driven.take() {
            driven.detach();
        }
    }
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

/// A consistent view of a session.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub id: String,
    pub created_at: String,
    pub record: SessionRecord,
    pub status: Status,
    pub running_turn: Option<String>,
    pub pending: Vec<Pending>,
    /// Turns waiting behind the running one.
    pub queued: Vec<String>,
    pub pending_plan: Option<String>,
}

pub(crate) struct Inner {
    pub config: Arc<Config>,
    pub store: Store,
    pub provider: Arc<dyn Provider>,
    pub tools: Arc<dyn ToolHost>,
    pub files: Option<crate::files::FileStore>,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Counts takings from `sessions`: a session's `used` is the tick of its last.
    tick: std::sync::atomic::AtomicU64,
    tracker: TaskTracker,
    shutting_down: std::sync::atomic::AtomicBool,
    /// [`turn::SYNC_AFTER`], in µs; tests may change it ([`Engine::set_sync_after`]).
    sync_after_us: std::sync::atomic::AtomicU64,
    /// The turns their watchers run, for a turn whose watcher stops polling to go on.
    sweeper: driven::Sweeper,
    /// Turns running now, server-wide (`[limits] running_turns`).
    running_turns: Arc<AtomicUsize>,
    /// Sessions per owner (`[limits] sessions_per_key`): counted from the store on an owner's
    /// first create, then kept here as sessions are made and deleted.
    owned: Mutex<HashMap<Option<String>, usize>>,
}

/// A turn counted among the running ones (`[limits] running_turns`) while it lives: taken when
/// a turn starts at once (refused past the limit) or when a queued one takes its session over
/// (never refused: it was accepted), given back when the turn's task ends.
pub(crate) struct RunSlot(Arc<AtomicUsize>);

impl RunSlot {
    /// A slot, if fewer than `limit` turns run.
    fn try_take(count: &Arc<AtomicUsize>, limit: usize) -> Option<RunSlot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| RunSlot(count.clone()))
    }

    /// A slot whatever the count (a queued turn that was accepted).
    pub(crate) fn take(count: &Arc<AtomicUsize>) -> RunSlot {
        count.fetch_add(1, Ordering::AcqRel);
        RunSlot(count.clone())
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Inner {
    /// How long an event may wait to be committed while its turn waits on a model or tool call
    /// (see [`turn::SYNC_AFTER`]).
    pub(crate) fn sync_after(&self) -> std::time::Duration {
        let us = self
            .sync_after_us
            .load(std::sync::atomic::Ordering::Relaxed);
        std::time::Duration::from_micros(us)
    }

    /// The counter of running turns, for [`RunSlot`].
    pub(crate) fn running_turns(&self) -> &Arc<AtomicUsize> {
        &self.running_turns
    }

    pub(crate) fn spawn_turn(self: &Arc<Inner>, job: turn::TurnJob) {
        crate::metrics::inc(&crate::metrics::TURNS_STARTED);
        let span = job.span();
        let turn = turn::run(self.clone(), job);
        self.tracker
            .spawn(tracing::Instrument::instrument(turn, span));
    }

    /// A turn for its watcher to run (see [`Runner::Watcher`]).
    fn drive_turn(self: &Arc<Inner>, job: turn::TurnJob) -> driven::Driven {
        crate::metrics::inc(&crate::metrics::TURNS_STARTED);
        let span = job.span();
        let turn = turn::run(self.clone(), job);
        driven::Driven::new(self, Box::pin(tracing::Instrument::instrument(turn, span)))
    }
}

/// A new session counted against its owner's quota; [`Counted::release`] if it is not made.
struct Counted(Option<Option<String>>);

impl Counted {
    fn release(&mut self, engine: &Engine) {
        if let Some(owner) = self.0.take() {
            engine.uncount_session(&owner);
        }
    }
}

/// The engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

/// Sessions per page of `list_sessions`.
pub const PAGE_SIZE: usize = 50;

/// `Retry-After` (seconds) of a session whose queue is full: about a turn's length.
const QUEUE_RETRY_AFTER: u64 = 5;
/// `Retry-After` (seconds) of a server running all the turns it may.
const RUNNING_RETRY_AFTER: u64 = 2;
/// `Retry-After` (seconds) of a key at its session quota: it must delete sessions first.
const SESSIONS_RETRY_AFTER: u64 = 60;
/// `Retry-After` (seconds) of a session with all the streams it may have.
const SUBSCRIBERS_RETRY_AFTER: u64 = 5;

impl Engine {
    /// Open the store and close every turn a previous process left unfinished (`worker_lost`).
    pub async fn open(
        config: Arc<Config>,
        store: Store,
        provider: Arc<dyn Provider>,
        tools: Arc<dyn ToolHost>,
        files: Option<crate::files::FileStore>,
    ) -> Result<Engine, EngineError> {
        let engine = Engine {
            inner: Arc::new(Inner {
                config,
                store,
                provider,
                tools,
                files,
                sessions: Mutex::new(HashMap::new()),
                tick: Default::default(),
                tracker: TaskTracker::new(),
                shutting_down: false.into(),
                sync_after_us: (turn::SYNC_AFTER.as_micros() as u64).into(),
                sweeper: Default::default(),
                running_turns: Default::default(),
                owned: Default::default(),
            }),
        };
        engine.recover().await?;
        Ok(engine)
    }

    async fn recover(&self) -> Result<(), EngineError> {
        let store = &self.inner.store;
        for id in store.unfinished_sessions().await? {
            let Some(session) = self.load(&id).await? else {
                continue;
            };
            let why = "the process running this turn stopped before it ended";
            let closed =
                session.close_open_locked(&mut session.lock(), store, FailReason::WorkerLost, why);
            let Some(turn_id) = closed else { continue };
            store.flush().await?;
            session.publish_durable(store);
            tracing::warn!(session = %id, turn = %turn_id, "closed a turn left unfinished by a previous process (worker_lost)");
        }
        store.flush().await?;
        Ok(())
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.inner.config
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Testing: how long an event may wait to be committed while its turn waits on a model or
    /// tool call (1 ms; see `SYNC_AFTER` in `engine/turn.rs`).
    #[doc(hidden)]
    pub fn set_sync_after(&self, after: std::time::Duration) {
        let us = after.as_micros().min(u64::MAX as u128) as u64;
        self.inner
            .sync_after_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// Testing: apply approval expiry to a session as if `ahead` had passed (see
    /// `engine/approvals.rs`), so tests need not wait out `approval_ttl_s`.
    #[doc(hidden)]
    pub fn expire_approvals_ahead(&self, session: &Arc<Session>, ahead: Duration) {
        let ahead = ahead.as_millis().min(i64::MAX as u128) as i64;
        approvals::settle_at(&self.inner, session, clock::now_ms().saturating_add(ahead));
    }

    /// The tool host's current tools.
    pub fn host_tools(&self) -> Arc<Vec<ServerTool>> {
        self.inner.tools.tools()
    }

    /// Every MCP server's state (`GET /status`, `/readyz`).
    pub fn host_servers(&self) -> Vec<crate::mcp::ServerReport> {
        self.inner.tools.servers()
    }

    /// Turns running now, by agent (sessions in memory; a running turn keeps its session there).
    pub fn active_turns(&self) -> std::collections::BTreeMap<String, usize> {
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        let mut by_agent: std::collections::BTreeMap<String, usize> = self
            .inner
            .config
            .agents
            .iter()
            .map(|a| (a.name.clone(), 0))
            .collect();
        for s in sessions {
            let st = s.lock();
            if st.running.is_some() {
                *by_agent.entry(st.record.agent.clone()).or_default() += 1;
            }
        }
        by_agent
    }

    /// A session's workspace folder: `sandboxes/<session id>/`.
    pub fn workspace(&self, session_id: &str) -> std::path::PathBuf {
        self.inner.config.server.sandboxes.join(session_id)
    }

    /// Moves whenever the tool host's tool set changes.
    pub fn tools_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.tools.generation()
    }

    /// An agent's exposed server tools (`GET /meta`).
    pub fn exposed_tools(&self, agent: &AgentConfig) -> Vec<ServerTool> {
        let host = self.inner.tools.tools();
        catalog::exposed(agent, &host)
            .into_iter()
            .cloned()
            .collect()
    }

    fn check_open(&self) -> Result<(), EngineError> {
        if self.inner.shutting_down.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        Ok(())
    }

    /// Create a session. It does not run the agent.
    pub async fn create_session(
        &self,
        owner: Option<String>,
        new: NewSession,
    ) -> Result<SessionView, EngineError> {
        self.check_open()?;
        let config = &self.inner.config;
        let (agent, tools, options) = match new.agent {
            Some(choice) => {
                let agent = config.agent(&choice.name).ok_or_else(|| {
                    EngineError::Invalid(format!(
                        "unknown agent {:?}; GET /meta lists the agents: {}",
                        choice.name,
                        agent_names(config)
                    ))
                })?;
                // AAP: `agent.tools` omitted means every exposed server tool is disabled.
                (
                    agent,
                    Some(choice.tools.unwrap_or_default()),
                    choice.options,
                )
            }
            None => (config.default_agent(), None, BTreeMap::new()),
        };
        if !agent.client_system_prompt
            && new.seed.iter().any(|m| matches!(m, Message::System { .. }))
        {
            return Err(EngineError::Invalid(format!(
                "agent {:?} keeps its own system prompt ([agents.{}] client_system_prompt = false in tools.toml): send no system prompt (a run's system_prompt, a system message in messages)",
                agent.name, agent.name
            )));
        }
        let mut record = SessionRecord {
            agent: agent.name.clone(),
            tools: None,
            options: BTreeMap::new(),
            client_tools: Vec::new(),
            seed: new.seed,
            asked: Vec::new(),
        };
        self.apply_update(
            agent,
            &mut record,
            SessionUpdate {
                tools,
                options: Some(options),
                client_tools: Some(new.client_tools),
            },
        )?;
        let mut counted = self.count_session(&owner).await?;
        let id = ids::new("sess");
        let created_at = clock::now();
        let workspace = self.workspace(&id);
        if let Err(e) = std::fs::create_dir_all(&workspace) {
            tracing::error!(path = %workspace.display(), error = %e, "cannot create the session's workspace");
            counted.release(self);
            return Err(EngineError::Conflict(format!(
                "cannot create the session's workspace {}: {e}; check [server] sandboxes",
                workspace.display()
            )));
        }
        let session = Arc::new(Session::restore(
            id.clone(),
            owner.clone(),
            created_at.clone(),
            record,
            Vec::new(),
        ));
        self.persist(&session);
        if let Err(e) = self.inner.store.flush().await {
            counted.release(self);
            return Err(e.into());
        }
        let session = self.cache(&id, session);
        Ok(view(&session))
    }

    /// Count a new session of `owner` against `[limits] sessions_per_key` (429 past it). The
    /// count is read from the store on the owner's first new session, then kept in memory.
    async fn count_session(&self, owner: &Option<String>) -> Result<Counted, EngineError> {
        if !lock(&self.inner.owned).contains_key(owner) {
            let n = self.inner.store.count_sessions(owner.clone()).await?;
            // A create that raced this one made the entry first: its count stands (it was
            // read before that create stored its session).
            lock(&self.inner.owned).entry(owner.clone()).or_insert(n);
        }
        let limit = self.inner.config.limits.sessions_per_key;
        let mut owned = lock(&self.inner.owned);
        let n = owned.entry(owner.clone()).or_insert(0);
        if *n >= limit {
            return Err(EngineError::OverLimit {
                kind: "too_many_sessions",
                message: format!(
                    "this key already has {n} sessions (limit: [limits] sessions_per_key in tools.toml); delete sessions it no longer needs (DELETE /sessions/{{id}})"
                ),
                server_wide: false,
                retry_after: SESSIONS_RETRY_AFTER,
            });
        }
        *n += 1;
        Ok(Counted(Some(owner.clone())))
    }

    /// A session of `owner` is gone.
    fn uncount_session(&self, owner: &Option<String>) {
        if let Some(n) = lock(&self.inner.owned).get_mut(owner) {
            *n = n.saturating_sub(1);
        }
    }

    fn persist(&self, session: &Session) {
        let record = session.record();
        let ticket = self.inner.store.put_session(SessionRow {
            id: session.id.to_string(),
            owner: session.owner.clone(),
            created_at: session.created_at.clone(),
            record: serde_json::to_string(&record).unwrap_or_default(),
        });
        let mut st = session.lock();
        st.record_written = st.record_written.max(ticket);
    }

    /// Validate overrides against the agent and apply them to a record.
    fn apply_update(
        &self,
        agent: &AgentConfig,
        record: &mut SessionRecord,
        update: SessionUpdate,
    ) -> Result<(), EngineError> {
        let host = self.inner.tools.tools();
        if let Some(tools) = &update.tools {
            let exposed = catalog::exposed(agent, &host);
            let mut seen = std::collections::HashSet::new();
            for g in tools {
                if !exposed.iter().any(|t| t.spec.name == g.name) {
                    let names: Vec<&str> = exposed.iter().map(|t| t.spec.name.as_str()).collect();
                    return Err(EngineError::Invalid(format!(
                        "agent.tools names {:?}, which agent {:?} does not expose; GET /meta lists its tools: [{}]",
                        g.name, agent.name, names.join(", ")
                    )));
                }
                if !seen.insert(g.name.as_str()) {
                    return Err(EngineError::Invalid(format!(
                        "agent.tools names {:?} twice; name each tool once",
                        g.name
                    )));
                }
            }
        }
        if let Some(options) = &update.options {
            for (k, v) in options {
                validate_option(agent, k, v)?;
            }
        }
        if let Some(client_tools) = &update.client_tools {
            let mut seen = std::collections::HashSet::new();
            for t in client_tools {
                if t.name.is_empty() {
                    return Err(EngineError::Invalid(
                        "a client tool has an empty name".into(),
                    ));
                }
                if !seen.insert(t.name.as_str()) {
                    return Err(EngineError::Invalid(format!(
                        "client tool {:?} is declared twice; tool names must be unique",
                        t.name
                    )));
                }
                if catalog::agent_tool_names(agent, &host).any(|n| n == t.name) {
                    return Err(EngineError::Invalid(format!(
                        "client tool {:?} has the name of one of agent {:?}'s tools; tool names must be unique across the client's and the agent's tools: rename the client tool",
                        t.name, agent.name
                    )));
                }
                if !t.parameters.is_object() {
                    return Err(EngineError::Invalid(format!(
                        "client tool {:?}: parameters must be a JSON Schema object",
                        t.name
                    )));
                }
            }
        }
        if let Some(tools) = update.tools {
            record.tools = Some(tools);
        }
        if let Some(options) = update.options {
            record.options.extend(options);
        }
        if let Some(client_tools) = update.client_tools {
            record.client_tools = client_tools;
        }
        Ok(())
    }

    /// A session in memory, loaded from the store on first use.
    async fn load(&self, id: &str) -> Result<Option<Arc<Session>>, EngineError> {
        if let Some(s) = self.cached(id) {
            return Ok(Some(s));
        }
        let Some(row) = self.inner.store.session(id).await? else {
            return Ok(None);
        };
        let record: SessionRecord = serde_json::from_str(&row.record)
            .map_err(|e| StoreError::Corrupt(format!("session {id}: {e}")))?;
        let events = self.inner.store.events(id, 0, usize::MAX >> 1).await?;
        let session = Arc::new(Session::restore(
            row.id,
            row.owner,
            row.created_at,
            record,
            events,
        ));
        Ok(Some(self.cache(id, session)))
    }

    /// Keeps `session` in memory (or the one already there: another request may have loaded it
    /// meanwhile). Past `[server] session_cache` sessions, drops the least recently used of
    /// those at rest, down to nine tenths of it (so that a sweep comes once in many sessions):
    /// nobody holds one (taking one goes through the map's lock, held here) and it holds nothing
    /// that is not in the log, so it is read back as it was when next used.
    fn cache(&self, id: &str, session: Arc<Session>) -> Arc<Session> {
        let mut map = lock(&self.inner.sessions);
        let kept = self.taken(map.entry(id.to_string()).or_insert(session));
        let bound = self.inner.config.server.session_cache;
        if map.len() > bound {
            let committed = self.inner.store.committed();
            let mut idle: Vec<(u64, String)> = map
                .iter()
                .filter(|(_, s)| Arc::strong_count(s) == 1 && s.at_rest(committed))
                .map(|(id, s)| (s.used.load(Ordering::Relaxed), id.clone()))
                .collect();
            let excess = map.len() - bound * 9 / 10;
            if idle.len() > excess {
                idle.select_nth_unstable(excess);
                idle.truncate(excess);
            }
            for (_, id) in idle {
                map.remove(&id);
            }
        }
        kept
    }

    /// A session taken from the cache: marked as just used.
    fn taken(&self, s: &Arc<Session>) -> Arc<Session> {
        let tick = self.inner.tick.fetch_add(1, Ordering::Relaxed);
        s.used.store(tick, Ordering::Relaxed);
        s.clone()
    }

    /// For `GET /metrics`: the sessions in memory, and the tool calls among them that wait for
    /// a client's permission.
    pub fn gauges(&self) -> (usize, usize) {
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        let waiting = |s: &Arc<Session>| {
            let st = s.lock();
            let asked =
                |p: &&session::Pending| p.kind == session::PendingKind::Permission && !p.expired;
            st.pending.iter().filter(asked).count()
        };
        (sessions.len(), sessions.iter().map(waiting).sum())
    }

    /// How many sessions are in memory, and whether `id` is one of them (the rest are in the log
    /// only: see `[server] session_cache`).
    pub fn in_memory(&self, id: &str) -> (usize, bool) {
        let map = lock(&self.inner.sessions);
        (map.len(), map.contains_key(id))
    }

    fn cached(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.inner.sessions).get(id).map(|s| self.taken(s))
    }

    /// A session this owner may see.
    pub async fn session(
        &self,
        owner: Option<&str>,
        id: &str,
    ) -> Result<Arc<Session>, EngineError> {
        let not_found = || EngineError::NotFound {
            what: "session",
            id: id.to_string(),
        };
        if !ids::is_valid("sess", id) {
            return Err(not_found());
        }
        match self.load(id).await? {
            Some(s) if s.owner.as_deref() == owner && !s.lock().deleted => {
                // Expired permissions are applied by every request that takes the session.
                approvals::settle(&self.inner, &s);
                Ok(s)
            }
            _ => Err(not_found()),
        }
    }

    /// A page of this owner's sessions in creation order, and the cursor of the next page.
    ///
    /// Read from the sessions table, never from a session's log: a session in memory shows its
    /// live status; one that is not is at rest (idle, or awaiting the client when its last
    /// event says its turn stopped for tools: one point read). Seeds are left out of the
    /// records (the listing does not show them), and nothing is loaded into memory.
    pub async fn list_sessions(
        &self,
        owner: Option<&str>,
        after: Option<&str>,
    ) -> Result<(Vec<SessionView>, Option<String>), EngineError> {
        let rows = self
            .inner
            .store
            .list_sessions(
                owner.map(String::from),
                after.map(String::from),
                PAGE_SIZE + 1,
            )
            .await?;
        let more = rows.len() > PAGE_SIZE;
        let mut out = Vec::with_capacity(rows.len().min(PAGE_SIZE));
        // Sessions not in memory, by index in `out`: their status is read from the log.
        let mut at_rest: Vec<(usize, String)> = Vec::new();
        for row in rows.into_iter().take(PAGE_SIZE) {
            let live = lock(&self.inner.sessions).get(&row.id).cloned();
            if let Some(s) = live {
                if !s.lock().deleted {
                    let mut v = view_without_seed(&s);
                    v.pending.clear();
                    out.push(v);
                }
                continue;
            }
            let record: ListedRecord = serde_json::from_str(&row.record)
                .map_err(|e| StoreError::Corrupt(format!("session {}: {e}", row.id)))?;
            at_rest.push((out.len(), row.id.clone()));
            out.push(SessionView {
                id: row.id,
                created_at: row.created_at,
                record: SessionRecord {
                    agent: record.agent,
                    tools: record.tools,
                    options: record.options,
                    client_tools: record.client_tools,
                    seed: Vec::new(),
                    asked: Vec::new(),
                },
                status: Status::Idle,
                running_turn: None,
                pending: Vec::new(),
                queued: Vec::new(),
                pending_plan: None,
            });
        }
        if !at_rest.is_empty() {
            let ids = at_rest.iter().map(|(_, id)| id.clone()).collect();
            let awaiting = self.inner.store.awaiting_client(ids).await?;
            for ((i, _), awaiting) in at_rest.iter().zip(awaiting) {
                if awaiting {
                    out[*i].status = Status::AwaitingClient;
                }
            }
        }
        let next = if more {
            out.last().map(|v| v.id.clone())
        } else {
            None
        };
        Ok((out, next))
    }

    /// A consistent view of a session.
    pub fn view(&self, session: &Session) -> SessionView {
        view(session)
    }

    /// Delete a session, its log and its workspace. A running turn is cancelled first.
    pub async fn delete_session(&self, owner: Option<&str>, id: &str) -> Result<(), EngineError> {
        let session = self.session(owner, id).await?;
        let (running, first) = {
            let mut st = session.lock();
            let first = !st.deleted;
            st.deleted = true;
            st.close_feed();
            (st.running.clone(), first)
        };
        if let Some(control) = running {
            control.stop(StopCause::Cancelled);
        }
        // The session's files (attached, delivered), read while its log is still there.
        let files = match &self.inner.files {
            Some(_) => {
                self.inner.store.flush().await?;
                self.inner.store.session_file_ids(id).await?
            }
            None => vec![],
        };
        self.inner.store.delete_session(id);
        let committed = self.inner.store.flush().await;
        if committed.is_ok() && first {
            self.uncount_session(&session.owner);
        }
        // Only now: until the delete is committed, a reader that missed the (deleted) session in
        // memory would read it back from the log.
        lock(&self.inner.sessions).remove(id);
        committed?;
        self.inner.tools.session_closed(id).await;
        let workspace = self.inner.config.server.sandboxes.join(id);
        match tokio::fs::remove_dir_all(&workspace).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(session = %id, error = %e, "could not remove the session's workspace")
            }
        }
        if let Some(store) = &self.inner.files {
            // They go with it, unless another session's log names them.
            if let Err(e) = store
                .delete_unreferenced(session.owner.as_deref(), files)
                .await
            {
                tracing::warn!(session = %id, error = %e, "could not delete the session's files");
            }
        }
        Ok(())
    }

    /// Start a turn: validate the request against the session's state, apply its overrides and
    /// run the turn on its own task (or queue it behind the running one, when asked to).
    pub fn start_turn(
        &self,
        session: &Arc<Session>,
        req: TurnOrder,
    ) -> Result<TurnHandle, EngineError> {
        self.check_open()?;
        let drive = req.delivery.runner == Runner::Watcher;
        let config = &self.inner.config;
        let (tx, rx, overflow) = delivery::channel::channel();
        let mut st = session.lock();
        if st.deleted {
            return Err(EngineError::NotFound {
                what: "session",
                id: session.id.to_string(),
            });
        }
        if let Some(r) = &st.running {
            if req.when_busy == WhenBusy::Refuse {
                return Err(EngineError::Busy {
                    turn_id: r.turn_id.clone(),
                });
            }
        }
        approvals::settle_locked(&self.inner, session, &mut st, clock::now_ms());
        // A new message where no client can answer the open calls (`POST /messages`, a run)
        // goes on: its turn answers them first (see `Turn::body`). An AAP one is a 409.
        let goes_on = matches!(req.delivery.client, Client::Absent { .. })
            && matches!(req.input, TurnInput::User { .. });
        let answering = if goes_on {
            Vec::new()
        } else {
            let history = &st.history;
            approvals::check_answers(&st.pending, &req.input, &|| history.messages())?
        };
        let limits = &config.limits;
        let slot = if st.running.is_some() {
            let queued = st
                .queue
                .iter()
                .filter(|q| !q.control.token.is_cancelled())
                .count();
            if queued >= limits.queued_turns {
                return Err(EngineError::OverLimit {
                    kind: "too_many_queued_turns",
                    message: format!(
                        "this session already has {queued} turns queued behind the running one (limit: [limits] queued_turns in tools.toml); wait for one to finish or cancel some"
                    ),
                    server_wide: false,
                    retry_after: QUEUE_RETRY_AFTER,
                });
            }
            None
        } else {
            let slot = RunSlot::try_take(&self.inner.running_turns, limits.running_turns);
            if slot.is_none() {
                return Err(EngineError::OverLimit {
                    kind: "too_many_running_turns",
                    message: format!(
                        "the server is running {} turns, its limit (limit: [limits] running_turns in tools.toml); retry shortly",
                        limits.running_turns
                    ),
                    server_wide: true,
                    retry_after: RUNNING_RETRY_AFTER,
                });
            }
            slot
        };
        let agent = config.agent(&st.record.agent).ok_or_else(|| {
            EngineError::Conflict(format!(
                "the session's agent {:?} is no longer configured",
                st.record.agent
            ))
        })?;
        let changed = !is_empty_update(&req.update);
        let record = if changed {
            let mut record = (*st.record).clone();
            self.apply_update(agent, &mut record, req.update)?;
            Some(record)
        } else {
            None
        };
        if let TurnInput::Resume { .. } = &req.input {
            st.pending.clear();
        }
        // The session goes on: a plan that waited for a decision no longer does (a decision
        // took it before starting its turn).
        st.plan = None;
        if let Some(record) = record {
            st.record = Arc::new(record);
        }
        let control = session::TurnControl::new(ids::new("turn"));
        let job = turn::TurnJob {
            session: session.clone(),
            control: control.clone(),
            input: req.input,
            answering,
            sink: Some(tx),
            client: req.delivery.client,
            plan: req.plan,
            max_steps: req.max_steps,
            text: req.delivery.text,
            slot,
            parent: tracing::Span::current(),
        };
        crate::telemetry::note_turn(&control.turn_id);
        let run_now = if st.running.is_some() {
            st.queue.push_back(turn::Queued {
                control: control.clone(),
                job,
            });
            None
        } else {
            st.running = Some(control.clone());
            Some(job)
        };
        drop(st);
        if changed {
            self.persist(session);
            // A turn that runs now commits it with its first events; a queued one may wait.
            if run_now.is_none() {
                if let Err(e) = self.inner.store.commit() {
                    tracing::error!(session = %session.id, error = %e, "the session's new settings could not be stored");
                }
            }
        }
        let running = (drive && run_now.is_some()).then(|| self.inner.tracker.token());
        let driven = match run_now {
            Some(job) if drive => Some(self.inner.drive_turn(job)),
            Some(job) => {
                self.inner.spawn_turn(job);
                None
            }
            None => None,
        };
        Ok(TurnHandle {
            turn_id: control.turn_id.clone(),
            feed: rx,
            overflow,
            follow: None,
            engine: self.clone(),
            session: session.clone(),
            done: false,
            driven,
            running,
        })
    }

    /// Cancel one turn (running or queued) or, with no id, the running turn and every queued
    /// one. Idempotent: a turn that already ended is left alone. The ids it stopped.
    pub fn cancel(&self, session: &Arc<Session>, turn_id: Option<&str>) -> Vec<String> {
        let mut stopped = Vec::new();
        let next = {
            let mut st = session.lock();
            let wanted = |id: &str| turn_id.is_none_or(|t| t == id);
            for q in st.queue.iter() {
                if wanted(&q.control.turn_id) && !q.control.token.is_cancelled() {
                    q.control.stop(StopCause::Cancelled);
                    stopped.push(q.control.turn_id.clone());
                }
            }
            if let Some(r) = &st.running {
                if wanted(&r.turn_id) && !r.token.is_cancelled() {
                    r.stop(StopCause::Cancelled);
                    stopped.push(r.turn_id.clone());
                }
            }
            // Nothing running: cancelled queued turns are logged right away.
            turn::next_queued(session, &mut st, &self.inner.store)
        };
        if let Some(job) = next {
            self.inner.spawn_turn(job);
        }
        stopped
    }

    /// Confirm or reject the plan a run waits on (409 when none waits): the decision starts a
    /// new turn (queued behind the plan's turn if that is still ending) whose `user.message`
    /// carries it as a `plan_decision` block. Confirmed, the run goes on with tools; rejected, the
    /// model is asked for another plan. No client attends the decision's turn (see
    /// [`Client::Absent`] for `attend_at`). The decision's turn id.
    pub fn decide_plan(
        &self,
        session: &Arc<Session>,
        decision: PlanDecision,
        attend_at: &'static str,
    ) -> Result<String, EngineError> {
        let Some(plan) = session.lock().plan.take() else {
            return Err(EngineError::Conflict(
                "no plan is waiting for approval in this session; start a run with \"plan\": true first".into(),
            ));
        };
        let reject = matches!(decision, PlanDecision::Reject { .. });
        let input = TurnInput::User {
            content: serde_json::Value::Array(vec![decision.block()]),
            files: vec![],
            skills: vec![],
        };
        let req = TurnOrder {
            plan: reject,
            ..TurnOrder::unattended(input, attend_at)
        };
        match self.start_turn(session, req) {
            Ok(handle) => Ok(handle.turn_id.clone()),
            Err(e) => {
                let mut st = session.lock();
                if st.plan.is_none() && st.running.is_none() {
                    st.plan = Some(plan);
                }
                Err(e)
            }
        }
    }

    /// A session's events after `after` (an event id; `None` from the start), at most `limit`,
    /// and whether more follow.
    pub async fn events_after(
        &self,
        session: &Session,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Arc<crate::log::Event>>, bool), EngineError> {
        let after_seq = match after {
            None => 0,
            Some(id) => self.seq_of(session, id).await?,
        };
        self.events_after_seq(session, after_seq, limit).await
    }

    /// A session's events with `seq > after_seq`: the store's, then the current turn's events
    /// the store does not hold yet.
    pub async fn events_after_seq(
        &self,
        session: &Session,
        after_seq: u64,
        limit: usize,
    ) -> Result<(Vec<Arc<crate::log::Event>>, bool), EngineError> {
        let tail = session.tail();
        let mut out: Vec<Arc<crate::log::Event>> = self
            .inner
            .store
            .events(&session.id, after_seq, limit + 1)
            .await?
            .into_iter()
            .map(Arc::new)
            .collect();
        let last = out.last().map_or(after_seq, |e| e.seq);
        if out.len() <= limit {
            out.extend(tail.into_iter().filter(|e| e.seq > last));
        }
        let more = out.len() > limit;
        out.truncate(limit);
        Ok((out, more))
    }

    /// The position of an event id in a session's log; an unknown id is an error, never a
    /// silent restart from the beginning.
    pub async fn seq_of(&self, session: &Session, event_id: &str) -> Result<u64, EngineError> {
        if let Some(ev) = session.tail().iter().find(|e| e.id == event_id) {
            return Ok(ev.seq);
        }
        match self.inner.store.seq_of(&session.id, event_id).await? {
            Some(seq) => Ok(seq),
            None => Err(EngineError::Invalid(format!(
                "event {event_id} is not in session {}'s log; pass the id of an event you received, or omit the cursor to start from the beginning",
                session.id
            ))),
        }
    }

    /// Stop accepting turns, end running ones with `worker_shutdown`, wait for them (at most
    /// `grace`), and make everything durable.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner
            .shutting_down
            .store(true, std::sync::atomic::Ordering::Release);
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        for s in sessions {
            if let Some(control) = s.lock().running.clone() {
                control.stop(StopCause::Shutdown);
            }
        }
        self.inner.tracker.close();
        if tokio::time::timeout(grace, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("some turns did not end within the shutdown grace period");
        }
        self.inner.tools.shutdown().await;
        if let Err(e) = self.inner.store.flush().await {
            tracing::error!(error = %e, "final flush of the store failed");
        }
    }
}

fn is_empty_update(u: &SessionUpdate) -> bool {
    u.tools.is_none() && u.options.is_none() && u.client_tools.is_none()
}

fn agent_names(config: &Config) -> String {
    config
        .agents
        .iter()
        .map(|a| a.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The AAP options an agent offers: `thinking` always, `model` when `models` is set.
pub fn validate_option(agent: &AgentConfig, key: &str, value: &str) -> Result<(), EngineError> {
    match key {
        "thinking" if value == "on" || value == "off" => Ok(()),
        "thinking" => Err(EngineError::Invalid(format!(
            "option thinking must be \"on\" or \"off\", not {value:?}"
        ))),
        "model" if !agent.models.is_empty() => {
            if agent.models.iter().any(|m| m == value) {
                Ok(())
            } else {
                Err(EngineError::Invalid(format!(
                    "option model must be one of [{}], not {value:?}",
                    agent.models.join(", ")
                )))
            }
        }
        _ => Err(EngineError::Invalid(format!(
            "agent {:?} has no option {key:?}; GET /meta lists its options",
            agent.name
        ))),
    }
}

/// A session's record as `GET /sessions` shows it: without its seed (read past, not kept).
#[derive(serde::Deserialize)]
struct ListedRecord {
    agent: String,
    tools: Option<Vec<ToolGrant>>,
    #[serde(default)]
    options: BTreeMap<String, String>,
    #[serde(default)]
    client_tools: Vec<ToolSpec>,
}

/// [`view`] with the record's seed left out (a listing does not show it).
fn view_without_seed(session: &Session) -> SessionView {
    view_parts(session, false)
}

fn view(session: &Session) -> SessionView {
    view_parts(session, true)
}

/// A consistent view of a session; its record's seed only `with_seed`.
fn view_parts(session: &Session, with_seed: bool) -> SessionView {
    let st = session.lock();
    let running_turn = st.running.as_ref().map(|r| r.turn_id.clone());
    let status = if st.plan.is_some() {
        Status::PlanPendingApproval
    } else if running_turn.is_some() {
        Status::Running
    } else if !st.pending.is_empty() {
        Status::AwaitingClient
    } else {
        Status::Idle
    };
    SessionView {
        id: session.id.to_string(),
        created_at: session.created_at.clone(),
        record: if with_seed {
            (*st.record).clone()
        } else {
            let r = &st.record;
            SessionRecord {
                agent: r.agent.clone(),
                tools: r.tools.clone(),
                options: r.options.clone(),
                client_tools: r.client_tools.clone(),
                seed: Vec::new(),
                asked: Vec::new(),
            }
        },
        status,
        running_turn,
        pending: st.pending.clone(),
        queued: session::live_queue(&st),
        pending_plan: st.plan.as_ref().map(|p| p.plan.clone()),
    }
}
