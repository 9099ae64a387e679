//! What a session holds in memory, behind its one lock (`Session::lock`): its record, where its
//! log is, the history projection, the calls and the plan it waits on, its turns (running and
//! queued: [`TurnQueue`]) and its events on their way to subscribers. Its fields are its own:
//! the rest of the engine reads them, and changes them through what this type says.

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use super::client_questions::Flight;
use super::delivery::outbox::Outbox;
use super::history::Projector;
use super::replay::{starts_run, Logged, PlanWait};
use super::session_record::{Pending, SessionRecord};
use super::turn_job::Job;
use super::turn_queue::{Next, TurnQueue};
use super::types::{DeltaKind, Feed};
use super::waits::Waits;
use crate::log::{DeltaTap, Event, EventBody, RemoteDelta, Store};
use crate::{clock, ids};

pub(crate) struct State {
    /// Shared with readers (a turn reads it at every step); replaced, never changed in place.
    record: Arc<SessionRecord>,
    /// The seq of the last event appended.
    next_seq: u64,
    history: Projector,
    pending: Vec<Pending>,
    /// The running turn and the ones queued behind it.
    turns: TurnQueue,
    /// Events and deltas on their way to live subscribers (and the current turn's events).
    out: Outbox,
    plan: Option<PlanWait>,
    /// The seq of the first event of the session's current (or last) run: the `user.message`
    /// of its first turn (a plan decision's turn goes on its plan's run).
    run_start: u64,
    deleted: bool,
    /// A commit of this session's events failed: memory holds what the log does not, until the
    /// turn rebuilds it from the log (`Session::rebuild_locked`).
    diverged: bool,
    /// The store ticket of the session's last row write (its record).
    record_written: u64,
    waits: Waits,
}

impl State {
    /// A session's state with this record and what its log holds.
    pub(crate) fn new(record: SessionRecord, logged: Logged) -> State {
        State {
            record: Arc::new(record),
            next_seq: logged.next_seq,
            history: logged.history,
            pending: logged.pending,
            turns: TurnQueue::default(),
            out: Outbox::with_tail(logged.tail),
            plan: logged.plan,
            run_start: logged.run_start,
            deleted: false,
            diverged: false,
            record_written: 0,
            waits: Waits::default(),
        }
    }

    /// Whether the session holds nothing that is not in the log: no turn running or queued, no
    /// live subscriber, every event and record write committed (a plan waiting for approval is
    /// read back from the log). Such a session can be dropped from memory and read back as is.
    pub(crate) fn at_rest(&self, committed: u64) -> bool {
        self.turns.is_idle()
            && self.out.held.is_empty()
            && self.record_written <= committed
            && !self.out.watched()
            && self.waits.idle()
    }

    /// What the log holds, made the session's: history, last seq, last turn, pending calls,
    /// the plan waiting and the run's start.
    pub(crate) fn apply_logged(&mut self, logged: Logged) {
        self.history = logged.history;
        self.next_seq = logged.next_seq;
        self.out.tail = logged.tail;
        self.pending = logged.pending;
        self.plan = logged.plan;
        self.run_start = logged.run_start;
    }

    /// Append an event of `turn_id` to the session `session_id`'s log (queued for the store),
    /// folded into the history under the same lock. `None` when the session has been deleted.
    pub(crate) fn append(
        &mut self,
        store: &Store,
        session_id: &Arc<str>,
        turn_id: &str,
        body: EventBody,
    ) -> Option<Arc<Event>> {
        if self.deleted {
            return None;
        }
        // Deltas gathered so far go out before any other event.
        self.out.flush_deltas();
        self.next_seq += 1;
        let ev = Arc::new(Event::new(
            self.next_seq,
            ids::new("evt"),
            turn_id.to_string(),
            clock::now(),
            body,
        ));
        let ticket = store.append(session_id, &ev);
        self.history.apply_event(&ev);
        if starts_run(&ev.body) {
            self.run_start = ev.seq;
        }
        self.out.held.push((ticket, ev.clone()));
        Some(ev)
    }

