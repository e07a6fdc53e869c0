//! The access façade: the one place tools ask "may this caller see / reach that session?".
//!
//! It loads the facts (the caller, the target row, the target's spawn ancestry, the config) from
//! the store and hands them to the pure functions in `policy/`. Decisions about a target named by
//! key are made from the key and the caller's tree *before* existence is asked, so a session the
//! caller may not see gets the same answer whether or not it exists.

pub mod caller;
mod dashboard;
mod error;
mod list;
mod reads;
mod tree;

use std::sync::Arc;

use crate::access::caller::Caller;
use crate::config::key_scope;
use crate::config::{Config, PolicyAction, Visibility};
use crate::keys::{self, KeyScope, SessionKey, SessionRef};
use crate::policy::{
    self, Action, SendDecision, SendTarget, ToolName, VisibilityFacts, VisibilityRules, check_visibility,
};
use crate::store::{SendPolicyOverride, SessionState, Store};

/// The store's rows as the layers above read them: they reach them only through this façade.
pub use crate::store::{
    AnsweredVia, AskDecision, AskRow, HistoryPage, MessageRow, PendingInput, RunMode, RunRow, RunStatus, SessionRow,
};
pub use dashboard::{ViewRequest, Viewer};
pub use error::{ErrorStatus, ToolError};
pub use list::{ListPage, ListRequest, Transcript, transcript};
pub use reads::HistoryFrom;
pub use tree::{AnnounceState, Child, RunState};

/// A target the caller may see. `row` is `None` for a configured agent's main session that has
/// no message yet (it exists virtually).
#[derive(Debug, Clone)]
pub struct Target {
    pub key: SessionKey,
    pub display: String,
    pub row: Option<SessionRow>,
}

/// The façade every tool calls. Cheap to clone.
#[derive(Clone)]
pub struct Access {
    store: Store,
    config: Arc<Config>,
}

impl Access {
    pub fn new(store: Store, config: Arc<Config>) -> Self {
        Access { store, config }
    }

