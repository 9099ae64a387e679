//! What a session waits on in memory besides its pending calls' answers (see
//! `engine/approvals.rs` for their expiry, `engine/client_questions.rs` for questions to the client).

/// What a session waits on besides its pending calls' answers (its state's `waits`): the
/// timer that expires them, and MCP calls waiting on questions to the client, which are only
/// in memory (a session with some is not at rest).
#[derive(Default)]
pub(crate) struct Waits {
    /// The timer that expires pending calls: its deadline (ms since the epoch) and task.
    pub(crate) timer: Option<(i64, tokio::task::AbortHandle)>,
    /// MCP calls waiting on their questions to the client (see `engine/client_questions.rs`).
    pub(crate) flight: Option<super::client_questions::Flight>,
}

impl Waits {
    /// Whether nothing waits only in memory (no calls wait on questions).
    pub(crate) fn idle(&self) -> bool {
        self.flight.is_none()
    }
}
