//! An agent's runner settings, resolved from `agents.list[].runner` over `agents.defaults.runner`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{Config, HomeMode, RunnerKind, SandboxNetwork, WorkspaceAccess, defaults};
use crate::keys::AgentId;

/// Everything needed to start one agent's runs.
#[derive(Debug, Clone)]
pub struct RunnerSpec {
    pub command: String,
    pub args: Vec<String>,
    pub workdir: PathBuf,
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
}

/// Resolves the runner of `agent`. The default agent `main` with no command configured runs the
/// built-in echo agent (`sessions-mcp agent`), so a zero-config server answers sends.
pub fn resolve_runner(config: &Config, agent: &AgentId, state_dir: &Path, exe: &Path) -> Result<RunnerSpec, String> {
    let base = &config.agents.defaults.runner;
    let r = match config.agent(agent).and_then(|a| a.runner.as_ref()) {
        Some(own) => own.merged(base),
        None => base.clone(),
    };
    let (command, args) = match (&r.command, agent.as_str()) {
        (Some(c), _) => (c.clone(), r.args.clone().unwrap_or_default()),
        (None, "main") => (exe.display().to_string(), vec!["agent".to_string()]),
        (None, id) => return Err(format!("agent \"{id}\" has no runner configured (agents.list[].runner)")),
    };
    if let Some(kind) = r.kind.filter(|k| *k != RunnerKind::Jsonl) {
        return Err(format!(
            "agent \"{agent}\": runner kind {kind:?} is not available in this version; use kind \"jsonl\""
        ));
    }
    let workspace = config
        .agent(agent)
        .and_then(|a| a.workspace.as_deref())
        .map(expand_home)
        .unwrap_or_else(|| state_dir.join("workspaces").join(agent.as_str()));
    let idle = r.idle_timeout_seconds.unwrap_or(defaults::RUNNER_IDLE_TIMEOUT_SECONDS_JSONL);
    Ok(RunnerSpec {
        command,
        args,
        workdir: workspace,
        timeout: Duration::from_secs(r.timeout_seconds()),
        idle_timeout: (idle > 0).then(|| Duration::from_secs(idle)),
        cancel_grace: Duration::from_secs(r.cancel_grace_seconds.unwrap_or(defaults::RUNNER_CANCEL_GRACE_SECONDS)),
        max_stdout_bytes: r.max_stdout_bytes.unwrap_or(defaults::RUNNER_MAX_STDOUT_BYTES) as usize,
        max_line_bytes: r.max_line_bytes.unwrap_or(defaults::RUNNER_MAX_LINE_BYTES) as usize,
        max_concurrent: r.max_concurrent(),
        context_budget_bytes: r.context_budget_bytes.unwrap_or(defaults::RUNNER_CONTEXT_BUDGET_BYTES) as usize,
        passthrough: r.env.map(|e| e.passthrough).unwrap_or_default(),
        home_inherit: r.home == Some(HomeMode::Inherit),
        network_host: r.sandbox.as_ref().and_then(|s| s.network) == Some(SandboxNetwork::Host),
        workspace_rw: r.sandbox.as_ref().and_then(|s| s.workspace) == Some(WorkspaceAccess::Rw),
    })
}

fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(p),
    }
}

impl RunnerSpec {
    /// Substitutes `{name}` placeholders inside argv elements; an element whose placeholders all
    /// resolve to empty is dropped.
    pub fn argv(&self, vars: &[(&str, &str)]) -> Vec<String> {
        self.args
            .iter()
            .filter_map(|arg| {
                let mut out = arg.clone();
                let mut had = false;
                let mut empty = true;
                for (name, value) in vars {
                    let ph = format!("{{{name}}}");
                    if out.contains(&ph) {
                        had = true;
                        empty &= value.is_empty();
                        out = out.replace(&ph, value);
                    }
                }
                (!had || !empty).then_some(out)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_substitute_and_empty_ones_drop() {
        let spec = RunnerSpec {
            command: "x".into(),
            args: vec!["--model={model}".into(), "{sessionKey}".into(), "plain".into()],
            workdir: PathBuf::new(),
            timeout: Duration::ZERO,
            idle_timeout: None,
            cancel_grace: Duration::ZERO,
            max_stdout_bytes: 0,
            max_line_bytes: 0,
            max_concurrent: 1,
            context_budget_bytes: 0,
            passthrough: vec![],
            home_inherit: false,
            network_host: false,
            workspace_rw: false,
        };
        assert_eq!(spec.argv(&[("model", ""), ("sessionKey", "agent:main:main")]), ["agent:main:main", "plain"]);
        assert_eq!(spec.argv(&[("model", "m1"), ("sessionKey", "k")]), ["--model=m1", "k", "plain"]);
    }

    #[test]
    fn main_defaults_to_the_echo_agent_and_others_need_a_runner() {
        let c = Config::default();
        let s = resolve_runner(&c, &AgentId::main(), Path::new("/state"), Path::new("/bin/smcp")).unwrap();
        assert_eq!((s.command.as_str(), s.args.as_slice()), ("/bin/smcp", ["agent".to_string()].as_slice()));
        assert_eq!(s.workdir, Path::new("/state/workspaces/main"));
        let ops = AgentId::parse("ops").unwrap();
        assert!(resolve_runner(&c, &ops, Path::new("/s"), Path::new("/b")).unwrap_err().contains("no runner"));
    }
}
