//! An agent's runner settings, resolved from `agents.list[].runner` over `agents.defaults.runner`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::template::{CliTemplate, Thinking};
use crate::config::remote::RemoteAgent;
use crate::config::{
    Config, ContextMode, HomeMode, PromptInput, RunnerConfig, RunnerKind, RunnerPreset, SandboxNetwork, SessionMode,
    SystemPromptWhen, WorkspaceAccess, defaults,
};
use crate::keys::AgentId;

/// Everything needed to start one agent's runs.
#[derive(Debug, Clone)]
pub struct RunnerSpec {
    /// How stdout is read (docs/RUNNER-PROTOCOL.md, Adapters).
    pub kind: RunnerKind,
    /// The command template of CLI adapters; None for `jsonl`.
    pub cli: Option<CliTemplate>,
    /// Whether a stored external session id is resumed (`runner.context`).
    pub context: ContextMode,
    pub command: String,
    pub args: Vec<String>,
    /// Where the agent works (its current directory): the agent's workspace, a sandboxed
    /// session's own directory, or the requester's project.
    pub workdir: PathBuf,
    /// Where the server keeps the run's own files (TMPDIR, the isolated HOME, Claude Code's MCP
    /// config): the agent's workspace, never the user's project.
    pub files_dir: PathBuf,
    pub timeout: Duration,
    pub idle_timeout: Option<Duration>,
    pub cancel_grace: Duration,
    pub max_stdout_bytes: usize,
    pub max_line_bytes: usize,
    pub max_concurrent: u32,
    pub context_budget_bytes: usize,
    pub passthrough: Vec<String>,
    pub home_inherit: bool,
    /// Sandboxed sessions of this agent share the host network (`runner.sandbox.network: "host"`).
    pub network_host: bool,
    /// The workspace is writable inside the jail (`runner.sandbox.workspace: "rw"`).
    pub workspace_rw: bool,
    /// The built-in echo agent runs: it answers `ECHO: <input>` and does no work, which every
    /// answer that shows its replies says.
    pub echo: bool,
    /// `kind: "a2a"`: the remote agent its turns are A2A tasks of (no local process).
    pub remote: Option<RemoteAgent>,
}

/// The runner settings of `agent` as they apply: its own `runner` over `agents.defaults.runner`
/// over its preset. The default agent `main` with neither a command nor a preset runs the first
/// discovered CLI's preset, else the built-in echo agent.
pub fn effective_runner(config: &Config, agent: &AgentId) -> RunnerConfig {
    let mut r = configured_runner(config, agent);
    if is_unconfigured_main(agent, &r) {
        // An unconfigured main runs the first CLI discovery found, else the echo agent.
        match config.agents.discovered.first().and_then(|a| a.runner.as_ref()) {
            Some(found) => r = r.merged(found),
            None => r.preset = Some(RunnerPreset::Echo),
        }
    }
    match r.preset {
        Some(preset) => r.merged(&preset.runner()),
        None => r,
    }
}

/// The runner keys the config gives `agent`: its own `runner` over `agents.defaults.runner`.
fn configured_runner(config: &Config, agent: &AgentId) -> RunnerConfig {
    let base = &config.agents.defaults.runner;
    match config.agent(agent).and_then(|a| a.runner.as_ref()) {
        Some(own) => own.merged(base),
        None => base.clone(),
    }
}

/// `main` with neither a command nor a preset: what discovery (or the echo agent) stands in for.
fn is_unconfigured_main(agent: &AgentId, configured: &RunnerConfig) -> bool {
    *agent == AgentId::main() && configured.command.is_none() && configured.preset.is_none()
}

/// Whether `agent` runs the built-in echo agent (no real agent configured or found for it).
pub fn is_echo(config: &Config, agent: &AgentId) -> bool {
    runs_echo(&effective_runner(config, agent))
}

/// Whether effective runner settings are the built-in echo agent's.
fn runs_echo(r: &RunnerConfig) -> bool {
    r.command.is_none() && r.preset == Some(RunnerPreset::Echo)
}

