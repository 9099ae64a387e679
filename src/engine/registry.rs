//! The registry of sessions: loaded from the log on first use, cached in memory (the least
//! recently used dropped past `[server] session_cache`), counted per key (`[limits]
//! sessions_per_key`), listed, and deleted.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::approvals;
use super::engine_handle::Engine;
use super::session::Session;
use super::session_record::{Pending, PendingKind, SessionRecord, ToolGrant};
use super::types::{EngineError, Reach, SessionView, Status};
use crate::ids;
use crate::log::{Owners, StoreError};
use crate::message::ToolSpec;
use crate::sync::lock;

/// Sessions per page of `list_sessions`.
pub(super) const PAGE_SIZE: usize = 50;

/// `Retry-After` (seconds) of a key at its session quota: it must delete sessions first.
const SESSIONS_RETRY_AFTER: u64 = 60;
impl Engine {
    /// Count a new session of `owner` against `[limits] sessions_per_key` (429 past it). The
    /// count is read from the store on the owner's first new session, then kept in memory.
    pub(crate) async fn count_session(
        &self,
        owner: &Option<String>,
    ) -> Result<Counted, EngineError> {
        if !lock(&self.inner.owned).contains_key(owner) {
            let n = self.inner.store.count_sessions(owner.clone()).await?;
            // A create that raced this one made the entry first: its count stands (it was
            // read before that create stored its session).
            lock(&self.inner.owned).entry(owner.clone()).or_insert(n);
        }
        let limit = self.inner.config().limits.sessions_per_key;
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
    pub(crate) fn uncount_session(&self, owner: &Option<String>) {
        if let Some(n) = lock(&self.inner.owned).get_mut(owner) {
            *n = n.saturating_sub(1);
        }
    }

    /// A session in memory, loaded from the store on first use.
    pub(crate) async fn load(&self, id: &str) -> Result<Option<Arc<Session>>, EngineError> {
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
    pub(crate) fn cache(&self, id: &str, session: Arc<Session>) -> Arc<Session> {
        session
            .lock()
            .share_deltas(self.inner.store.delta_tap(&session.id));
        let mut map = lock(&self.inner.sessions);
        let kept = self.taken(map.entry(id.to_string()).or_insert(session));
        let bound = self.inner.config().server.session_cache;
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

    fn cached(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.inner.sessions).get(id).map(|s| self.taken(s))
    }

    /// A session within `reach`.
    pub async fn session(&self, reach: Reach<'_>, id: &str) -> Result<Arc<Session>, EngineError> {
        let not_found = || EngineError::NotFound {
            what: "session",
            id: id.to_string(),
        };
        if !ids::is_valid("sess", id) {
            return Err(not_found());
        }
        match self.load(id).await? {
            Some(s) if reach.includes(s.owner.as_deref()) && !s.lock().is_deleted() => {
                // Expired permissions are applied by every request that takes the session.
                approvals::settle(&self.inner, &s).await;
                Ok(s)
            }
            _ => Err(not_found()),
        }
    }

    /// [`Engine::session`] as the log holds it now, for a request that reads it (its view, its
    /// history). On a shared store, an instance that does not hold the session's lease may not
    /// have heard yet what another instance committed (or deleted) a moment ago: two point
    /// reads at once (the session's row, the log past its end here), and the session read back
    /// if the log has moved on, so that a client reads its own writes whichever instance it
    /// reaches.
    pub async fn session_now(
        &self,
        reach: Reach<'_>,
        id: &str,
    ) -> Result<Arc<Session>, EngineError> {
        let session = self.session(reach, id).await?;
        let store = &self.inner.store;
        if store.instance().is_none() || store.lease_mark(&session.id).is_some() {
            return Ok(session);
        }
        let seen = session.lock().next_seq();
        let (row, newer) = tokio::join!(
            store.session(&session.id),
            store.events(&session.id, seen, 1)
        );
        // (Deleted there: the read back marks it deleted here.)
        if row?.is_none() || !newer?.is_empty() {
            let _ = super::scaleout::read_back(&self.inner, &session, |_| ()).await;
        }
        if session.lock().is_deleted() {
            return Err(EngineError::NotFound {
                what: "session",
                id: id.to_string(),
            });
        }
        Ok(session)
    }

    /// A page of the sessions within `reach` in creation order, and the cursor of the next page.
    ///
    /// Read from the sessions table, never from a session's log: a session in memory shows its
    /// live status; one that is not is at rest (idle, or awaiting the client when its last
    /// event says its turn stopped for tools: one point read). Seeds are left out of the
    /// records (the listing does not show them), and nothing is loaded into memory.
    pub async fn list_sessions(
        &self,
        reach: Reach<'_>,
        after: Option<&str>,
    ) -> Result<(Vec<SessionView>, Option<String>), EngineError> {
        let rows = self
            .inner
            .store
            .list_sessions(
                match reach {
                    Reach::Owner(owner) => Owners::One(owner.map(String::from)),
                    Reach::Every => Owners::Every,
                },
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
                if !s.lock().is_deleted() {
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
                owner: row.owner,
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

    /// [`Engine::view`], with the turns queued for it on another instance (a shared store
    /// whose lease another holds: its queue is in the inbox, not here).
    pub async fn view_now(&self, session: &Session) -> SessionView {
        let mut v = view(session);
        let store = &self.inner.store;
        if v.queued.is_empty()
            && store.instance().is_some()
            && store.lease_mark(&session.id).is_none()
        {
            match store.queued_turns(&session.id).await {
                Ok(queued) => v.queued = queued,
                Err(e) => {
                    tracing::warn!(session = %session.id, error = %e, "could not read the turns queued elsewhere")
                }
            }
        }
        v
    }

    /// For `GET /metrics`: the sessions in memory, and the tool calls among them that wait for
    /// a client's permission.
    pub fn gauges(&self) -> (usize, usize) {
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        let waiting = |s: &Arc<Session>| {
            let st = s.lock();
            let asked = |p: &&Pending| p.kind == PendingKind::Permission && !p.expired;
            st.pending().iter().filter(asked).count()
        };
        (sessions.len(), sessions.iter().map(waiting).sum())
    }

    /// How many sessions are in memory, and whether `id` is one of them (the rest are in the log
    /// only: see `[server] session_cache`).
    pub fn in_memory(&self, id: &str) -> (usize, bool) {
        let map = lock(&self.inner.sessions);
        (map.len(), map.contains_key(id))
    }

    /// Turns running now, by agent (sessions in memory; a running turn keeps its session there).
    pub fn active_turns(&self) -> std::collections::BTreeMap<String, usize> {
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        let mut by_agent: std::collections::BTreeMap<String, usize> = self
            .inner
            .config()
            .agents
            .iter()
            .map(|a| (a.name.clone(), 0))
            .collect();
        for s in sessions {
            let st = s.lock();
            if st.turns().running().is_some() {
                *by_agent.entry(st.record().agent.clone()).or_default() += 1;
            }
        }
        by_agent
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

pub(crate) fn view(session: &Session) -> SessionView {
    view_parts(session, true)
}

/// A consistent view of a session; its record's seed only `with_seed`.
fn view_parts(session: &Session, with_seed: bool) -> SessionView {
    let st = session.lock();
    // A turn the log has open that does not run here runs on another instance (shared store).
    let running_turn = st.turns().running().map(|r| r.turn_id.clone()).or_else(|| {
        let last = st.out().tail.last()?;
        (!last.body.is_terminal()).then(|| last.turn_id.clone())
    });
    let status = if st.plan().is_some() {
        Status::PlanPendingApproval
    } else if running_turn.is_some() {
        Status::Running
    } else if !st.pending().is_empty() {
        Status::AwaitingClient
    } else {
        Status::Idle
    };
    SessionView {
        id: session.id.to_string(),
        owner: session.owner.clone(),
        created_at: session.created_at.clone(),
        record: if with_seed {
            st.record().as_ref().clone()
        } else {
            let r = st.record();
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
        pending: st.pending().to_vec(),
        queued: st.turns().live(),
        pending_plan: st.plan().map(|p| p.plan.clone()),
    }
}

/// A new session counted against its owner's quota; [`Counted::release`] if it is not made.
pub(crate) struct Counted(Option<Option<String>>);

impl Counted {
    pub(crate) fn release(&mut self, engine: &Engine) {
        if let Some(owner) = self.0.take() {
            engine.uncount_session(&owner);
        }
    }
}
