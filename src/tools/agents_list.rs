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
    /// Said when no agent here does real work: only the built-in echo agent exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct AgentInfo {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Whether the id is in agents.list or was discovered (an allowlist may name unconfigured ids).
    pub configured: bool,
    /// Found on PATH when the server started (no agents.list entry of its own).
    pub discovered: bool,
    /// What it runs: a preset (claude, codex, gemini, echo), `command` (a runner block of its own), or
    /// `a2a` (a remote agent over A2A).
    pub runner: String,
    /// Whether it can start now: its program is installed, and its CLI does not say it is logged out.
    pub available: bool,
    /// Its CLI's version, as discovery read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Its CLI's login as the CLI says it without a model call: "logged in (how)", "not logged in:
    /// <what to run>", "unknown (why)"; absent until first asked (a minute's cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login: Option<String>,
    /// Why it is not available, or that it is the echo agent, which does no work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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
            let runner = crate::engine::agent_runner(config, &id, crate::engine::LoginCheck::Known);
            AgentInfo {
                name: entry.and_then(|e| e.name.as_deref()).map(str::trim).filter(|n| !n.is_empty()).map(String::from),
                configured: config.is_configured(&id),
                discovered: entry.is_some_and(|e| e.discovered.is_some()),
                id: id.as_str().to_string(),
                runner: runner.runner,
                available: runner.available,
                version: runner.version,
                login: runner.login,
                note: runner.note,
            }
        })
        .collect::<Vec<_>>();
    let only_echo = agents.iter().all(|a| a.runner == "echo");
    let note = only_echo.then(|| format!("Only the built-in echo agent exists here: {}", crate::engine::ECHO_WARNING));
    Ok(AgentsListOk { status: OkStatus::Ok, requester: ctx.caller.agent.as_str().to_string(), allow_any, agents, note })
}
