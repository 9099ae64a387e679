//! A session's making and ending: created with its settings validated against its agent,
//! deleted with its log, its workspace and its files.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::engine::engine_handle::Engine;
use crate::engine::registry::view;
use crate::engine::session::Session;
use crate::engine::session_record::{SessionRecord, ToolGrant};
use crate::engine::turn_job::StopCause;
use crate::engine::types::{
    AgentChoice, EngineError, NewSession, Reach, SessionUpdate, SessionView,
};
use crate::message::Message;
use crate::sync::lock;
use crate::{clock, ids};

/// A new session's agent, its tools (`None`: every permitted one) and its options.
type Chosen = (
    crate::engine::session_settings::AgentRef,
    Option<Vec<ToolGrant>>,
    BTreeMap<String, String>,
);

impl Engine {
    /// Create a session. It does not run the agent.
    pub async fn create_session(
        &self,
        owner: Option<String>,
        new: NewSession,
    ) -> Result<SessionView, EngineError> {
        self.check_open()?;
        let (agent, tools, options) = self.chosen_agent(owner.as_deref(), new.agent)?;
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
            &agent,
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

    /// The agent a new session of this owner id gets, as its principal sees it, with the
    /// session's tools and options: the one it chose, or without a choice the first agent the
    /// principal may use (`[keys.NAME] agents`; the file's first without keys) with every
    /// permitted tool.
    fn chosen_agent(
        &self,
        owner: Option<&str>,
        choice: Option<AgentChoice>,
    ) -> Result<Chosen, EngineError> {
        let config = &self.inner.config();
        Ok(match choice {
            Some(choice) => {
                let agent = self.agent_for(owner, &choice.name)?;
                // AAP: `agent.tools` omitted means every exposed server tool is disabled.
                (
                    agent,
                    Some(choice.tools.unwrap_or_default()),
                    choice.options,
                )
            }
            None => {
                let first = config.agents_of(owner).first().map(|a| a.name.clone());
                let first = first.unwrap_or_else(|| config.default_agent().name.clone());
                (self.agent_for(owner, &first)?, None, BTreeMap::new())
            }
        })
    }

    /// Delete a session, its log and its workspace. A running turn is cancelled first.
    pub async fn delete_session(&self, reach: Reach<'_>, id: &str) -> Result<(), EngineError> {
        let session = self.session(reach, id).await?;
        let (running, first) = {
            let mut st = session.lock();
            let first = st.mark_deleted();
            (st.turns().running().cloned(), first)
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
        let workspace = self.inner.config().server.sandboxes.join(id);
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
}
