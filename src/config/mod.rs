//! Configuration: one JSON5 file with the reference's key paths.
//!
//! The types below cover every key path sessions-mcp implements; every default lives in
//! [`defaults`]. Loading (see [`load`]) classifies each key path of the file as ours (validated),
//! reference (accepted with one warning) or unknown (an error naming the nearest known key), then
//! deserialises what is ours. `schemas/config.json` is generated from these types.

mod paths;
mod presets;
pub mod remote;

pub use presets::RunnerPreset;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::keys::{AgentId, ChatType, KeyScope, SessionKey};

pub use paths::Classified;

/// Every default of the configuration, in one place.
pub mod defaults {
    pub const MAX_SPAWN_DEPTH: u32 = 1;
    pub const MAX_CHILDREN_PER_AGENT: u32 = 5;
    pub const MAX_CONCURRENT_CHILDREN: u32 = 8;
    pub const MAX_QUEUED_CHILDREN: u32 = 100;
    /// `threadBindings.idleHours`, as the reference's.
    pub const THREAD_IDLE_HOURS: f64 = 24.0;
    pub const SUBAGENT_RUN_TIMEOUT_SECONDS: u64 = 0;
    pub const ARCHIVE_AFTER_MINUTES: f64 = 60.0;
    pub const SWEEP_INTERVAL_SECONDS: u64 = 60;
    pub const APPROVAL_TIMEOUT_SECONDS: u64 = 600;
    pub const APPROVAL_MAX_OPEN_PER_RUN: u32 = 8;
    /// A decline or cancel of an elicitation faster than this came from the host, not a person.
    pub const APPROVAL_AUTO_ANSWER_MS: u64 = 1000;
    /// Hosts known to decline or cancel every elicitation without showing it (`clientInfo.name`).
    pub const APPROVAL_AUTO_ANSWERING_CLIENTS: &[&str] = &["codex-mcp-client"];
    pub const ANNOUNCE_STEP: bool = true;
    pub const MAIN_KEY: &str = crate::keys::DEFAULT_MAIN_KEY;
    pub const MAX_PING_PONG_TURNS: u32 = 5;
    pub const MAX_HOPS: u32 = 8;
    pub const MAX_CHAIN_MESSAGES: u32 = 64;
    pub const ATTACHMENTS_MAX_FILES: u32 = 50;
    pub const ATTACHMENTS_MAX_FILE_BYTES: u64 = 1024 * 1024;
    pub const ATTACHMENTS_MAX_TOTAL_BYTES: u64 = 5 * 1024 * 1024;
    pub const MAX_CONCURRENT_RUNS: u32 = 16;
    pub const DRAIN_SECONDS: u64 = 600;
    pub const START_TIMEOUT_SECONDS: u64 = 60;
    pub const HEADER_TIMEOUT_SECONDS: u64 = 10;
    pub const IDLE_TIMEOUT_SECONDS: u64 = 60;
    pub const MAX_CONNECTIONS: u32 = 256;
    /// A quarter of `MAX_CONNECTIONS`: one token can never hold the listener alone.
    pub const MAX_STREAMS_PER_CREDENTIAL: u32 = 64;
    /// Half of `MAX_CONNECTIONS`: one address can never hold the listener alone.
    pub const MAX_CONNECTIONS_PER_PEER: u32 = 128;
    pub const MAX_SUBSCRIPTIONS: u32 = 100;
    /// `channels.<name>.bridge.maxQueuedRuns`: a chat's burst waits, a flood is refused.
    pub const BRIDGE_MAX_QUEUED_RUNS: u32 = 10;
    /// `server.a2a.maxQueuedRuns`: one A2A peer's burst waits, a flood is refused.
    pub const A2A_MAX_QUEUED_RUNS: u32 = 10;
    /// Every major host shows an answer this size whole (Codex cuts above ~12,000 bytes).
    pub const MAX_RESULT_BYTES: usize = 10_000;
    /// Below 4 KiB one message and the answer's own fields no longer fit; above 1 MiB an answer
    /// is more than any model context should take in one call.
    pub const RESULT_BYTES_RANGE: std::ops::RangeInclusive<usize> = 4096..=1024 * 1024;
    pub const RUNNER_TIMEOUT_SECONDS: u64 = 900;
    pub const RUNNER_IDLE_TIMEOUT_SECONDS_JSONL: u64 = 300;
    pub const RUNNER_CANCEL_GRACE_SECONDS: u64 = 5;
    pub const RUNNER_MAX_STDOUT_BYTES: u64 = 16 * 1024 * 1024;
    pub const RUNNER_MAX_LINE_BYTES: u64 = 1024 * 1024;
    pub const RUNNER_MAX_CONCURRENT: u32 = 4;
    pub const RUNNER_CONTEXT_BUDGET_BYTES: u64 = 256 * 1024;
    pub const RUNNER_MAX_PROMPT_ARG_CHARS: u64 = 100_000;

    pub fn allowed_hosts() -> Vec<String> {
        ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec()
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    pub agents: AgentsConfig,
    pub session: SessionConfig,
    pub tools: ToolsConfig,
    pub runtime: RuntimeConfig,
    /// Per channel: the deliverer (`deliver`, argv), its thread support (`threads`,
    /// `threadBindings`) and the inbound bridge (`bridge`).
    pub channels: BTreeMap<String, ChannelConfig>,
    pub server: ServerConfig,
    pub security: SecurityConfig,
    pub store: StoreConfig,
}

/// Where the store lives: the SQLite file in the state directory unless `url` names a
/// PostgreSQL database (`SESSIONS_MCP_STORE_URL` overrides it, keeping the password out of
/// the file).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StoreConfig {
    /// postgres://USER:PASSWORD@HOST:PORT/DATABASE; unset: SQLite in the state directory.
    pub url: Option<String>,
}

impl StoreConfig {
    /// The PostgreSQL URL to serve from: the environment's, else the file's; None for SQLite.
    pub fn effective_url(&self) -> Option<String> {
        std::env::var("SESSIONS_MCP_STORE_URL").ok().or_else(|| self.url.clone()).filter(|u| !u.trim().is_empty())
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AgentsConfig {
    pub defaults: AgentDefaults,
    pub list: Vec<AgentEntry>,
    /// Whether the agent CLIs found on PATH at start become agents (docs/AGENTS.md, Discovery).
    pub discovery: Discovery,
    /// The agents discovery found (never read from the file): one per preset whose CLI is on
    /// PATH and whose id `list` does not configure.
    #[serde(skip)]
    #[schemars(skip)]
    pub discovered: Vec<AgentEntry>,
}

/// Where a spawned child works (docs/AGENTS.md, Workspaces).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceMode {
    /// `project` for an agent whose runner is a CLI preset, `isolated` for others.
    #[default]
    Auto,
    /// The requester's project: its MCP client's root, else the directory the serving process
    /// was started in.
    Project,
    /// A git worktree and branch of the requester's project of the child's own.
    Worktree,
    /// The agent's own workspace (`agents.list[].workspace`, else `<stateDir>/workspaces/<agent>`).
    Isolated,
}

/// A preset whose CLI discovery found: where, and the version it gave ("" for none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub preset: RunnerPreset,
    pub path: PathBuf,
    pub version: String,
}

