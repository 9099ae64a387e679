//! A connection's transport, with what must keep the server's order taken off it as it is read.
//!
//! rmcp handles each notification from the server on a task of its own, but completes a
//! request's response inline: a call's last progress notification, sent just before its
//! result, could reach the caller's relay after the call had returned (and be lost), and log
//! messages could overtake each other. Taken here, in the order the server sent them, neither
//! can happen: progress goes to its call's relay ([`crate::tools::relay`]), and a session's
//! instance's log messages to its catalog events (a shared server's are no one session's).

use rmcp::model::{JsonRpcMessage, JsonRpcNotification, ServerNotification};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::{IntoTransport, Transport};
use rmcp::RoleClient;

use super::catalog_events::{CatalogEvent, Events};
use crate::tools::relay::Relays;

pub(super) struct Ordered<T> {
    inner: T,
    relays: Relays,
    /// Where a session's instance's log messages go (`None`: a shared server's, kept).
    logs: Option<Events>,
}

/// `transport`, read in order as the module says.
pub(super) fn ordered<T, E, A>(
    transport: T,
    relays: Relays,
    logs: Option<Events>,
) -> Ordered<impl Transport<RoleClient, Error = E>>
where
    T: IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    Ordered {
        inner: transport.into_transport(),
        relays,
        logs,
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Ordered<T> {
    type Error = T::Error;

    /// What rmcp's errors call the transport (by default its Rust type, which is no one's
    /// business; see [`crate::tools::mcp::describe`]).
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("MCP connection")
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.inner.receive().await?;
        if let JsonRpcMessage::Notification(JsonRpcNotification { notification, .. }) = &message {
            match notification {
                ServerNotification::ProgressNotification(n) => {
                    self.relays.deliver(n.params.clone());
                }
                #[allow(deprecated)]
                ServerNotification::LoggingMessageNotification(n) => {
                    if let Some(logs) = &self.logs {
                        let _ = logs.send(CatalogEvent::Logged(n.params.clone()));
                    }
                }
                _ => {}
            }
        }
        Some(message)
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