    /// Publish, in order, the held events the store has committed; returns them.
    pub(crate) fn publish_durable(&mut self, store: &Store) -> Vec<Arc<Event>> {
        self.out.publish_durable(store, &mut self.diverged)
    }

    /// Whether a commit of the session's events failed (noted, or a held event whose commit
    /// failed).
    pub(crate) fn lost_writes(&self, store: &Store) -> bool {
        self.diverged
            || self
                .out
                .held
                .iter()
                .any(|(ticket, _)| store.failed(*ticket))
    }

    /// After a failed commit, the session made what `copy` (its log) holds: the record too if
    /// its write failed (`row`: the record as stored).
    pub(crate) fn reset_to(&mut self, store: &Store, row: Option<&str>, events: Vec<Event>) {
        if store.failed(self.record_written) {
            if let Some(record) = row.and_then(|r| serde_json::from_str(r).ok()) {
                self.record = Arc::new(record);
            }
            self.record_written = 0;
        }
        let logged = Logged::read(&self.record, events);
        self.apply_logged(logged);
        self.out.held.clear();
        self.diverged = false;
    }

    pub(crate) fn record(&self) -> &Arc<SessionRecord> {
        &self.record
    }

    /// The session's record replaced (its settings changed, or read back).
    pub(crate) fn set_record(&mut self, record: SessionRecord) {
        self.record = Arc::new(record);
    }

    /// The record was written to the store under `ticket`.
    pub(crate) fn record_stored(&mut self, ticket: u64) {
        self.record_written = self.record_written.max(ticket);
    }

