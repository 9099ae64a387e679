//! A turn's server tool calls: the granted calls of a resumed turn, and the calls the model makes
//! that run at once, in parallel (bounded), each result logged as it completes.

use std::collections::HashMap;

use futures_util::StreamExt;

use super::{End, Turn};
use crate::engine::record::Pending;
use crate::engine::types::{ClientResult, Permission};
use crate::message::ToolCall;
use crate::metrics::NotRun;
use crate::tools::{CallContext, ToolOutput};

/// How many server tool calls of one step run at once.
const TOOL_PARALLELISM: usize = 8;

impl Turn {
    /// A tool's result as the model may be given it: over `[limits] tool_result_bytes`, its
    /// first part and a note naming the workspace file that holds the whole (see `oversize.rs`).
    pub(super) async fn bounded(&self, call_id: &str, out: ToolOutput) -> ToolOutput {
        let workspace = self.inner.config.server.sandboxes.join(&*self.session.id);
        let limit = self.inner.config.limits.tool_result_bytes;
        crate::engine::oversize::bound(&workspace, call_id, out, limit).await
    }

    /// Log the result of every call the last turn stopped on: the client's results, the
    /// denials, and the granted calls run here.
    pub(super) async fn resume(
        &mut self,
        answering: Vec<Pending>,
        results: Vec<ClientResult>,
        permissions: Vec<Permission>,
    ) -> Result<(), End> {
        self.open = answering.iter().map(|p| p.call_id.clone()).collect();

        let mut results: HashMap<String, ClientResult> = results
            .into_iter()
            .map(|r| (r.call_id.clone(), r))
            .collect();
        let mut permissions: HashMap<String, Permission> = permissions
            .into_iter()
            .map(|p| (p.call_id.clone(), p))
            .collect();
        let record = self.session.record();
        let config = self.inner.config.clone();
        let host_tools = self.inner.tools.tools();
        let mut granted = Vec::new();
        for p in answering {
            if let Some(r) = results.remove(&p.call_id) {
                let out = ToolOutput {
                    content: r.content,
                    is_error: r.is_error,
                    files: vec![],
                };
                let out = self.bounded(&p.call_id, out).await;
                self.emit_result(&p.call_id, out);
            } else if p.expired {
                // Its permission expired before the client answered (a grant was refused).
                let text = crate::engine::approvals::expired_result();
                crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Expired);
                self.emit_result(&p.call_id, ToolOutput::error(text));
            } else if let Some(perm) = permissions.remove(&p.call_id) {
                if !perm.granted {
                    let text = match perm.reason.as_deref().map(str::trim) {
                        Some(reason) if !reason.is_empty() => format!("Tool call denied: {reason}"),
                        _ => "Tool call denied".to_string(),
                    };
                    crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Denied);
                    self.emit_result(&p.call_id, ToolOutput::error(text));
                    continue;
                }
                use crate::engine::approvals::{regrant, Regrant};
                let decided = match config.agent(&record.agent) {
                    Some(agent) => regrant(agent, &host_tools, &record, &p, &self.session.id),
                    None => Regrant::Refuse("The session's agent is gone.".into()),
                };
                match decided {
                    Regrant::Refuse(msg) => {
                        crate::metrics::tool(&*self.inner.tools, &p.name).not_run(NotRun::Refused);
                        self.emit_result(&p.call_id, ToolOutput::error(msg))
                    }
                    Regrant::Run => granted.push(p.call()),
                }
            }
        }
        self.run_tools(granted).await
    }

    /// Run server tool calls in parallel (bounded), logging each result as it completes.
    pub(super) async fn run_tools(&mut self, calls: Vec<ToolCall>) -> Result<(), End> {
        if calls.is_empty() {
            return Ok(());
        }
        let mut left = calls.len();
        let host = self.inner.tools.clone();
        let ctx = CallContext {
            session_id: self.session.id.to_string(),
            workspace: self.inner.config.server.sandboxes.join(&*self.session.id),
            owner: self.session.owner.clone(),
            elicitor: None,
            sampler: Some(self.sampler.clone()),
        };
        let ctx = &ctx;
        let listing = host.tools();
        let mut done = futures_util::stream::iter(calls)
            .map(|call| {
                let host = host.clone();
                let span = match listing.iter().find(|t| t.spec.name == call.name) {
                    Some(t) => {
                        let verdict = crate::telemetry::snake(&t.verdict);
                        crate::telemetry::tool_span(&t.server, &t.tool, &verdict)
                    }
                    None => crate::telemetry::tool_span("unknown", &call.name, "unknown"),
                };
                let call = async move {
                    let timer = crate::metrics::tool(&*host, &call.name).start();
                    let out = host.call(ctx, &call.name, call.input).await;
                    timer.done(out.is_error);
                    let outcome = if out.is_error { "error" } else { "ok" };
                    tracing::Span::current().record("outcome", tracing::field::display(outcome));
                    (call.id, out)
                };
                tracing::Instrument::instrument(call, span)
            })
            .buffer_unordered(TOOL_PARALLELISM);
        // What the turn said before the calls (its tool uses) is committed and published with
        // the first result if one comes before it is due (see `sync_due`), else then, while the
        // calls go on.
        let mut next = {
            let mut first = std::pin::pin!(done.next());
            match self.sync_due() {
                None => first.await,
                Some(due) => match tokio::time::timeout(due, first.as_mut()).await {
                    Ok(next) => next,
                    Err(_) => {
                        self.sync().await?;
                        first.await
                    }
                },
            }
        };
        while let Some((id, out)) = next {
            let out = self.bounded(&id, out).await;
            self.emit_result(&id, out);
            left -= 1;
            if left == 0 {
                // The last result goes out with the next commit, which comes at once: the next
                // model call's, or the terminal event's.
                break;
            }
            // Each result is published as its call completes.
            self.sync().await?;
            next = done.next().await;
        }
        Ok(())
    }
}