/// What every answer that shows an echo agent's work says about it.
pub const ECHO_WARNING: &str = "no real agent is configured, so the built-in echo agent runs sub-agents here: it answers \"ECHO: <task>\" and does no work. Install Claude Code, Codex or Gemini CLI (the server finds them on PATH when it starts) or set agents.list[].runner.preset; agents_list says what is available.";

/// The agent a spawn with no `agentId` runs when the calling host's own CLI was discovered: a
/// user working in Codex gets a Codex child, in Gemini CLI a Gemini one, even when Claude Code
/// (first in discovery's order, so what an unconfigured `main` runs) is installed too. Only for a
/// requester `main` with no runner of its own; `None`: the requester's own agent, as always.
/// Hosts are told by `clientInfo.name` (`codex-mcp-client`, `gemini-cli-mcp-client`,
/// `claude-code`).
pub fn host_agent(config: &Config, requester: &AgentId, host: Option<&str>) -> Option<AgentId> {
    if !is_unconfigured_main(requester, &configured_runner(config, requester)) {
        return None;
    }
    let host = host?.to_ascii_lowercase();
    let preset = RunnerPreset::DISCOVERABLE.into_iter().find(|p| host.contains(p.as_str()))?;
    let first = config.agents.discovered.first().and_then(|a| a.runner.as_ref()?.preset);
    let found = config.agents.discovered.iter().find(|a| a.runner.as_ref().and_then(|r| r.preset) == Some(preset))?;
    (first != Some(preset)).then(|| AgentId::parse(&found.id).ok()).flatten()
}

/// What `agents_list` says of an agent's runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRunner {
    /// The preset it runs (`claude`, `codex`, `gemini`, `echo`), `command` for a runner of its own, or
    /// `none`.
    pub runner: String,
    /// Whether it can start: its program is found (the echo agent always can).
    pub available: bool,
    /// The version its CLI gave when discovery found it.
    pub version: Option<String>,
    /// Why it is not available, or that it is the echo agent.
    pub note: Option<String>,
    /// Its CLI's login, as the CLI says it (None: not a preset's CLI, or not answered yet).
    pub login: Option<String>,
}

/// Whether to wait for a CLI's login answer (`doctor`) or take what is known (a tool call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginCheck {
    Wait,
    Known,
}

/// What `agent` runs and whether it can: its program on PATH, and for a preset's CLI its login
/// (asked as `check` says; docs/AGENTS.md, Login). A CLI that says it is not logged in is not
/// available, with the command that logs it in.
pub fn agent_runner(config: &Config, agent: &AgentId, check: LoginCheck) -> AgentRunner {
    let r = effective_runner(config, agent);
    let version = config.agent(agent).and_then(|a| a.discovered.clone()).filter(|v| !v.is_empty());
    let runner = match r.preset {
        Some(RunnerPreset::Echo) if r.command.is_some() => "command",
        Some(preset) => preset.as_str(),
        None => "command",
    }
    .to_string();
    if r.kind == Some(RunnerKind::A2a) {
        // A remote agent: whether it answers is learnt by calling it, which listing agents never does.
        let note = r.card_url.as_ref().map(|url| format!("a remote agent over A2A, at {url}"));
        return AgentRunner { runner: "a2a".into(), available: true, version, note, login: None };
    }
    if runs_echo(&r) {
        let note =
            "the built-in echo agent: it answers \"ECHO: <input>\" and does no work (no real agent is configured)";
        return AgentRunner { runner, available: true, version, note: Some(note.into()), login: None };
    }
    let Some(command) = r.command else {
        let note =
            "no runner is configured: set agents.list[].runner.preset (claude, codex, gemini, echo) or runner.command";
        return AgentRunner { runner: "none".into(), available: false, version, note: Some(note.into()), login: None };
    };
    let Ok(program) = which::which(&command) else {
        let note =
            format!("\"{command}\" is not installed or not on PATH: install it, or set agents.list[].runner.command");
        return AgentRunner { runner, available: false, version, note: Some(note), login: None };
    };
    let login = r.preset.and_then(|preset| {
        let login = match check {
            LoginCheck::Wait => Some(super::login::check(preset, &program)),
            LoginCheck::Known => super::login::known_or_ask(preset, &program),
        };
        login.map(|l| (l.clone(), l.describe(preset)))
    });
    let logged_out = login.as_ref().is_some_and(|(l, _)| *l == super::login::Login::No);
    let note = logged_out.then(|| format!("{agent}: {}", login.as_ref().map_or("", |(_, d)| d.as_str())));
    AgentRunner { runner, available: !logged_out, version, note, login: login.map(|(_, d)| d) }
}