    /// The caller's key scope (computed once per caller).
    pub fn scope<'c>(&self, caller: &'c Caller) -> &'c KeyScope {
        caller.scope(&self.config)
    }

    pub fn rules(&self, caller: &Caller) -> VisibilityRules {
        VisibilityRules::for_caller(&self.config, caller.sandboxed)
    }

    /// The tools this caller is offered.
    pub fn tools_for(&self, caller: &Caller) -> Vec<ToolName> {
        policy::tools_for(caller.role, &self.config)
    }

    /// Refuses a tool the caller is not offered.
    pub fn check_tool(&self, caller: &Caller, tool: ToolName) -> Result<(), ToolError> {
        if self.tools_for(caller).contains(&tool) {
            Ok(())
        } else {
            let max_depth = self.config.agents.defaults.subagents.max_spawn_depth;
            let why = match caller.role {
                crate::policy::CallerRole::Subagent { depth }
                    if tool == ToolName::SessionsSpawn && depth >= max_depth =>
                {
                    format!(
                        "sessions_spawn is not available at depth {depth}: agents.defaults.subagents.maxSpawnDepth={max_depth} makes this sub-agent a leaf"
                    )
                }
                _ => format!(
                    "{} is not available to this sub-agent session; the operator can allow it with tools.subagents.tools.allow or alsoAllow",
                    tool.as_str()
                ),
            };
            Err(ToolError::forbidden(why))
        }
    }

    /// Refuses send/spawn for an operator acting (`--as`) as a session its agent drives.
    pub fn check_can_act(&self, caller: &Caller) -> Result<(), ToolError> {
        if caller.read_only {
            return Err(ToolError::forbidden(format!(
                "session {} is driven by its agent; --as may act only as an external or main session (list, history and agents_list still work)",
                caller.key
            )));
        }
        Ok(())
    }

    /// Is `target` inside the caller's spawn tree (the caller itself included)?
    fn in_tree(&self, caller: &Caller, target: &SessionKey) -> Result<bool, ToolError> {
        if *target == caller.key {
            return Ok(true);
        }
        Ok(self.store.is_ancestor(&caller.key, target)?)
    }

    fn visibility(&self, caller: &Caller, action: Action, key: &SessionKey) -> Result<(), ToolError> {
        let default_agent = self.config.default_agent();
        let target_agent = key.agent_id(&default_agent);
        let rules = self.rules(caller);
        // Tree membership decides under `tree`, and for another agent's session under `agent` and
        // `all` (a child spawned under another agent); skip the lookup where it cannot matter.
        let needs_tree = match rules.effective {
            Visibility::OwnSession => false,
            Visibility::Tree => true,
            Visibility::Agent | Visibility::All => target_agent != caller.agent,
        };
        let facts = VisibilityFacts {
            caller_key: &caller.key,
            caller_agent: &caller.agent,
            target_key: key,
            target_agent: &target_agent,
            target_in_tree: needs_tree && self.in_tree(caller, key)?,
        };
        check_visibility(action, &facts, &rules).map_err(|d| ToolError::forbidden(d.0))
    }

    /// Whether `row` is visible to the caller (used where rows are already loaded).
    pub fn row_visible(&self, caller: &Caller, row: &SessionRow) -> Result<bool, ToolError> {
        Ok(row.state != SessionState::Deleted && self.visibility(caller, Action::List, &row.key).is_ok())
    }

    /// Parses what the caller typed into a key or sessionId candidate.
    pub fn parse_ref(&self, caller: &Caller, field: &str, raw: &str) -> Result<SessionRef, ToolError> {
        keys::parse_ref(raw, self.scope(caller)).map_err(|e| ToolError::invalid(format!("{field} {raw:?} {e}")))
    }

    /// Resolves a caller's reference (key or sessionId) to a visible target.
    pub fn resolve(&self, caller: &Caller, action: Action, field: &str, raw: &str) -> Result<Target, ToolError> {
        self.resolve_ref(caller, action, self.parse_ref(caller, field, raw)?)
    }

    /// Resolves a reference the tool already parsed (it validated the argument first).
    pub fn resolve_ref(&self, caller: &Caller, action: Action, reference: SessionRef) -> Result<Target, ToolError> {
        match reference {
            SessionRef::Key(key) => self.resolve_key(caller, action, key),
            SessionRef::SessionId(id) => self.resolve_session_id(caller, &id),
        }
    }

    fn resolve_key(&self, caller: &Caller, action: Action, key: SessionKey) -> Result<Target, ToolError> {
        self.visibility(caller, action, &key)?;
        let scope = self.scope(caller);
        let display = scope.display(&key);
        match self.store.session_by_key(&key)? {
            Some(row) if row.state != SessionState::Deleted || self.requester_may_still_read(caller, &row) => {
                Ok(Target { key, display, row: Some(row) })
            }
            _ if self.is_virtual_main(&key) => Ok(Target { key, display, row: None }),
            _ => Err(ToolError::not_found(format!(
                "Session not found: {display} (use sessions_list to see the sessions you can reach)"
            ))),
        }
    }

    /// A deleted child stays readable to its requester until `archiveAfterMinutes` after its
    /// announce (≤ 0: always).
    fn requester_may_still_read(&self, caller: &Caller, row: &SessionRow) -> bool {
        let minutes = self.config.agents.defaults.subagents.archive_after_minutes;
        let grace_ok =
            minutes <= 0.0 || row.deleted_at.is_some_and(|d| crate::store::now_ms() < d + (minutes * 60_000.0) as i64);
        row.spawned_by.as_ref() == Some(&caller.key) && grace_ok
    }

    /// Every configured agent's main session exists virtually before its first message.
    fn is_virtual_main(&self, key: &SessionKey) -> bool {
        let agent = key.agent_id(&self.config.default_agent());
        self.config.is_configured(&agent) && key_scope(&self.config, &agent).is_main(key)
    }

    fn resolve_session_id(&self, caller: &Caller, id: &str) -> Result<Target, ToolError> {
        let mut visible = Vec::new();
        for row in self.store.sessions_by_session_id(id)? {
            if self.row_visible(caller, &row)? {
                visible.push(row);
            }
        }
        self.the_one_visible(caller, visible, format!("no visible session with sessionId {id}"), |names| {
            format!("Multiple sessions found for sessionId: {id} ({names}); pass the sessionKey instead")
        })
    }

    /// Resolves a label among the sessions the caller may see (labels are not unique).
    pub fn resolve_label(
        &self,
        caller: &Caller,
        label: &str,
        agent: Option<&crate::keys::AgentId>,
    ) -> Result<Target, ToolError> {
        let mut visible = Vec::new();
        for row in self.store.sessions_by_label(label)? {
            if agent.is_none_or(|a| *a == row.agent_id) && self.row_visible(caller, &row)? {
                visible.push(row);
            }
        }
        self.the_one_visible(caller, visible, format!("no visible session with label {label}"), |names| {
            format!("label {label:?} matches several sessions you can see ({names}); pass sessionKey instead")
        })
    }

    /// The single visible match of a sessionId or label lookup: none is `not_found`, several are
    /// `invalid` (the message lists them, as the caller would name them).
    fn the_one_visible(
        &self,
        caller: &Caller,
        mut visible: Vec<SessionRow>,
        none: String,
        several: impl FnOnce(String) -> String,
    ) -> Result<Target, ToolError> {
        let scope = self.scope(caller);
        match visible.len() {
            0 => Err(ToolError::not_found(none)),
            1 => {
                let row = visible.remove(0);
                Ok(Target { key: row.key.clone(), display: scope.display(&row.key), row: Some(row) })
            }
            _ => {
                let names = visible.iter().map(|r| scope.display(&r.key)).collect::<Vec<_>>().join(", ");
                Err(ToolError::invalid(several(names)))
            }
        }
    }

    /// The send policy for a session (override, rules, default).
    pub fn send_decision(&self, key: &SessionKey, row: Option<&SessionRow>) -> SendDecision {
        let scope = key_scope(&self.config, &key.agent_id(&self.config.default_agent()));
        let stored_chat = row.and_then(|r| r.chat_type);
        let kind = row.map_or_else(|| keys::kind_of(key, &scope, stored_chat), |r| r.kind);
        let chat_type = keys::chat_type_of(key, stored_chat);
        let channel = keys::channel_of(
            key,
            kind,
            chat_type,
            row.and_then(|r| r.channel.as_deref()),
            row.and_then(|r| r.last_channel.as_deref()),
        );
        let over = row.and_then(|r| r.send_policy).map(|p| match p {
            SendPolicyOverride::Allow => PolicyAction::Allow,
            SendPolicyOverride::Deny => PolicyAction::Deny,
        });
        policy::resolve_send_policy(
            over,
            self.config.session.send_policy.as_ref(),
            &SendTarget { key, channel: &channel, chat_type },
        )
    }
}
