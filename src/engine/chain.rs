//! What every message between sessions carries and is held to: its place in a chain (the hop
//! and chain limits of `session.agentToAgent`), its provenance, and the caller's idempotency key.
//! Send and spawn both go through these, so the limits and the replay are written once.

use serde_json::{Value, json};

use crate::access::caller::Caller;
use crate::access::{Access, ToolError};
use crate::config::Config;
use crate::keys::SessionKey;
use crate::store::IdempotencyHit;

/// Where a new message sits in its chain.
#[derive(Debug, Clone)]
pub struct Hop {
    pub chain_id: String,
    pub hop: i64,
}

/// Which of the chain limits a new message is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limits {
    /// `maxHops` only (a spawn: its child's messages count in the chain, not the spawn).
    Hops,
    /// `maxHops`, and `maxChainMessages` for a message sent from inside a run.
    HopsAndMessages,
}

/// The next hop of the caller's chain (a new chain at hop 0 outside a run), refused when it
/// would pass the configured limits.
pub fn next_hop(access: &Access, caller: &Caller, limits: Limits) -> Result<Hop, ToolError> {
    let next = match &caller.run {
        Some(run) => Hop { chain_id: run.chain_id.clone().unwrap_or_else(|| run.run_id.clone()), hop: run.hop + 1 },
        None => Hop { chain_id: uuid::Uuid::new_v4().to_string(), hop: 0 },
    };
    let a2a = &access.config().session.agent_to_agent;
    if next.hop > i64::from(a2a.max_hops) {
        return Err(ToolError::forbidden(format!(
            "chain limit reached: maxHops={} (session.agentToAgent.maxHops)",
            a2a.max_hops
        )));
    }
    if limits == Limits::HopsAndMessages
        && caller.run.is_some()
        && chain_is_full(access.config(), access.chain_messages(&next.chain_id)?)
    {
        return Err(ToolError::forbidden(format!(
            "chain limit reached: maxChainMessages={} (session.agentToAgent.maxChainMessages)",
            a2a.max_chain_messages
        )));
    }
    Ok(next)
}

/// Whether a chain that carried `messages` has reached `session.agentToAgent.maxChainMessages`:
/// no new message from inside a run, and no further step.
pub fn chain_is_full(config: &Config, messages: i64) -> bool {
    messages >= i64::from(config.session.agent_to_agent.max_chain_messages)
}

/// The earlier call made with this idempotency key, when there is one: the same arguments
/// re-attach to it, other arguments are refused.
pub fn replay(
    access: &Access,
    caller: &Caller,
    key: Option<&str>,
    args_hash: &str,
    what: &str,
) -> Result<Option<IdempotencyHit>, ToolError> {
    let Some(key) = key else { return Ok(None) };
    let Some(hit) = access.idempotency(&caller.key, key)? else { return Ok(None) };
    same_arguments(hit, key, args_hash, what).map(Some)
}

/// `hit`, a use of idempotency key `key`, if it had the arguments hashed to `args_hash`.
pub fn same_arguments(
    hit: IdempotencyHit,
    key: &str,
    args_hash: &str,
    what: &str,
) -> Result<IdempotencyHit, ToolError> {
    if hit.args_hash != args_hash {
        return Err(ToolError::invalid(format!(
            "idempotencyKey {key:?} reused with different arguments; use a new key for a new {what}"
        )));
    }
    Ok(hit)
}

/// The tool (or step) a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceTool {
    SessionsSend,
    SessionsSpawn,
    SubagentAnnounce,
    Inject,
    Subagents,
    /// A question or approval a run asked, and its answer when no session gave it.
    InputRequest,
    /// A user's message on a channel, posted by the channel's bridge.
    ChannelBridge,
    /// A message from an A2A peer (`SendMessage`, docs/A2A.md).
    A2a,
}

impl SourceTool {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceTool::SessionsSend => "sessions_send",
            SourceTool::SessionsSpawn => "sessions_spawn",
            SourceTool::SubagentAnnounce => "subagent_announce",
            SourceTool::Inject => "inject",
            SourceTool::Subagents => "subagents",
            SourceTool::InputRequest => "input_request",
            SourceTool::ChannelBridge => "channel_bridge",
            SourceTool::A2a => "a2a",
        }
    }
}

/// Who wrote a message on a channel, as its bridge says (data, never authority: it decides no
/// permission, it is only recorded and shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelUser {
    pub channel: String,
    pub sender_id: String,
    pub sender_name: Option<String>,
    pub thread_id: Option<String>,
    pub message_id: Option<String>,
}

/// Where a message or run input came from, as stored beside it and shown in histories.
#[derive(Debug, Clone)]
pub enum Provenance {
    /// From another session (a send, a reply step, a spawn's task, a child's announce).
    InterSession { from: Option<SessionKey>, channel: Option<String>, tool: SourceTool, chain: Option<String> },
    /// From a person: the operator (`sessions-mcp inject`), or a user on a channel (`user`).
    ExternalUser { tool: SourceTool, chain: Option<String>, user: Option<ChannelUser> },
    /// From the server itself (a child's Notes step).
    InternalSystem { tool: SourceTool, chain: Option<String> },
}

impl Provenance {
    /// The stored shape (its keys are read back by the agent's context and by histories).
    pub fn to_json(&self) -> Value {
        match self {
            Provenance::InterSession { from, channel, tool, chain } => json!({
                "kind": "inter_session", "sourceSessionKey": from.as_ref().map(SessionKey::as_str),
                "sourceChannel": channel, "sourceTool": tool.as_str(), "chainId": chain,
            }),
            Provenance::ExternalUser { tool, chain, user } => {
                let mut out = json!({"kind": "external_user", "sourceTool": tool.as_str(), "chainId": chain});
                if let Some(u) = user {
                    out["sourceChannel"] = json!(u.channel);
                    out["senderId"] = json!(u.sender_id);
                    out["senderName"] = json!(u.sender_name);
                    out["threadId"] = json!(u.thread_id);
                    out["messageId"] = json!(u.message_id);
                }
                out
            }
            Provenance::InternalSystem { tool, chain } => {
                json!({"kind": "internal_system", "sourceTool": tool.as_str(), "chainId": chain})
            }
        }
    }

    /// A message from session `from` on `channel`.
    pub fn from_session(from: &SessionKey, channel: impl Into<String>, tool: SourceTool, chain: Option<&str>) -> Self {
        Provenance::InterSession {
            from: Some(from.clone()),
            channel: Some(channel.into()),
            tool,
            chain: chain.map(String::from),
        }
    }
}