/// What an adapter needs in `args` that a runner block lacks, said as the fix (doctor's check):
/// without them the CLI prints text where the adapter reads JSON and every run fails.
pub fn missing_adapter_flags(spec: &RunnerSpec) -> Option<String> {
    let has = |flag: &str| spec.args.iter().any(|a| a == flag);
    let has_value = |flag: &str, value: &str| {
        spec.args.windows(2).any(|w| w[0] == flag && w[1] == value) || has(&format!("{flag}={value}"))
    };
    let missing: Vec<&str> = match spec.kind {
        RunnerKind::ClaudeStreamJson => [
            (!(has("-p") || has("--print"))).then_some("-p"),
            (!has_value("--output-format", "stream-json")).then_some("--output-format stream-json"),
            (!has("--verbose")).then_some("--verbose"),
        ]
        .into_iter()
        .flatten()
        .collect(),
        RunnerKind::CodexExecJson => {
            [(!has("exec")).then_some("exec"), (!has("--json")).then_some("--json")].into_iter().flatten().collect()
        }
        RunnerKind::GeminiStreamJson => {
            let stream_json = has_value("--output-format", "stream-json") || has_value("-o", "stream-json");
            (!stream_json).then_some("--output-format stream-json").into_iter().collect()
        }
        RunnerKind::Jsonl | RunnerKind::Text | RunnerKind::A2a => Vec::new(),
    };
    (!missing.is_empty()).then(|| {
        let kind = serde_json::to_value(spec.kind).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        let preset = match spec.kind {
            RunnerKind::ClaudeStreamJson => "claude",
            RunnerKind::GeminiStreamJson => "gemini",
            _ => "codex",
        };
        format!(
            "kind \"{kind}\" reads JSON lines, but runner.args lack {}: the CLI would print text and every run fail \"protocol: line 1 is not JSON\"; add them, or set runner.preset \"{preset}\" (it sets them)",
            missing.join(", ")
        )
    })
}