/// `agents.discovery`: `path` (default) looks for the presets' CLIs on PATH at start; `off` makes
/// only the configured agents exist.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Discovery {
    #[default]
    Path,
    Off,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AgentDefaults {
    pub subagents: SubagentDefaults,
    pub model: ModelDefaults,
    pub sandbox: SandboxDefaults,
    pub runner: RunnerConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SubagentDefaults {
    /// How deep sub-agents may nest (1-5); 1 means a sub-agent cannot spawn.
    pub max_spawn_depth: u32,
    /// Unfinished (queued or running) children one requester may have.
    pub max_children_per_agent: u32,
    /// Child runs running at once, server-wide; more are queued.
    pub max_concurrent: u32,
    /// Queued child runs, server-wide; more are rejected.
    pub max_queued: u32,
    /// Default per-spawn run timeout (0 = only the runner's cap).
    pub run_timeout_seconds: u64,
    /// Archive kept children this long after their announce (fractional; <= 0 = never).
    pub archive_after_minutes: f64,
    pub sweep_interval_seconds: u64,
    /// Run one more turn in the child to write the announce's Notes.
    pub announce_step: bool,
    /// Where a child works: `auto` (the requester's project for the agent CLIs of presets, the
    /// agent's own workspace for others), `project` or `isolated`.
    pub workspace: WorkspaceMode,
    pub model: Option<String>,
    pub thinking: Option<String>,
    /// Questions and approvals a run asks (`input_request`): how long they wait, and rules that
    /// decide without asking.
    pub approvals: Approvals,
    /// The budget of a spawn that asks none (`agents.list[].subagents.budget` of the child's
    /// agent comes first). None: the child shares its requester's budget.
    pub budget: Option<Budget>,
    /// A spawn asking more than its requester has left: refused (default), or clamped to it.
    pub budget_overflow: BudgetOverflow,
    /// Spawn into an agent that cannot report usage (the `text` runner) even when a token or
    /// cost budget applies; its spend then counts as nothing.
    pub allow_unmetered: bool,
}

/// A budget: tokens (input plus output), cost in US dollars, runtime in seconds (the wall time of
/// its runs, added up). Each is optional; every one given must be positive.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_seconds: Option<f64>,
}

impl Budget {
    /// Every amount positive and finite, and at least one given; `path` names the object.
    pub fn validate(&self, path: &str) -> Result<(), String> {
        if self.tokens.is_none() && self.cost_usd.is_none() && self.runtime_seconds.is_none() {
            return Err(format!("{path} must give at least one of tokens, costUsd, runtimeSeconds"));
        }
        if self.tokens == Some(0) || self.tokens.is_some_and(|t| t > i64::MAX as u64) {
            return Err(format!(
                "{path}.tokens must be a whole number of tokens from 1 to {}, got {}",
                i64::MAX,
                self.tokens.unwrap_or(0)
            ));
        }
        for (field, value, least) in
            [("costUsd", self.cost_usd, 0.000_001), ("runtimeSeconds", self.runtime_seconds, 0.001)]
        {
            if let Some(v) = value.filter(|v| !v.is_finite() || *v < least || *v > 1e12) {
                return Err(format!("{path}.{field} must be a finite number from {least} to 1e12, got {v}"));
            }
        }
        Ok(())
    }
}

/// What a spawn that asks more budget than its requester has left gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BudgetOverflow {
    #[default]
    Refuse,
    Clamp,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Approvals {
    /// How long a request waits for an answer (at least 1).
    pub timeout_seconds: u64,
    /// What an unanswered request gets: deny (default) or allow.
    pub on_timeout: ApprovalDecision,
    /// How many requests one run may have open at once (at least 1); a further one is denied at
    /// once, with the reason, and put to no one.
    pub max_open_per_run: u32,
    /// Approvals decided without asking, first match wins: `{decision, tool?, agent?}` with globs
    /// (`*`) over the requested tool's name and the asking agent's id; a rule without `tool`
    /// matches every approval of its agents. A rule may give `modelMayAnswer` instead of a
    /// `decision`: the approvals it matches are asked, and that says who may answer them.
    /// Questions are always asked.
    pub rules: Vec<ApprovalRule>,
    /// Whether the requester's model may answer an approval no rule decided: `afterPerson`
    /// (default: only when no person can be reached — no host shows it, no operator watches —
    /// or the person's route declined it unseen, was dismissed, or passed `personTimeoutSeconds`),
    /// `always`, or `never`. Questions may always go to the model.
    pub model_may_answer: ModelMayAnswer,
    /// An operator watches the dashboard or `sessions-mcp ls --pending`: a person is reachable for
    /// every ask, so under `afterPerson` the model waits for them.
    pub operator_watches: bool,
    /// After this long unanswered by a person, under `afterPerson` the model may answer too (the
    /// person can still answer first). None: only `timeoutSeconds` ends the wait.
    pub person_timeout_seconds: Option<u64>,
    /// A decline or cancel of an elicitation that comes back faster than this (ms) came from the
    /// host, not a person who read it: no person is there, and the ask goes to the next route.
    pub auto_answer_ms: u64,
    /// Globs over the MCP client's name (`clientInfo.name`) of hosts that decline or cancel every
    /// elicitation without showing it: they are not asked, and count as no person reachable.
    pub auto_answering_clients: Vec<String>,
}

impl Default for Approvals {
    fn default() -> Self {
        Self {
            timeout_seconds: defaults::APPROVAL_TIMEOUT_SECONDS,
            on_timeout: ApprovalDecision::Deny,
            max_open_per_run: defaults::APPROVAL_MAX_OPEN_PER_RUN,
            rules: Vec::new(),
            model_may_answer: ModelMayAnswer::AfterPerson,
            operator_watches: false,
            person_timeout_seconds: None,
            auto_answer_ms: defaults::APPROVAL_AUTO_ANSWER_MS,
            auto_answering_clients: defaults::APPROVAL_AUTO_ANSWERING_CLIENTS.iter().map(|c| c.to_string()).collect(),
        }
    }
}