    /// The seq of the last event appended.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub(crate) fn run_start(&self) -> u64 {
        self.run_start
    }

    pub(crate) fn history(&self) -> &Projector {
        &self.history
    }

    /// The calls the session waits on (their answers, their permissions).
    pub(crate) fn pending(&self) -> &[Pending] {
        &self.pending
    }

    /// The calls the session waits on, taken from it: it waits on none now (a new turn goes on
    /// without their answers, or they are stamped and settled).
    pub(crate) fn take_pending(&mut self) -> Vec<Pending> {
        std::mem::take(&mut self.pending)
    }

    /// The session waits on `calls` now, in place of what it waited on: the calls a turn
    /// stopped on, or calls taken to be stamped and put back.
    pub(crate) fn wait_on_calls(&mut self, calls: Vec<Pending>) {
        self.pending = calls;
    }

    /// The session waits on no call: a resumed turn answers or goes on without them.
    pub(crate) fn clear_pending(&mut self) {
        self.pending.clear();
    }

    /// The plan waiting for a decision.
    pub(crate) fn plan(&self) -> Option<&PlanWait> {
        self.plan.as_ref()
    }

    /// The plan waiting for a decision, taken: none waits now (a decision takes it before its
    /// turn starts, an interrupt ends its wait).
    pub(crate) fn take_plan(&mut self) -> Option<PlanWait> {
        self.plan.take()
    }

    /// `plan` waits for a decision now: a turn proposed it, or a decision that could not start
    /// its turn puts it back.
    pub(crate) fn wait_on_plan(&mut self, plan: PlanWait) {
        self.plan = Some(plan);
    }

    /// No plan waits for a decision any more: the session went on, the plan was decided, or
    /// its turn did not complete.
    pub(crate) fn drop_plan(&mut self) {
        self.plan = None;
    }

    pub(crate) fn turns(&self) -> &TurnQueue {
        &self.turns
    }

    /// Whether the running turn's terminal event is written (waiting for its commit, or for
    /// the turn to hand the session over).
    pub(crate) fn turn_ending(&self) -> bool {
        let Some(running) = self.turns.running() else {
            return false;
        };
        self.out
            .held
            .last()
            .is_some_and(|(_, e)| e.body.is_terminal() && *e.turn_id == *running.turn_id)
    }

    /// A turn admitted (see [`TurnQueue::push`]): returned when it runs now, else it waits
    /// behind the running one.
    pub(crate) fn queue_turn(&mut self, job: Job) -> Option<Job> {
        self.turns.push(job)
    }

    /// The running turn `turn_id` has ended (see [`TurnQueue::ended`]); the coalescer of
    /// streamed fragments goes with it, so nothing it gathered reaches the next turn.
    pub(crate) fn turn_ended(&mut self, turn_id: &str) {
        self.turns.ended(turn_id);
        self.out.coalescer = None;
    }

    /// When no turn runs, the next queued one (see [`TurnQueue::next`]): it runs now, or it
    /// was cancelled while it waited and is only to be logged.
    pub(crate) fn next_turn(&mut self) -> Option<Next> {
        self.turns.next()
    }

    pub(crate) fn out(&self) -> &Outbox {
        &self.out
    }

    /// A new subscription to the session's live feed (see [`Outbox::subscribe`]).
    pub(crate) fn subscribe(&mut self) -> broadcast::Receiver<Feed> {
        self.out.subscribe()
    }

    /// The session's deltas also go to `tap` (a shared store: the other instances watching
    /// it), or to no other instance (`None`).
    pub(crate) fn share_deltas(&mut self, tap: Option<DeltaTap>) {
        self.out.remote = tap;
    }

    /// A delta another instance streamed, to live subscribers that have seen exactly the
    /// events its writer had (see [`Outbox::publish_remote_delta`]): checked against the seq of
    /// the last event appended here. Whether it went out.
    pub(crate) fn publish_remote_delta(&mut self, d: &RemoteDelta) -> bool {
        self.out.publish_remote_delta(d, self.next_seq)
    }

    /// Publish events another instance committed (a shared store) to live subscribers, as if
    /// this one had. The tail is left as it is: it was just read from the log, which already
    /// holds them.
    pub(crate) fn publish_heard(&mut self, events: Vec<Arc<Event>>) {
        let tail = std::mem::take(&mut self.out.tail);
        for ev in events {
            self.out.publish_heard(ev);
        }
        self.out.tail = tail;
    }

    /// Add a streamed fragment to the turn's coalescer (see [`Outbox::push_fragment`]);
    /// whether the buffer now waits on its deadline.
    pub(crate) fn push_fragment(
        &mut self,
        turn_id: &Arc<str>,
        kind: DeltaKind,
        fragment: &str,
    ) -> bool {
        self.out.push_fragment(turn_id, kind, fragment)
    }

    /// Push the coalesced deltas if their time is up (see [`Outbox::flush_due`]); when the
    /// next push is due otherwise.
    pub(crate) fn flush_due(&mut self) -> Option<tokio::time::Instant> {
        self.out.flush_due()
    }

    pub(crate) fn waits(&self) -> &Waits {
        &self.waits
    }

    /// The timer that expires pending calls is now `task`, due at `due` (ms since the epoch),
    /// in place of any before it.
    pub(crate) fn arm_timer(&mut self, due: i64, task: AbortHandle) {
        self.waits.timer = Some((due, task));
    }

    /// The timer that expires pending calls has fired: none is armed now.
    pub(crate) fn timer_fired(&mut self) {
        self.waits.timer = None;
    }

    /// The MCP calls in flight on questions to the client, taken from the session: their
    /// questions are being answered, or settled without an answer.
    pub(crate) fn take_flight(&mut self) -> Option<Flight> {
        self.waits.flight.take()
    }

    /// The MCP calls in flight on questions to the client wait in the session now, a turn
    /// having stopped on those questions (`None`: none wait; any held before are dropped,
    /// which cancels them).
    pub(crate) fn hold_flight(&mut self, flight: Option<Flight>) {
        self.waits.flight = flight;
    }

    pub(crate) fn is_deleted(&self) -> bool {
        self.deleted
    }

    /// The session is deleted: nothing more is appended, its live feed closes. Whether it was
    /// not already.
    pub(crate) fn mark_deleted(&mut self) -> bool {
        let first = !self.deleted;
        self.deleted = true;
        self.out.close_feed();
        first
    }
}