/// Resolves the runner of `agent` ([`effective_runner`]).
pub fn resolve_runner(config: &Config, agent: &AgentId, state_dir: &Path, exe: &Path) -> Result<RunnerSpec, String> {
    let r = effective_runner(config, agent);
    let echo = runs_echo(&r);
    let remote = RemoteAgent::of("runner", &r).map_err(|e| format!("agent \"{agent}\": {e}"))?;
    let (command, args) = match &r.command {
        _ if remote.is_some() => (String::new(), Vec::new()),
        Some(c) => (c.clone(), r.args.clone().unwrap_or_default()),
        None if echo => (exe.display().to_string(), vec!["agent".to_string()]),
        None => {
            return Err(format!(
                "agent \"{agent}\" has no runner configured: set agents.list[].runner.preset (claude, codex, gemini, echo) or runner.command"
            ));
        }
    };
    let kind = r.kind.unwrap_or(RunnerKind::Jsonl);
    let cli = (!matches!(kind, RunnerKind::Jsonl | RunnerKind::A2a))
        .then(|| cli_template(&r))
        .transpose()
        .map_err(|e| format!("agent \"{agent}\": {e}"))?;
    let workspace = config
        .agent(agent)
        .and_then(|a| a.workspace.as_deref())
        .map(expand_home)
        .unwrap_or_else(|| state_dir.join("workspaces").join(agent.as_str()));
    // CLIs are silent while a long tool runs: no idle timeout unless configured.
    let idle_default = if cli.is_some() { 0 } else { defaults::RUNNER_IDLE_TIMEOUT_SECONDS_JSONL };
    let idle = r.idle_timeout_seconds.unwrap_or(idle_default);
    Ok(RunnerSpec {
        kind,
        cli,
        context: r.context.unwrap_or(ContextMode::Auto),
        command,
        args,
        files_dir: workspace.clone(),
        workdir: workspace,
        timeout: Duration::from_secs(r.timeout_seconds()),
        idle_timeout: (idle > 0).then(|| Duration::from_secs(idle)),
        cancel_grace: Duration::from_secs(r.cancel_grace_seconds()),
        max_stdout_bytes: r.max_stdout_bytes.unwrap_or(defaults::RUNNER_MAX_STDOUT_BYTES) as usize,
        max_line_bytes: r.max_line_bytes.unwrap_or(defaults::RUNNER_MAX_LINE_BYTES) as usize,
        max_concurrent: r.max_concurrent(),
        context_budget_bytes: r.context_budget_bytes.unwrap_or(defaults::RUNNER_CONTEXT_BUDGET_BYTES) as usize,
        passthrough: r.env.map(|e| e.passthrough).unwrap_or_default(),
        home_inherit: r.home == Some(HomeMode::Inherit),
        network_host: r.sandbox.as_ref().and_then(|s| s.network) == Some(SandboxNetwork::Host),
        workspace_rw: r.sandbox.as_ref().and_then(|s| s.workspace) == Some(WorkspaceAccess::Rw),
        echo,
        remote,
    })
}

fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(p),
    }
}

/// The command template of a CLI adapter, checked for settings that exclude each other.
fn cli_template(r: &RunnerConfig) -> Result<CliTemplate, String> {
    let session_args = match (&r.session_arg, &r.session_args) {
        (Some(_), Some(_)) => return Err("set runner.sessionArg or runner.sessionArgs, not both".into()),
        (Some(flag), None) => vec![flag.clone(), "{externalSessionId}".into()],
        (None, list) => list.clone().unwrap_or_default(),
    };
    let thinking = match (&r.thinking_args, &r.thinking_map) {
        (Some(_), Some(_)) => return Err("set runner.thinkingArgs or runner.thinkingMap, not both".into()),
        (Some(args), None) => Thinking::Args(args.clone()),
        (None, Some(map)) => Thinking::Map(map.clone()),
        (None, None) => Thinking::Ignored,
    };
    Ok(CliTemplate {
        resume_args: r.resume_args.clone(),
        session_args,
        session_mode: r.session_mode.unwrap_or(SessionMode::Existing),
        system_prompt_arg: r.system_prompt_arg.clone(),
        system_prompt_when: r.system_prompt_when.unwrap_or(SystemPromptWhen::First),
        model_arg: r.model_arg.clone(),
        model_aliases: r.model_aliases.clone().unwrap_or_default(),
        thinking,
        input: r.input.unwrap_or(PromptInput::Stdin),
        max_prompt_arg_chars: r.max_prompt_arg_chars.unwrap_or(defaults::RUNNER_MAX_PROMPT_ARG_CHARS) as usize,
    })
}

impl RunnerSpec {
    /// `args` with the placeholders substituted (jsonl agents; CLI adapters use [`CliTemplate`]).
    pub fn argv(&self, vars: &[(&str, &str)]) -> Vec<String> {
        super::template::substitute(&self.args, vars)
    }

