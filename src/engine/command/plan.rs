//! The decision on a plan a run waits on, taken here.

use std::sync::Arc;

use crate::engine::engine_handle::Engine;
use crate::engine::session::Session;
use crate::engine::session_record::PlanDecision;
use crate::engine::turn_handle::TurnHandle;
use crate::engine::types::{EngineError, TurnInput, TurnOrder};

/// Decide the plan here (see [`Engine::decide_plan`]), under a turn id minted already, or
/// a new one (`from_inbox`: see `start_here`). The decision's turn.
pub(super) fn decide_here(
    engine: &Engine,
    session: &Arc<Session>,
    decision: PlanDecision,
    attend_at: &'static str,
    turn_id: Option<String>,
    from_inbox: bool,
) -> Result<TurnHandle, EngineError> {
    let Some(plan) = session.lock().take_plan() else {
        return Err(no_plan());
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
    match super::start::start_here(engine, session, req, turn_id, from_inbox) {
        Ok(handle) => Ok(handle),
        Err(e) => {
            let mut st = session.lock();
            if st.plan().is_none() && st.turns().running().is_none() {
                st.wait_on_plan(plan);
            }
            Err(e)
        }
    }
}

/// The answer to a plan decision where no plan waits.
pub(super) fn no_plan() -> EngineError {
    EngineError::Conflict(
        "no plan is waiting for approval in this session; start a run with \"plan\": true first"
            .into(),
    )
}
