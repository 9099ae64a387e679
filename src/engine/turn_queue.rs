//! A session's turns: the one running and the ones queued behind it, in order. How a queued
//! message is handled lives here: admitted (the limits), pushed (run now or queued), cancelled
//! while it waits, taken when the running turn ends (a cancelled one only to be logged), and
//! what is live (a cancelled turn waits only to be logged).

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::turn_job::{Job, RunSlot, StopCause, TurnControl};
use super::types::EngineError;
use crate::config::LimitsConfig;

/// `Retry-After` (seconds) of a session whose queue is full: about a turn's length.
const QUEUE_RETRY_AFTER: u64 = 5;
/// `Retry-After` (seconds) of a server running all the turns it may.
const RUNNING_RETRY_AFTER: u64 = 2;

/// The running turn and the turns waiting for it to end.
#[derive(Default)]
pub(crate) struct TurnQueue {
    running: Option<Arc<TurnControl>>,
    /// Turns waiting for the running one to end, in order.
    queued: VecDeque<Job>,
}

/// What [`TurnQueue::next`] took.
pub(crate) enum Next {
    /// Runs now: the session's running turn.
    Run(Job),
    /// Cancelled while it waited: to be logged (`user.message` then `turn.cancelled`), never
    /// run.
    Unstarted(Job),
}

impl TurnQueue {
    /// The running turn.
    pub(crate) fn running(&self) -> Option<&Arc<TurnControl>> {
        self.running.as_ref()
    }

    /// Whether no turn runs or waits.
    pub(crate) fn is_idle(&self) -> bool {
        self.running.is_none() && self.queued.is_empty()
    }

    /// Whether the turn `turn_id` runs or waits here (a cancelled one waiting to be logged too).
    pub(crate) fn holds(&self, turn_id: &str) -> bool {
        self.running.as_ref().is_some_and(|r| r.turn_id == turn_id)
            || self.queued.iter().any(|q| q.control.turn_id == turn_id)
    }

    /// The turns still waiting behind the running one (a cancelled one waits only to be
    /// logged).
    pub(crate) fn live(&self) -> Vec<String> {
        self.live_queued()
            .map(|q| q.control.turn_id.clone())
            .collect()
    }

    fn live_queued(&self) -> impl Iterator<Item = &Job> {
        self.queued
            .iter()
            .filter(|q| !q.control.token.is_cancelled())
    }

    /// How many more turns may queue now under a limit of `max` (one more when none runs: it
    /// runs).
    pub(crate) fn room(&self, max: usize) -> usize {
        let idle = usize::from(self.running.is_none());
        (max + idle).saturating_sub(self.live_queued().count())
    }

    /// A place for a new turn: behind the running one (`[limits] queued_turns`), or among the
    /// running turns (`[limits] running_turns`, counted by `running_turns`). `None`: queued.
    pub(crate) fn place(
        &self,
        limits: &LimitsConfig,
        running_turns: &Arc<AtomicUsize>,
    ) -> Result<Option<RunSlot>, EngineError> {
        if self.running.is_some() {
            let queued = self.live_queued().count();
            if queued >= limits.queued_turns {
                return Err(queue_full(queued));
            }
            return Ok(None);
        }
        let slot = RunSlot::try_take(running_turns, limits.running_turns);
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
        Ok(slot)
    }

    /// A turn admitted: it runs now (returned) when none runs, else it waits behind the
    /// running one.
    pub(crate) fn push(&mut self, job: Job) -> Option<Job> {
        if self.running.is_some() {
            self.queued.push_back(job);
            return None;
        }
        self.running = Some(job.control.clone());
        Some(job)
    }

    /// Stop the turns `wanted` picks among the queued ones and, with `running_too`, the running
    /// one; turns stopped already are left alone. The ids stopped.
    pub(crate) fn cancel(&self, wanted: impl Fn(&str) -> bool, running_too: bool) -> Vec<String> {
        let mut stopped = Vec::new();
        for q in &self.queued {
            if wanted(&q.control.turn_id) && !q.control.token.is_cancelled() {
                q.control.stop(StopCause::Cancelled);
                stopped.push(q.control.turn_id.clone());
            }
        }
        if let Some(r) = &self.running {
            if running_too && wanted(&r.turn_id) && !r.token.is_cancelled() {
                r.stop(StopCause::Cancelled);
                stopped.push(r.turn_id.clone());
            }
        }
        stopped
    }

    /// Which of `ids` are queued turns that a row of the store's inbox stands for (see
    /// [`Job::row`]).
    pub(crate) fn queued_with_rows(&self, ids: &[String]) -> Vec<String> {
        self.queued
            .iter()
            .filter(|q| q.row && ids.contains(&q.control.turn_id))
            .map(|q| q.control.turn_id.clone())
            .collect()
    }

    /// The running turn `turn_id` has ended: the session runs none until [`TurnQueue::next`].
    pub(crate) fn ended(&mut self, turn_id: &str) {
        if self.running.as_ref().is_some_and(|r| r.turn_id == turn_id) {
            self.running = None;
        }
    }

    /// When no turn runs, the next queued one: it runs now, or it was cancelled while it
    /// waited (call again for the next). `None`: a turn runs, or none waits.
    pub(crate) fn next(&mut self) -> Option<Next> {
        if self.running.is_some() {
            return None;
        }
        let q = self.queued.pop_front()?;
        if q.control.token.is_cancelled() {
            return Some(Next::Unstarted(q));
        }
        self.running = Some(q.control.clone());
        Some(Next::Run(q))
    }
}

/// The answer to a turn that would queue behind `queued` others, the session's limit.
pub(crate) fn queue_full(queued: usize) -> EngineError {
    EngineError::OverLimit {
        kind: "too_many_queued_turns",
        message: format!(
            "this session already has {queued} turns queued behind the running one (limit: [limits] queued_turns in tools.toml); wait for one to finish or cancel some"
        ),
        server_wide: false,
        retry_after: QUEUE_RETRY_AFTER,
    }
}
