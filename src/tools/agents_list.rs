//! `agents_list`: the agent ids the caller may target with `sessions_spawn`.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{Ctx, OkStatus, Output, ToolError, ToolSpec};
use crate::policy::ToolName;

/// agents_list takes no arguments.
#[derive(JsonSchema)]
pub struct Params {}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentsListOk {
    pub status: OkStatus,
    /// The caller's agent id.
    pub requester: String,
    /// Whether the caller's allowlist is `*` (any configured agent).
    pub allow_any: bool,
    /// The caller's agent first, then the others it may spawn, sorted.
    pub agents: Vec<AgentInfo>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct AgentInfo {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Whether the id is in agents.list (an allowlist may name unconfigured ids).
    pub configured: bool,
}

pub fn spec() -> ToolSpec {
    ToolSpec::of::<Params, AgentsListOk>(
        ToolName::AgentsList,
        "Agents",
        "List the agent ids you can target with sessions_spawn (agentId), from your agent's \
         subagents.allowAgents allowlist. Your own agent is always first.",
        true,
    )
}

pub fn run(ctx: &Ctx, args: Option<Map<String, Value>>) -> Output<AgentsListOk> {
    list(ctx, args).into()
}

fn list(ctx: &Ctx, args: Option<Map<String, Value>>) -> Result<AgentsListOk, ToolError> {
    super::reader(ToolName::AgentsList, args)?.finish()?;
    let config = ctx.access.config();
    let (allow_any, ids) = crate::policy::spawnable(config, &ctx.caller.agent);
    let agents = ids
        .into_iter()
        .map(|id| {
            let entry = config.agent(&id);
            AgentInfo {
                name: entry.and_then(|e| e.name.as_deref()).map(str::trim).filter(|n| !n.is_empty()).map(String::from),
                configured: config.is_configured(&id),
                id: id.as_str().to_string(),
            }
        })
        .collect();
    Ok(AgentsListOk { status: OkStatus::Ok, requester: ctx.caller.agent.as_str().to_string(), allow_any, agents })
}
