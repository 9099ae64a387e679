//! Work that answers a request from a task of its own: a client that goes away drops the
//! connection's task, never the work (a turn runs to its end, a run deletes its session).

use std::future::Future;

use tokio::sync::oneshot;
use tracing::Instrument;

use super::{ApiError, Response};

/// Where detached work sends its answer; it may go on after sending.
pub(crate) type Reply = oneshot::Sender<Result<Response, ApiError>>;

/// Run `work` on a task of its own (in the request's span) and answer with what it sends over
/// its [`Reply`]. Work that ends without answering (a panic) is a 500 naming `what` ("the
/// turn", "the run").
pub(crate) async fn detached<F, Fut>(what: &'static str, work: F) -> Result<Response, ApiError>
where
    F: FnOnce(Reply) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (reply, response) = oneshot::channel();
    tokio::spawn(work(reply).in_current_span());
    response.await.unwrap_or_else(|_| {
        Err(ApiError::internal(format!(
            "{what}'s task ended before it answered; see the server log"
        )))
    })
}
