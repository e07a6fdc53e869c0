//! `sessions-mcp inject`: the owner's message into a session, starting a new chain (hop 0).

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::chain::{Provenance, SourceTool};
use crate::access::Access;
use crate::config::{Config, key_scope};
use crate::keys::{self, SessionKey};
use crate::store::{NewMessage, NewRun, NewSession, RunMode, Store};

/// Appends to an external session (returns None) or queues an `inject` run (returns its id).
/// The send policy gates it; the session is created (driven) when it does not exist.
pub fn start(
    store: &Store,
    config: &Arc<Config>,
    state_dir: &Path,
    key: &SessionKey,
    text: &str,
) -> Result<Option<String>, String> {
    let agent = key.agent_id(&config.default_agent());
    let row = store.session_by_key(key).map_err(|e| e.to_string())?;
    let decision = Access::new(store.clone(), config.clone()).send_decision(key, row.as_ref());
    if !decision.allowed() {
        return Err(decision.refusal(config.session.send_policy.as_ref()));
    }
    let external = row.as_ref().is_some_and(|r| r.external);
    if !external {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        crate::runner::resolve_runner(config, &agent, state_dir, &exe)?;
    }
    let chain = uuid::Uuid::new_v4().to_string();
    let provenance = Provenance::ExternalUser { tool: SourceTool::Inject, chain: Some(chain.clone()) }.to_json();
    let scope = key_scope(config, &agent);
    let run_id = uuid::Uuid::new_v4().to_string();
    store
        .write(|tx| -> Result<Option<String>, crate::store::StoreError> {
            tx.insert_session(&NewSession::new(key.clone(), agent.clone(), keys::kind_of(key, &scope, None), false))?;
            let id: i64 = tx.session_id(key)?;
            if external {
                let m = NewMessage {
                    role: "user".into(),
                    content: json!(text),
                    provenance: Some(provenance.clone()),
                    chain_id: Some(chain.clone()),
                    ..Default::default()
                };
                tx.append_message(id, &m)?;
                return Ok(None);
            }
            tx.enqueue(&NewRun {
                provenance: Some(provenance.clone()),
                chain_id: Some(chain.clone()),
                ..NewRun::new(run_id.clone(), id, RunMode::Inject, json!({"role": "user", "content": text}))
            })?;
            Ok(Some(run_id.clone()))
        })
        .map_err(|e| e.to_string())
}
