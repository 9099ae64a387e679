//! A stdio server's connection: its child process, written to on stdin and read on stdout
//! through [`LineLimit`] (a message over the size one may have ends its call with the reason
//! rather than being dropped silently). It does what rmcp's `TokioChildProcess` does, whose
//! stdout cannot be wrapped: closing it closes the child's stdin, then sends SIGTERM and then
//! SIGKILL, each after [`GRACE`]; dropping it kills the child (`kill_on_drop`).

use std::borrow::Cow;
use std::process::Stdio as Pipes;
use std::time::Duration;

use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::RoleClient;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

use super::line_limit::LineLimit;

/// How long a closing child is given to exit, after its stdin closes and after SIGTERM.
const GRACE: Duration = Duration::from_secs(3);

pub(super) struct Stdio {
    child: Option<Child>,
    transport: AsyncRwTransport<RoleClient, LineLimit<ChildStdout>, ChildStdin>,
}

/// Start `cmd` with its three streams piped: the connection, and the child's stderr.
pub(super) fn spawn(mut cmd: Command, server: &str) -> std::io::Result<(Stdio, ChildStderr)> {
    cmd.stdin(Pipes::piped())
        .stdout(Pipes::piped())
        .stderr(Pipes::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let taken = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (Some(stdin), Some(stdout), Some(stderr)) = taken else {
        return Err(std::io::Error::other("the child's pipes are missing"));
    };
    let transport = AsyncRwTransport::new_client(LineLimit::new(stdout, server), stdin);
    let stdio = Stdio {
        child: Some(child),
        transport,
    };
    Ok((stdio, stderr))
}

impl Stdio {
    /// The child's process id (while it runs).
    pub(super) fn id(&self) -> Option<u32> {
        self.child.as_ref()?.id()
    }

    /// Close stdin, then SIGTERM, then SIGKILL, each after [`GRACE`].
    async fn shut(&mut self) -> std::io::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        self.transport.close().await?;
        if tokio::time::timeout(GRACE, child.wait()).await.is_err() {
            if let Some(pid) = child.id() {
                // SAFETY: kill only sends a signal, to our own child (not yet reaped).
                unsafe {
                    libc::kill(pid as i32, libc::SIGTERM);
                }
            }
            if tokio::time::timeout(GRACE, child.wait()).await.is_err() {
                child.kill().await?;
            }
        }
        self.child = None;
        Ok(())
    }
}

impl Transport<RoleClient> for Stdio {
    type Error = std::io::Error;

    fn name() -> Cow<'static, str> {
        Cow::Borrowed("stdio")
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.transport.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl std::future::Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.transport.receive()
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.shut()
    }
}