/// Whether the requester's model may answer an approval meant for a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ModelMayAnswer {
    /// Only once no person can be reached, or the person's route ended without an answer.
    AfterPerson,
    Always,
    /// Only a person (or a rule, or the timeout) answers.
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalDecision {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalRule {
    /// Decides the approvals it matches without asking anyone.
    pub decision: Option<ApprovalDecision>,
    /// Or: the approvals it matches are asked, and this says whether the model may answer them.
    pub model_may_answer: Option<ModelMayAnswer>,
    /// A glob over the tool's name (e.g. `Read`, `mcp__*__list*`).
    pub tool: Option<String>,
    /// A glob over the asking agent's id.
    pub agent: Option<String>,
}

impl Default for SubagentDefaults {
    fn default() -> Self {
        Self {
            max_spawn_depth: defaults::MAX_SPAWN_DEPTH,
            max_children_per_agent: defaults::MAX_CHILDREN_PER_AGENT,
            max_concurrent: defaults::MAX_CONCURRENT_CHILDREN,
            max_queued: defaults::MAX_QUEUED_CHILDREN,
            run_timeout_seconds: defaults::SUBAGENT_RUN_TIMEOUT_SECONDS,
            archive_after_minutes: defaults::ARCHIVE_AFTER_MINUTES,
            sweep_interval_seconds: defaults::SWEEP_INTERVAL_SECONDS,
            announce_step: defaults::ANNOUNCE_STEP,
            workspace: WorkspaceMode::Auto,
            model: None,
            thinking: None,
            approvals: Approvals::default(),
            budget: None,
            budget_overflow: BudgetOverflow::Refuse,
            allow_unmetered: false,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ModelDefaults {
    pub primary: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    #[default]
    Off,
    All,
    NonMain,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionToolsVisibility {
    #[default]
    Spawned,
    All,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SandboxDefaults {
    pub mode: SandboxMode,
    /// `spawned` clamps a sandboxed caller's visibility to at most `tree`.
    pub session_tools_visibility: SessionToolsVisibility,
}

/// One configured agent.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentEntry {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// What the agent is for, in words: its A2A card's description and skill (docs/A2A.md).
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub default: bool,
    #[serde(default)]
    pub workspace: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// Allowlist (and aliases) for the spawn `model` parameter.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    #[serde(default)]
    pub runner: Option<RunnerConfig>,
    #[serde(default)]
    pub sandbox: Option<AgentSandbox>,
    #[serde(default)]
    pub subagents: Option<AgentSubagents>,
    /// Set on an agent discovery made: the CLI's `--version` line (empty when it gave none).
    #[serde(skip)]
    #[schemars(skip)]
    pub discovered: Option<String>,
}

impl AgentEntry {
    /// An entry with only its id.
    pub fn bare(id: &str) -> AgentEntry {
        AgentEntry {
            id: id.to_string(),
            name: None,
            description: None,
            default: false,
            workspace: None,
            model: None,
            models: None,
            runner: None,
            sandbox: None,
            subagents: None,
            discovered: None,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AgentSandbox {
    pub mode: Option<SandboxMode>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AgentSubagents {
    /// Agent ids this agent may spawn (`*` = any configured agent). Default: only itself.
    pub allow_agents: Option<Vec<String>>,
    pub model: Option<String>,
    pub thinking: Option<String>,
    /// The budget of a spawn of this agent that asks none (over agents.defaults.subagents.budget).
    pub budget: Option<Budget>,
}

/// Runner settings (docs/RUNNER-PROTOCOL.md, Configuration). Every field is optional so that
/// `agents.list[].runner` overrides `agents.defaults.runner` field by field;
/// [`RunnerConfig::merged`] applies that.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RunnerConfig {
    /// The settings of an agent CLI people use (`claude`, `codex`, `gemini`, `echo`), under this block's
    /// own keys: every key set here overrides the preset's (docs/AGENTS.md, Presets).
    pub preset: Option<RunnerPreset>,
    pub kind: Option<RunnerKind>,
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub input: Option<PromptInput>,
    pub max_prompt_arg_chars: Option<u64>,
    pub resume_args: Option<Vec<String>>,
    pub session_arg: Option<String>,
    pub session_args: Option<Vec<String>>,
    pub session_mode: Option<SessionMode>,
    pub system_prompt_arg: Option<String>,
    pub system_prompt_when: Option<SystemPromptWhen>,
    pub model_arg: Option<String>,
    pub model_aliases: Option<BTreeMap<String, String>>,
    pub thinking_args: Option<Vec<String>>,
    pub thinking_map: Option<BTreeMap<String, Vec<String>>>,
    pub context: Option<ContextMode>,
    pub env: Option<RunnerEnv>,
    pub home: Option<HomeMode>,
    pub timeout_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    pub cancel_grace_seconds: Option<u64>,
    pub max_stdout_bytes: Option<u64>,
    pub max_line_bytes: Option<u64>,
    pub max_concurrent: Option<u32>,
    pub context_budget_bytes: Option<u64>,
    pub sandbox: Option<RunnerSandbox>,
    /// `kind: "a2a"`: the remote agent's card (docs/A2A.md). Only a configured URL is ever
    /// called: https, or http to a loopback host.
    pub card_url: Option<String>,
    /// `kind: "a2a"`: the environment variable holding the bearer token sent to the remote agent.
    pub token_env: Option<String>,
    /// `kind: "a2a"`: the card's skill the messages ask for (one of the card's skill ids).
    pub skill: Option<String>,
}

impl RunnerConfig {
    /// `self` (per agent) over `base` (agents.defaults.runner), field by field.
    pub fn merged(&self, base: &RunnerConfig) -> RunnerConfig {
        let a = serde_json::to_value(self).unwrap_or_default();
        let mut b = serde_json::to_value(base).unwrap_or_default();
        if let (Some(over), Some(out)) = (a.as_object(), b.as_object_mut()) {
            for (k, v) in over {
                if !v.is_null() {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
        serde_json::from_value(b).unwrap_or_default()
    }

    pub fn timeout_seconds(&self) -> u64 {
        self.timeout_seconds.unwrap_or(defaults::RUNNER_TIMEOUT_SECONDS)
    }

    pub fn max_concurrent(&self) -> u32 {
        self.max_concurrent.unwrap_or(defaults::RUNNER_MAX_CONCURRENT)
    }

    pub fn cancel_grace_seconds(&self) -> u64 {
        self.cancel_grace_seconds.unwrap_or(defaults::RUNNER_CANCEL_GRACE_SECONDS)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RunnerKind {
    Jsonl,
    ClaudeStreamJson,
    CodexExecJson,
    GeminiStreamJson,
    Text,
    /// A remote agent over A2A v1.0: no local process (docs/A2A.md).
    A2a,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PromptInput {
    Stdin,
    Arg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionMode {
    Always,
    Existing,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SystemPromptWhen {
    First,
    Always,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContextMode {
    Auto,
    Native,
    Replay,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HomeMode {
    Isolated,
    Inherit,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RunnerEnv {
    /// Environment variables passed through to the agent (everything else is cleared).
    pub passthrough: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxBackend {
    Off,
    Bwrap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxNetwork {
    None,
    Host,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceAccess {
    Ro,
    Rw,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RunnerSandbox {
    pub backend: Option<SandboxBackend>,
    pub network: Option<SandboxNetwork>,
    pub workspace: Option<WorkspaceAccess>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SessionScope {
    #[default]
    PerSender,
    Global,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SessionConfig {
    pub main_key: String,
    pub scope: SessionScope,
    pub send_policy: Option<SendPolicyConfig>,
    pub agent_to_agent: SessionAgentToAgent,
    /// The budget of every spawn tree's root (a session that was not spawned): its children's
    /// budgets are reserved from it. None: roots are unlimited.
    pub budget: Option<Budget>,
    /// Defaults of every channel's `threadBindings`.
    pub thread_bindings: Option<ThreadBindings>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            main_key: defaults::MAIN_KEY.to_string(),
            scope: SessionScope::default(),
            send_policy: None,
            agent_to_agent: SessionAgentToAgent::default(),
            budget: None,
            thread_bindings: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PolicyAction {
    Allow,
    Deny,
}

impl PolicyAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SendPolicyConfig {
    pub default: Option<PolicyAction>,
    pub rules: Vec<SendPolicyRule>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendPolicyRule {
    /// allow | deny (default allow, as in the reference).
    #[serde(default = "default_rule_action")]
    pub action: PolicyAction,
    #[serde(default)]
    pub r#match: RuleMatch,
}

fn default_rule_action() -> PolicyAction {
    PolicyAction::Allow
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuleMatch {
    pub channel: Option<String>,
    /// direct | group | channel (dm = direct).
    pub chat_type: Option<ChatTypeMatch>,
    pub key_prefix: Option<String>,
    pub raw_key_prefix: Option<String>,
}

/// A chat type in a rule; `dm` is accepted as `direct`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChatTypeMatch {
    Direct,
    #[serde(rename = "dm")]
    Dm,
    Group,
    Channel,
}

impl ChatTypeMatch {
    pub fn chat_type(self) -> ChatType {
        match self {
            Self::Direct | Self::Dm => ChatType::Direct,
            Self::Group => ChatType::Group,
            Self::Channel => ChatType::Channel,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SessionAgentToAgent {
    /// Reply-back turns after a send between two sessions (0-5).
    pub max_ping_pong_turns: u32,
    /// Agent-initiated sends/spawns in one chain.
    pub max_hops: u32,
    /// Messages appended anywhere on one chain.
    pub max_chain_messages: u32,
}

impl Default for SessionAgentToAgent {
    fn default() -> Self {
        Self {
            max_ping_pong_turns: defaults::MAX_PING_PONG_TURNS,
            max_hops: defaults::MAX_HOPS,
            max_chain_messages: defaults::MAX_CHAIN_MESSAGES,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ToolsConfig {
    pub sessions: SessionsToolConfig,
    pub agent_to_agent: ToolsAgentToAgent,
    pub subagents: SubagentTools,
    #[serde(rename = "sessions_spawn")]
    pub sessions_spawn: SpawnToolConfig,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Visibility {
    /// Only the caller's own session.
    #[serde(rename = "self")]
    OwnSession,
    /// The caller and every session it spawned, transitively.
    #[default]
    Tree,
    /// Every session of the caller's agent.
    Agent,
    /// Every session (other agents only under tools.agentToAgent).
    All,
}

impl Visibility {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OwnSession => "self",
            Self::Tree => "tree",
            Self::Agent => "agent",
            Self::All => "all",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SessionsToolConfig {
    pub visibility: Visibility,
    /// The largest answer a tool call or `resources/read` returns, in bytes of JSON (4,096 to
    /// 1,048,576; default 10,000). Every major host shows an answer of 10,000 bytes whole; Codex
    /// cuts larger ones out of the middle. Longer transcripts and lists come in pages.
    pub max_result_bytes: usize,
}

impl Default for SessionsToolConfig {
    fn default() -> Self {
        Self { visibility: Visibility::default(), max_result_bytes: defaults::MAX_RESULT_BYTES }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ToolsAgentToAgent {
    pub enabled: bool,
    /// Agent-id globs (`*`); both sides must match; empty = any.
    pub allow: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SubagentTools {
    pub tools: ToolFilter,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ToolFilter {
    pub allow: Vec<String>,
    pub also_allow: Vec<String>,
    pub deny: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SpawnToolConfig {
    pub attachments: AttachmentsConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AttachmentsConfig {
    pub enabled: bool,
    pub max_files: u32,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

impl Default for AttachmentsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            max_files: defaults::ATTACHMENTS_MAX_FILES,
            max_file_bytes: defaults::ATTACHMENTS_MAX_FILE_BYTES,
            max_total_bytes: defaults::ATTACHMENTS_MAX_TOTAL_BYTES,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuntimeConfig {
    pub max_concurrent_runs: u32,
    pub drain_seconds: u64,
    /// How long a claimed run may take to start its agent's process; past it the run ends
    /// `interrupted` (never re-run) and its slot is free again.
    pub start_timeout_seconds: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            max_concurrent_runs: defaults::MAX_CONCURRENT_RUNS,
            drain_seconds: defaults::DRAIN_SECONDS,
            start_timeout_seconds: defaults::START_TIMEOUT_SECONDS,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ChannelConfig {
    /// Deliverer command as an argv array (never a shell string).
    pub deliver: Option<Vec<String>>,
    /// Whether the deliverer opens threads (`kind: "thread_open"`), so spawns may bind children
    /// to them.
    pub threads: bool,
    /// The channel's inbound side: the bridge that posts its users' messages into sessions.
    pub bridge: Option<ChannelBridge>,
    /// Sub-agents bound to threads of this channel (over `session.threadBindings`).
    pub thread_bindings: Option<ThreadBindings>,
}

/// Thread-bound sub-agents (`sessions_spawn {thread: true}`), as the reference names them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ThreadBindings {
    /// Whether spawns may open threads (on a channel: as `threads: true` does).
    pub enabled: Option<bool>,
    /// A `mode: "session"` child is archived after this long without activity (default 24).
    pub idle_hours: Option<f64>,
    /// … and this long after its spawn whatever its activity (default 0: no limit).
    pub max_age_hours: Option<f64>,
    /// Whether sub-agents may be spawned into this channel's threads (default true).
    pub spawn_subagent_sessions: Option<bool>,
    /// Reserved by the reference for ACP sessions; accepted, not used.
    pub spawn_acp_sessions: Option<bool>,
}

/// What a channel's threads allow, resolved from its settings over `session.threadBindings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSettings {
    /// How long a session-mode child stays without activity, in ms (none: no limit).
    pub idle_ms: Option<i64>,
    /// Its longest life, in ms (none: no limit).
    pub max_age_ms: Option<i64>,
}

/// A bridge posts a channel's inbound messages to `POST /channels/<name>/messages` of
/// `serve --http`, with one of its bearer tokens: a token is bound to this channel only.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ChannelBridge {
    /// The hex sha256 of each bearer token the bridge may use.
    pub tokens: Vec<TokenHash>,
    /// The agent whose sessions its messages go to, unless a message names one (default: the
    /// default agent).
    pub agent_id: Option<String>,
    /// The agents whose sessions its messages may reach, by a message's `agentId` or
    /// `sessionKey` (default: the one above alone). A bridge token is not an operator's: what
    /// it reaches is what the operator configured for its channel.
    pub allow_agents: Option<Vec<String>>,
    /// Runs its messages may have waiting at once over the channel's sessions (default 10);
    /// a post past them is refused and queues nothing, so no chat fills the run queue.
    pub max_queued_runs: Option<u32>,
}

/// A bearer token, by its hex sha256 (the token itself is never in config).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenHash {
    /// Hex sha256 of the bearer token.
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServerConfig {
    pub tokens: Vec<StaticToken>,
    pub allowed_hosts: Vec<String>,
    pub tls: Option<TlsConfig>,
    pub header_timeout_seconds: u64,
    pub idle_timeout_seconds: u64,
    pub max_connections: u32,
    /// Requests open at once per credential (bearer token, or the `--as` operator); an SSE stream
    /// is open until it closes. Past it: 429.
    pub max_streams_per_credential: u32,
    /// TCP connections open at once per peer IP address. Past it: 429 (`/health` still answers).
    pub max_connections_per_peer: u32,
    /// Transcripts one caller may watch at once (`resources/subscribe`, `subscriptions/listen`),
    /// across its MCP sessions on one listener; alias forms of one session count once.
    pub max_subscriptions: u32,
    /// Operator tokens: they read `/metrics` (and, later, the operator's views).
    pub operator_tokens: Vec<TokenHash>,
    /// `/metrics` without a token, on a loopback bind only (serve refuses it on another).
    pub metrics_public: bool,
    /// Our agents served over A2A (docs/A2A.md).
    pub a2a: A2aServerConfig,
}

/// Which of our agents `serve --http` / `daemon --http` also serve as A2A agents, under
/// `/a2a/<agentId>` (docs/A2A.md). None by default: nothing is served.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct A2aServerConfig {
    /// The agent ids to expose, each with its own agent card at
    /// `/a2a/<agentId>/.well-known/agent-card.json`.
    pub agents: Vec<String>,
    /// The base URL peers reach this server at (`https://host:port`), written into the cards'
    /// interface URLs; unset: the scheme and `Host` of the request that fetched the card.
    pub public_url: Option<String>,
    /// Runs one peer's messages may have waiting at once over its contexts (default 10); a
    /// message past them is refused and queues nothing.
    pub max_queued_runs: Option<u32>,
}

impl A2aServerConfig {
    /// Runs one A2A peer may have queued (`maxQueuedRuns`, default 10).
    pub fn max_queued_runs(&self) -> u32 {
        self.max_queued_runs.unwrap_or(defaults::A2A_MAX_QUEUED_RUNS)
    }

    /// Whether `agent` is served over A2A.
    pub fn exposes(&self, agent: &crate::keys::AgentId) -> bool {
        self.agents.iter().any(|a| crate::keys::AgentId::parse(a).is_ok_and(|a| a == *agent))
    }

    fn validate(&self) -> Result<(), String> {
        for (i, agent) in self.agents.iter().enumerate() {
            crate::keys::AgentId::parse(agent).map_err(|e| format!("server.a2a.agents[{i}]: {e}"))?;
        }
        if let Some(url) = &self.public_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(format!("server.a2a.publicUrl must be an http:// or https:// URL, got {url:?}"));
        }
        Ok(())
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            allowed_hosts: defaults::allowed_hosts(),
            tls: None,
            header_timeout_seconds: defaults::HEADER_TIMEOUT_SECONDS,
            idle_timeout_seconds: defaults::IDLE_TIMEOUT_SECONDS,
            max_connections: defaults::MAX_CONNECTIONS,
            max_streams_per_credential: defaults::MAX_STREAMS_PER_CREDENTIAL,
            max_connections_per_peer: defaults::MAX_CONNECTIONS_PER_PEER,
            max_subscriptions: defaults::MAX_SUBSCRIPTIONS,
            operator_tokens: Vec::new(),
            metrics_public: false,
            a2a: A2aServerConfig::default(),
        }
    }
}

/// A static client token: only its sha256 is stored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StaticToken {
    /// Hex sha256 of the bearer token.
    pub sha256: String,
    /// The (external) session this token acts as.
    pub session_key: String,
    #[serde(default)]
    pub sandboxed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// Disable the local operator shortcut: stdio callers need SESSIONS_MCP_TOKEN.
    pub require_token: bool,
}

/// A configuration problem, with the key path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: not valid JSON5: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("config file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A loaded configuration plus what loading noticed.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// The file it came from (None: all defaults).
    pub path: Option<PathBuf>,
    /// Reference key paths present in the file that we accept but do not implement.
    pub ignored_reference_paths: Vec<String>,
}

/// Loads `path`. A missing file is all defaults when `explicit` is false, an error otherwise.
pub fn load(path: &Path, explicit: bool) -> Result<Loaded, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
            return Ok(Loaded { config: Config::default(), path: None, ignored_reference_paths: vec![] });
        }
        Err(source) => return Err(ConfigError::Read { path: path.to_path_buf(), source }),
    };
    let (config, ignored) = parse(&text).map_err(|e| match e {
        ParseError::Syntax(message) => ConfigError::Syntax { path: path.to_path_buf(), message },
        ParseError::Invalid(message) => ConfigError::Invalid { path: path.to_path_buf(), message },
    })?;
    Ok(Loaded { config, path: Some(path.to_path_buf()), ignored_reference_paths: ignored })
}

#[derive(Debug)]
pub enum ParseError {
    Syntax(String),
    Invalid(String),
}

/// Parses config text: classify paths, strip reference-only ones, deserialise, validate.
pub fn parse(text: &str) -> Result<(Config, Vec<String>), ParseError> {
    let raw: serde_json::Value = json5::from_str(text).map_err(|e| ParseError::Syntax(e.to_string()))?;
    if !raw.is_object() {
        return Err(ParseError::Invalid("the top level must be an object".into()));
    }
    let Classified { ours, reference, unknown } = paths::classify(raw);
    if let Some(first) = unknown.first() {
        return Err(ParseError::Invalid(first.clone()));
    }
    let config: Config = serde_path_to_error::deserialize(ours).map_err(|e| {
        let path = e.path().to_string();
        ParseError::Invalid(format!("{path}: {}", e.into_inner()))
    })?;
    config.validate().map_err(ParseError::Invalid)?;
    Ok((config, reference))
}

/// Every problem of a config text, one line each (for `doctor`); empty when it loads.
pub fn problems(text: &str) -> Vec<String> {
    let raw: serde_json::Value = match json5::from_str(text) {
        Ok(v) => v,
        Err(e) => return vec![format!("not valid JSON5: {e}")],
    };
    if !raw.is_object() {
        return vec!["the top level must be an object".into()];
    }
    let Classified { ours, unknown, .. } = paths::classify(raw);
    let mut out = unknown;
    match serde_path_to_error::deserialize::<_, Config>(ours) {
        Err(e) => out.push(format!("{}: {}", e.path(), e.inner())),
        Ok(config) => out.extend(config.validate().err()),
    }
    out
}

impl Config {
    /// Range and cross-field checks serde cannot express. One message per problem, naming the key.
    pub fn validate(&self) -> Result<(), String> {
        self.server.a2a.validate()?;
        let sub = &self.agents.defaults.subagents;
        if !(1..=5).contains(&sub.max_spawn_depth) {
            return Err(format!("agents.defaults.subagents.maxSpawnDepth must be 1-5, got {}", sub.max_spawn_depth));
        }
        if sub.approvals.timeout_seconds == 0 {
            return Err(
                "agents.defaults.subagents.approvals.timeoutSeconds must be at least 1 (a request always has a deadline)"
                    .into(),
            );
        }
        if sub.approvals.max_open_per_run == 0 {
            return Err("agents.defaults.subagents.approvals.maxOpenPerRun must be at least 1".into());
        }
        for (i, rule) in sub.approvals.rules.iter().enumerate() {
            if rule.decision.is_some() == rule.model_may_answer.is_some() {
                return Err(format!(
                    "agents.defaults.subagents.approvals.rules[{i}] must give exactly one of decision (allow | deny: decide without asking) or modelMayAnswer (afterPerson | always | never: ask, and say who may answer)"
                ));
            }
        }
        if sub.approvals.person_timeout_seconds == Some(0) {
            return Err("agents.defaults.subagents.approvals.personTimeoutSeconds must be at least 1 (leave it out for no person timeout)".into());
        }
        if self.session.agent_to_agent.max_ping_pong_turns > 5 {
            return Err(format!(
                "session.agentToAgent.maxPingPongTurns must be 0-5, got {}",
                self.session.agent_to_agent.max_ping_pong_turns
            ));
        }
        let main_key = self.session.main_key.trim();
        if main_key.is_empty() || main_key.contains(':') || !main_key.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(format!(
                "session.mainKey must be a non-empty word without ':' or whitespace, got {:?}",
                self.session.main_key
            ));
        }
        let budget = self.tools.sessions.max_result_bytes;
        if !defaults::RESULT_BYTES_RANGE.contains(&budget) {
            return Err(format!(
                "tools.sessions.maxResultBytes must be {}-{}, got {budget}",
                defaults::RESULT_BYTES_RANGE.start(),
                defaults::RESULT_BYTES_RANGE.end()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, agent) in self.agents.list.iter().enumerate() {
            let id = AgentId::parse(&agent.id).map_err(|e| format!("agents.list[{i}].id: {e}"))?;
            if !seen.insert(id.clone()) {
                return Err(format!("agents.list[{i}].id: agent id {:?} is configured twice", id.as_str()));
            }
        }
        self.validate_sandbox()?;
        self.validate_runner_limits()?;
        self.validate_remote_agents()?;
        self.validate_budgets()?;
        let server = &self.server;
        for (key, value) in [
            ("maxConnections", server.max_connections),
            ("maxStreamsPerCredential", server.max_streams_per_credential),
            ("maxConnectionsPerPeer", server.max_connections_per_peer),
        ] {
            if value == 0 {
                return Err(format!("server.{key} must be at least 1, got 0"));
            }
        }
        let hex64 = |h: &str| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit());
        for (i, t) in self.server.tokens.iter().enumerate() {
            if !hex64(&t.sha256) {
                return Err(format!("server.tokens[{i}].sha256 must be 64 hex characters (the sha256 of the token)"));
            }
        }
        if let Some(i) = self.server.operator_tokens.iter().position(|t| !hex64(&t.sha256)) {
            return Err(format!(
                "server.operatorTokens[{i}].sha256 must be 64 hex characters (the sha256 of the token)"
            ));
        }
        for (name, channel) in &self.channels {
            let Some(bridge) = &channel.bridge else { continue };
            if let Some(i) = bridge.tokens.iter().position(|t| !hex64(&t.sha256)) {
                return Err(format!(
                    "channels.{name}.bridge.tokens[{i}].sha256 must be 64 hex characters (the sha256 of the token)"
                ));
            }
            self.validate_bridge_agents(name, bridge)?;
            if bridge.max_queued_runs == Some(0) {
                return Err(format!("channels.{name}.bridge.maxQueuedRuns must be at least 1, got 0"));
            }
        }
        Ok(())
    }

    /// A bridge's agents are configured agents, and its default agent is one of them.
    fn validate_bridge_agents(&self, name: &str, bridge: &ChannelBridge) -> Result<(), String> {
        let configured = || self.configured_agents().iter().map(AgentId::as_str).collect::<Vec<_>>().join(", ");
        let named = bridge.agent_id.iter().map(|a| ("agentId".to_string(), a));
        let allowed = bridge.allow_agents.iter().flatten().enumerate().map(|(i, a)| (format!("allowAgents[{i}]"), a));
        for (key, agent) in named.chain(allowed) {
            let id = AgentId::parse(agent).map_err(|e| format!("channels.{name}.bridge.{key}: {e}"))?;
            if !self.is_configured(&id) {
                return Err(format!(
                    "channels.{name}.bridge.{key}: {:?} is not a configured agent (agents.list: {})",
                    id.as_str(),
                    configured()
                ));
            }
        }
        let (default, allowed) = self.bridge_agents(name);
        if !allowed.contains(&default) {
            return Err(format!(
                "channels.{name}.bridge.allowAgents does not include {:?}, where messages that name no agent go \
                 (bridge.agentId, else the default agent): add it, or set bridge.agentId to one of them",
                default.as_str()
            ));
        }
        Ok(())
    }

    /// A run's deadline is at least a second: 0 would end every run at once (it is not "no limit";
    /// a run always has a deadline, which its supervisor also holds).
    fn validate_runner_limits(&self) -> Result<(), String> {
        let runners = std::iter::once(("agents.defaults.runner".to_string(), &self.agents.defaults.runner)).chain(
            self.agents
                .list
                .iter()
                .enumerate()
                .filter_map(|(i, a)| a.runner.as_ref().map(|r| (format!("agents.list[{i}].runner"), r))),
        );
        for (path, r) in runners {
            if r.timeout_seconds == Some(0) {
                return Err(format!(
                    "{path}.timeoutSeconds must be at least 1 (seconds), got 0: a run always has a deadline (idleTimeoutSeconds: 0 turns the idle limit off); leave it out for the default"
                ));
            }
        }
        Ok(())
    }

    /// A remote (`kind: "a2a"`) runner names a card URL we may call, and only it uses the A2A keys.
    fn validate_remote_agents(&self) -> Result<(), String> {
        // Each agent as its runner applies (its own keys over the defaults'); the defaults' block
        // alone only when an agent without a runner of its own takes it whole.
        let defaults = &self.agents.defaults.runner;
        let own = self.agents.list.iter().enumerate().map(|(i, a)| match &a.runner {
            Some(r) => (format!("agents.list[{i}].runner"), r.merged(defaults)),
            None => ("agents.defaults.runner".to_string(), defaults.clone()),
        });
        let implicit_main =
            self.agents.list.is_empty().then(|| ("agents.defaults.runner".to_string(), defaults.clone()));
        for (path, r) in own.chain(implicit_main) {
            remote::validate(&path, &r)?;
        }
        Ok(())
    }

    fn validate_budgets(&self) -> Result<(), String> {
        let configured = [
            ("session.budget".to_string(), self.session.budget.as_ref()),
            ("agents.defaults.subagents.budget".to_string(), self.agents.defaults.subagents.budget.as_ref()),
        ]
        .into_iter()
        .chain(self.agents.list.iter().enumerate().map(|(i, a)| {
            (format!("agents.list[{i}].subagents.budget"), a.subagents.as_ref().and_then(|s| s.budget.as_ref()))
        }));
        for (path, budget) in configured {
            if let Some(b) = budget {
                b.validate(&path)?;
            }
        }
        Ok(())
    }

    /// Whether spawns may open threads on `channel`, and for how long a session-mode child stays:
    /// the channel needs a deliverer and thread support (`threads: true`, or
    /// `threadBindings.enabled`), and neither it nor `session.threadBindings` turned it off.
    pub fn thread_settings(&self, channel: &str) -> Option<ThreadSettings> {
        let ch = self.channels.get(channel)?;
        ch.deliver.as_ref().filter(|argv| !argv.is_empty())?;
        let own = ch.thread_bindings.clone().unwrap_or_default();
        let base = self.session.thread_bindings.clone().unwrap_or_default();
        let capable = ch.threads || own.enabled == Some(true);
        let off = own.enabled == Some(false)
            || base.enabled == Some(false)
            || own.spawn_subagent_sessions.or(base.spawn_subagent_sessions) == Some(false);
        if !capable || off {
            return None;
        }
        let hours = |h: Option<f64>| h.filter(|h| *h > 0.0).map(|h| (h * 3_600_000.0) as i64);
        Some(ThreadSettings {
            idle_ms: hours(Some(own.idle_hours.or(base.idle_hours).unwrap_or(defaults::THREAD_IDLE_HOURS))),
            max_age_ms: hours(own.max_age_hours.or(base.max_age_hours)),
        })
    }

    /// The longest cancel grace any agent has: how long a cancelled run may take to stop.
    pub fn longest_cancel_grace(&self) -> std::time::Duration {
        let defaults = &self.agents.defaults.runner;
        let own = self.agents.list.iter().filter_map(|a| a.runner.as_ref()).map(|r| r.merged(defaults));
        let longest = own.map(|r| r.cancel_grace_seconds()).fold(defaults.cancel_grace_seconds(), u64::max);
        std::time::Duration::from_secs(longest)
    }

    /// An agent whose sessions can run sandboxed needs a sandbox backend (and Linux).
    fn validate_sandbox(&self) -> Result<(), String> {
        let defaults_mode = self.agents.defaults.sandbox.mode;
        let backend_off = |r: &RunnerConfig| r.sandbox.as_ref().and_then(|s| s.backend) == Some(SandboxBackend::Off);
        let mut agents: Vec<(String, SandboxMode, bool)> =
            vec![("agents.defaults".into(), defaults_mode, backend_off(&self.agents.defaults.runner))];
        for (i, a) in self.agents.list.iter().enumerate() {
            let mode = a.sandbox.as_ref().and_then(|s| s.mode).unwrap_or(defaults_mode);
            let runner = a
                .runner
                .as_ref()
                .map_or_else(|| self.agents.defaults.runner.clone(), |r| r.merged(&self.agents.defaults.runner));
            agents.push((format!("agents.list[{i}]"), mode, backend_off(&runner)));
        }
        for (path, mode, off) in agents {
            if mode == SandboxMode::Off {
                continue;
            }
            if off {
                return Err(format!(
                    "{path}.runner.sandbox.backend is \"off\" but {path}.sandbox.mode (or agents.defaults.sandbox.mode) sandboxes its sessions; use backend \"bwrap\" or sandbox mode \"off\""
                ));
            }
            if cfg!(not(target_os = "linux")) {
                return Err(format!(
                    "{path}: sandboxed sessions need bubblewrap, which needs Linux; set sandbox.mode \"off\""
                ));
            }
        }
        Ok(())
    }

    /// The default agent: the entry with `default: true`, else the first, else `main`.
    pub fn default_agent(&self) -> AgentId {
        let entry = self.agents.list.iter().find(|a| a.default).or_else(|| self.agents.list.first());
        entry.and_then(|a| AgentId::parse(&a.id).ok()).unwrap_or_else(AgentId::main)
    }

    /// The agent `id`: configured, else discovered.
    pub fn agent(&self, id: &AgentId) -> Option<&AgentEntry> {
        let same = |a: &&AgentEntry| a.id.eq_ignore_ascii_case(id.as_str());
        self.agents.list.iter().find(same).or_else(|| self.agents.discovered.iter().find(same))
    }

    /// Configured agent ids (with no list, the default agent `main` is implied), then the
    /// discovered ones.
    pub fn configured_agents(&self) -> Vec<AgentId> {
        let listed = self.agents.list.iter().chain(&self.agents.discovered).filter_map(|a| AgentId::parse(&a.id).ok());
        let mut ids: Vec<AgentId> = listed.collect();
        if self.agents.list.is_empty() {
            ids.insert(0, AgentId::main());
        }
        ids
    }

    /// Adds an agent per preset whose CLI was found, under the preset's name, unless `agents.list`
    /// configures that id; `main` with no runner of its own runs the first of them. Called once at
    /// start, before the config is shared.
    pub fn add_discovered(&mut self, found: &[Discovered]) {
        for Discovered { preset, path, version } in found {
            let id = preset.as_str();
            if self.agents.list.iter().any(|a| a.id.eq_ignore_ascii_case(id)) {
                continue;
            }
            let command = Some(path.display().to_string());
            let runner = RunnerConfig { preset: Some(*preset), command, ..RunnerConfig::default() };
            let mut entry = AgentEntry::bare(id);
            entry.runner = Some(runner);
            entry.discovered = Some(version.clone());
            self.agents.discovered.push(entry);
        }
    }

    pub fn is_configured(&self, id: &AgentId) -> bool {
        self.configured_agents().contains(id)
    }

    /// Whether `agent` (as a store or a request spells it) is a configured agent's id.
    pub fn names_agent(&self, agent: &str) -> bool {
        AgentId::parse(agent).is_ok_and(|id| id.as_str() == agent && self.is_configured(&id))
    }

    /// A channel's bridge: the agent a message that names none goes to (`bridge.agentId`, else
    /// the default agent), and the agents its messages may reach (`bridge.allowAgents`, else
    /// that one alone).
    pub fn bridge_agents(&self, channel: &str) -> (AgentId, Vec<AgentId>) {
        let bridge = self.channels.get(channel).and_then(|c| c.bridge.as_ref());
        let named = bridge.and_then(|b| b.agent_id.as_deref()).and_then(|a| AgentId::parse(a).ok());
        let default = named.unwrap_or_else(|| self.default_agent());
        let allowed = match bridge.and_then(|b| b.allow_agents.as_ref()) {
            Some(list) => list.iter().filter_map(|a| AgentId::parse(a).ok()).collect(),
            None => vec![default.clone()],
        };
        (default, allowed)
    }

    /// How many runs the messages of a channel's users may have queued at once.
    pub fn bridge_max_queued_runs(&self, channel: &str) -> u32 {
        let bridge = self.channels.get(channel).and_then(|c| c.bridge.as_ref());
        bridge.and_then(|b| b.max_queued_runs).unwrap_or(defaults::BRIDGE_MAX_QUEUED_RUNS)
    }

    pub fn main_key(&self) -> String {
        self.session.main_key.trim().to_ascii_lowercase()
    }

    pub fn global_scope(&self) -> bool {
        self.session.scope == SessionScope::Global
    }

    /// Whether sessions of `agent` run sandboxed (non-main sessions only for `non-main`).
    pub fn sandbox_mode(&self, agent: &AgentId) -> SandboxMode {
        self.agent(agent)
            .and_then(|a| a.sandbox.as_ref())
            .and_then(|s| s.mode)
            .unwrap_or(self.agents.defaults.sandbox.mode)
    }
}

/// The key scope of a caller of `agent`: how `main` and bare keys resolve for it.
pub fn key_scope(config: &Config, agent: &AgentId) -> KeyScope {
    KeyScope {
        caller_agent: agent.clone(),
        default_agent: config.default_agent(),
        main_key: config.main_key(),
        global: config.global_scope(),
    }
}

/// `<stateDir>/export`: where `sessions-mcp export` writes the transcripts, and where a session's
/// transcript path is shown from when its file lies there.
pub fn export_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("export")
}

/// Whether sessions with this key run sandboxed under the config (`non-main`: all but main).
pub fn configured_sandbox(config: &Config, key: &SessionKey) -> bool {
    let agent = key.agent_id(&config.default_agent());
    match config.sandbox_mode(&agent) {
        SandboxMode::Off => false,
        SandboxMode::All => true,
        SandboxMode::NonMain => !key_scope(config, &agent).is_main(key),
    }
}

/// The JSON schema of the configuration file (`schemas/config.json`).
pub fn json_schema() -> serde_json::Value {
    let schema = crate::schemas::published_settings().into_generator().into_root_schema_for::<Config>();
    serde_json::to_value(schema).expect("schema serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_is_all_defaults() {
        let (c, ignored) = parse("{}").unwrap();
        assert_eq!(c.agents.defaults.subagents.max_spawn_depth, 1);
        assert_eq!(c.tools.sessions.visibility, Visibility::Tree);
        assert_eq!(c.default_agent().as_str(), "main");
        assert!(ignored.is_empty());
    }

    #[test]
    fn json5_and_ours_are_validated() {
        let (c, _) = parse("{ tools: { sessions: { visibility: 'all' } }, // comment\n }").unwrap();
        assert_eq!(c.tools.sessions.visibility, Visibility::All);
        for bad in [0, 4095, 1024 * 1024 + 1] {
            let err = parse(&format!("{{ tools: {{ sessions: {{ maxResultBytes: {bad} }} }} }}")).unwrap_err();
            assert!(
                matches!(&err, ParseError::Invalid(m) if m.contains("tools.sessions.maxResultBytes must be 4096-1048576")),
                "{err:?}"
            );
        }
        let err = parse("{ tools: { sessions: { visibility: 'everything' } } }").unwrap_err();
        assert!(matches!(err, ParseError::Invalid(m) if m.contains("tools.sessions.visibility")));
        let err = parse("{ agents: { defaults: { subagents: { maxSpawnDepth: 9 } } } }").unwrap_err();
        assert!(matches!(err, ParseError::Invalid(m) if m.contains("maxSpawnDepth must be 1-5")));
    }

    #[test]
    fn server_caps_are_at_least_one() {
        for key in ["maxConnections", "maxStreamsPerCredential", "maxConnectionsPerPeer"] {
            let err = parse(&format!("{{ server: {{ {key}: 0 }} }}")).unwrap_err();
            assert!(
                matches!(&err, ParseError::Invalid(m) if m.contains(&format!("server.{key} must be at least 1"))),
                "{err:?}"
            );
        }
        let (c, _) = parse("{}").unwrap();
        assert!(c.server.max_streams_per_credential < c.server.max_connections, "one token leaves room for others");
        assert!(c.server.max_connections_per_peer < c.server.max_connections, "one address leaves room for others");
    }

    #[test]
    fn a_bridges_agents_are_configured_ones_and_include_where_unnamed_messages_go() {
        let with = |bridge: &str| {
            parse(&format!(
                "{{ agents: {{ list: [{{ id: 'main' }}, {{ id: 'ops' }}] }}, channels: {{ discord: {{ bridge: {bridge} }} }} }}"
            ))
        };
        let (c, _) = with("{}").unwrap();
        assert_eq!(c.bridge_agents("discord"), (AgentId::main(), vec![AgentId::main()]), "the default agent alone");
        assert_eq!(c.bridge_max_queued_runs("discord"), defaults::BRIDGE_MAX_QUEUED_RUNS);
        let (c, _) = with("{ agentId: 'ops', allowAgents: ['main', 'ops'], maxQueuedRuns: 3 }").unwrap();
        let ops = AgentId::parse("ops").unwrap();
        assert_eq!(c.bridge_agents("discord"), (ops.clone(), vec![AgentId::main(), ops]));
        assert_eq!(c.bridge_max_queued_runs("discord"), 3);
        for (bridge, needle) in [
            (
                "{ allowAgents: ['ghost'] }",
                "channels.discord.bridge.allowAgents[0]: \"ghost\" is not a configured agent (agents.list: main, ops)",
            ),
            ("{ agentId: 'ghost' }", "channels.discord.bridge.agentId: \"ghost\" is not a configured agent"),
            ("{ allowAgents: ['ops'] }", "channels.discord.bridge.allowAgents does not include \"main\""),
            ("{ maxQueuedRuns: 0 }", "channels.discord.bridge.maxQueuedRuns must be at least 1, got 0"),
        ] {
            let err = with(bridge).unwrap_err();
            assert!(matches!(&err, ParseError::Invalid(m) if m.contains(needle)), "{bridge}: {err:?}");
        }
    }

    #[test]
    fn unknown_paths_name_the_nearest_key() {
        let err = parse("{ tools: { sesions: { visibility: 'all' } } }").unwrap_err();
        match err {
            ParseError::Invalid(m) => {
                assert!(m.contains("tools.sesions"), "{m}");
                assert!(m.contains("tools.sessions"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reference_paths_are_accepted_with_a_warning() {
        let (_, ignored) = parse("{ agents: { defaults: { heartbeat: { every: '30m' } } } }").unwrap();
        assert_eq!(ignored, vec!["agents.defaults.heartbeat".to_string()]);
    }

    #[test]
    fn agent_runner_overrides_defaults_field_by_field() {
        let base = RunnerConfig { timeout_seconds: Some(100), max_concurrent: Some(3), ..Default::default() };
        let over = RunnerConfig { max_concurrent: Some(1), ..Default::default() };
        let m = over.merged(&base);
        assert_eq!(m.timeout_seconds(), 100);
        assert_eq!(m.max_concurrent(), 1);
    }

    #[test]
    fn duplicate_agents_and_bad_token_hashes_are_refused() {
        assert!(parse("{ agents: { list: [ {id: 'a'}, {id: 'A'} ] } }").is_err());
        assert!(parse("{ server: { tokens: [ {sha256: 'xyz', sessionKey: 'main'} ] } }").is_err());
    }

    #[test]
    fn a_run_deadline_of_zero_is_refused_naming_the_key_and_an_idle_limit_of_zero_is_off() {
        let err = |text: &str| match parse(text) {
            Err(ParseError::Invalid(m)) => m,
            other => panic!("{text}: {other:?}"),
        };
        let m = err("{ agents: { defaults: { runner: { timeoutSeconds: 0 } } } }");
        assert!(m.starts_with("agents.defaults.runner.timeoutSeconds must be at least 1"), "{m}");
        let m = err("{ agents: { list: [ {id: 'main'}, {id: 'w', runner: {command: 'x', timeoutSeconds: 0}} ] } }");
        assert!(m.starts_with("agents.list[1].runner.timeoutSeconds must be at least 1"), "{m}");
        assert!(parse("{ agents: { defaults: { runner: { idleTimeoutSeconds: 0, timeoutSeconds: 1 } } } }").is_ok());
    }
}