    /// The stored external session id this run resumes, if any: never with `context: "replay"` or
    /// `sessionMode: "none"`; with `auto` only after a run that succeeded (a failed or aborted
    /// run may have left the CLI's own store disagreeing with ours; the runtime also clears the
    /// id then).
    pub fn resume<'a>(&self, stored: Option<&'a str>, last_run_failed: bool) -> Option<&'a str> {
        let sessions = self.cli.as_ref().is_none_or(|c| c.session_mode != SessionMode::None);
        let allowed = match self.context {
            ContextMode::Replay => false,
            ContextMode::Native => true,
            ContextMode::Auto => !last_run_failed,
        };
        stored.filter(|id| sessions && allowed && !id.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn main_defaults_to_the_echo_agent_and_others_need_a_runner() {
        let c = Config::default();
        let s = resolve_runner(&c, &AgentId::main(), Path::new("/state"), Path::new("/bin/smcp")).unwrap();
        assert_eq!((s.command.as_str(), s.args.as_slice()), ("/bin/smcp", ["agent".to_string()].as_slice()));
        assert_eq!(s.workdir, Path::new("/state/workspaces/main"));
        let ops = AgentId::parse("ops").unwrap();
        assert!(resolve_runner(&c, &ops, Path::new("/s"), Path::new("/b")).unwrap_err().contains("no runner"));
    }

    fn agent_with(runner: &str) -> RunnerSpec {
        let (c, _) =
            crate::config::parse(&format!("{{ agents: {{ list: [ {{ id: 'cli', runner: {runner} }} ] }} }}")).unwrap();
        resolve_runner(&c, &AgentId::parse("cli").unwrap(), Path::new("/s"), Path::new("/b")).unwrap()
    }

    #[test]
    fn cli_adapters_get_a_template_and_no_idle_timeout_by_default() {
        let claude = agent_with("{ kind: 'claude-stream-json', command: 'claude', sessionArg: '--resume' }");
        assert_eq!(claude.kind, RunnerKind::ClaudeStreamJson);
        assert_eq!(claude.idle_timeout, None);
        assert_eq!(claude.cli.unwrap().session_args, ["--resume", "{externalSessionId}"]);
        let jsonl = agent_with("{ command: 'agent' }");
        assert!(jsonl.cli.is_none());
        assert_eq!(jsonl.idle_timeout, Some(Duration::from_secs(defaults::RUNNER_IDLE_TIMEOUT_SECONDS_JSONL)));
    }

    #[test]
    fn a_gemini_runner_without_stream_json_output_is_flagged_with_the_preset_that_sets_it() {
        let plain = agent_with("{ kind: 'gemini-stream-json', command: 'gemini', args: ['--skip-trust'] }");
        let fix = missing_adapter_flags(&plain).unwrap();
        assert!(fix.contains("lack --output-format stream-json") && fix.contains("runner.preset \"gemini\""), "{fix}");
        for args in ["['-o', 'stream-json']", "['--output-format=stream-json']"] {
            let ok = agent_with(&format!("{{ kind: 'gemini-stream-json', command: 'gemini', args: {args} }}"));
            assert_eq!(missing_adapter_flags(&ok), None, "{args}");
        }
    }

    #[test]
    fn settings_that_exclude_each_other_are_refused_by_name() {
        let (c, _) = crate::config::parse(
            "{ agents: { list: [ { id: 'x', runner: { kind: 'text', command: 'llm', sessionArg: '-c', sessionArgs: ['--cid'] } } ] } }",
        )
        .unwrap();
        let err = resolve_runner(&c, &AgentId::parse("x").unwrap(), Path::new("/s"), Path::new("/b")).unwrap_err();
        assert!(err.contains("runner.sessionArg or runner.sessionArgs"), "{err}");
    }

    #[test]
    fn a_stored_id_is_resumed_unless_replay_none_or_auto_after_a_failure() {
        let auto = agent_with("{ kind: 'codex-exec-json', command: 'codex' }");
        assert_eq!(auto.resume(Some("t1"), false), Some("t1"));
        assert_eq!(auto.resume(Some("t1"), true), None);
        assert_eq!(auto.resume(None, false), None);
        let native = agent_with("{ kind: 'codex-exec-json', command: 'codex', context: 'native' }");
        assert_eq!(native.resume(Some("t1"), true), Some("t1"));
        let replay = agent_with("{ kind: 'codex-exec-json', command: 'codex', context: 'replay' }");
        assert_eq!(replay.resume(Some("t1"), false), None);
        let none = agent_with("{ kind: 'text', command: 'llm', sessionMode: 'none' }");
        assert_eq!(none.resume(Some("t1"), false), None);
    }
}
