//! Runner presets: the settings of the agent CLIs people use, so that `runner: {preset: "claude"}`
//! (or discovery, with no config at all) runs a real agent. A preset is the lowest layer of an
//! agent's runner: `agents.defaults.runner` and the agent's own `runner` keys override it key by
//! key. Presets keep each CLI's own safety defaults: no bypass flag, its own sandbox; Claude Code's
//! permission prompts come to us (`--permission-prompt-tool stdio`) and go up the tree as
//! approvals. Each CLI uses the user's own login (`home: "inherit"`) and provider keys (passed
//! through by name). docs/AGENTS.md lists what each preset sets.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::RunnerConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunnerPreset {
    /// Claude Code (`claude -p`, stream-json both ways).
    Claude,
    /// OpenAI Codex (`codex exec --json`).
    Codex,
    /// Google's Gemini CLI (`gemini --output-format stream-json`, headless).
    Gemini,
    /// The built-in echo agent: answers `ECHO: <input>` and does no work (demos and tests).
    Echo,
}

impl RunnerPreset {
    /// The presets discovery looks for on PATH, in the order `main` picks the first of.
    pub const DISCOVERABLE: [RunnerPreset; 3] = [RunnerPreset::Claude, RunnerPreset::Codex, RunnerPreset::Gemini];

    pub fn as_str(self) -> &'static str {
        match self {
            RunnerPreset::Claude => "claude",
            RunnerPreset::Codex => "codex",
            RunnerPreset::Gemini => "gemini",
            RunnerPreset::Echo => "echo",
        }
    }

    /// The program the preset runs (none for the built-in echo agent, which is this binary).
    pub fn program(self) -> Option<&'static str> {
        match self {
            RunnerPreset::Claude => Some("claude"),
            RunnerPreset::Codex => Some("codex"),
            RunnerPreset::Gemini => Some("gemini"),
            RunnerPreset::Echo => None,
        }
    }

    /// The command a person runs to log the CLI in.
    pub fn login_hint(self) -> Option<&'static str> {
        match self {
            RunnerPreset::Claude => Some("run `claude` once and log in with /login, or pass ANTHROPIC_API_KEY"),
            RunnerPreset::Codex => Some("run `codex login`, or pass CODEX_API_KEY"),
            RunnerPreset::Gemini => Some("run `gemini` once and pick a sign-in, or pass GEMINI_API_KEY"),
            RunnerPreset::Echo => None,
        }
    }

    /// The runner settings the preset stands for.
    pub fn runner(self) -> RunnerConfig {
        let settings = match self {
            RunnerPreset::Claude => json!({
                "kind": "claude-stream-json", "command": "claude",
                // Stream-json both ways (steers reach a running turn), our session tools allowed
                // without a prompt, and every other permission prompt sent to us as an approval.
                "args": ["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
                         "--include-partial-messages", "--strict-mcp-config", "--allowedTools", "mcp__sessions",
                         "--permission-prompt-tool", "stdio"],
                "sessionArgs": ["--resume", "{externalSessionId}"],
                "modelArg": "--model", "systemPromptArg": "--append-system-prompt",
                "thinkingMap": {"low": ["--effort", "low"], "medium": ["--effort", "medium"], "high": ["--effort", "high"]},
                "home": "inherit",
                "env": {"passthrough": ["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL",
                    "ANTHROPIC_MODEL", "CLAUDE_CONFIG_DIR", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX",
                    "AWS_PROFILE", "AWS_REGION", "ANTHROPIC_VERTEX_PROJECT_ID", "CLOUD_ML_REGION",
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER", "DISABLE_TELEMETRY",
                    "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"]},
            }),
            RunnerPreset::Codex => json!({
                "kind": "codex-exec-json", "command": "codex",
                // "-" reads the prompt from stdin; the server puts its own `-c mcp_servers.sessions…`
                // options first. Codex keeps its own sandbox (read-only in exec) and approvals.
                "args": ["exec", "--json", "--skip-git-repo-check", "--model={model}", "-"],
                "resumeArgs": ["exec", "--json", "--skip-git-repo-check", "--model={model}", "resume",
                               "{externalSessionId}", "-"],
                "thinkingArgs": ["-c", "model_reasoning_effort={thinking}"],
                "home": "inherit",
                "env": {"passthrough": ["CODEX_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_HOME",
                    "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"]},
            }),
            RunnerPreset::Gemini => json!({
                "kind": "gemini-stream-json", "command": "gemini",
                // Headless because stdin is not a terminal: the prompt is read from stdin.
                // `--skip-trust` trusts the agent's workspace for the run (headless Gemini refuses
                // to start in an untrusted folder). The approval mode stays Gemini's default: in
                // headless mode the tools that would ask (edits, shell) are not offered at all.
                "args": ["--output-format", "stream-json", "--skip-trust"],
                "sessionArgs": ["--resume", "{externalSessionId}"],
                "modelArg": "--model",
                "home": "inherit",
                "env": {"passthrough": ["GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_CLOUD_PROJECT",
                    "GOOGLE_CLOUD_LOCATION", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA",
                    "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_GEMINI_BASE_URL", "GOOGLE_VERTEX_BASE_URL",
                    "GEMINI_MODEL", "GEMINI_CLI_HOME", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"]},
            }),
            RunnerPreset::Echo => json!({"kind": "jsonl"}),
        };
        serde_json::from_value(settings).expect("a preset is a valid runner block")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HomeMode, RunnerKind};

    #[test]
    fn every_preset_is_a_valid_runner_and_keeps_the_clis_safety_defaults() {
        for p in [RunnerPreset::Claude, RunnerPreset::Codex, RunnerPreset::Gemini, RunnerPreset::Echo] {
            let r = p.runner();
            let args = r.args.clone().unwrap_or_default().join(" ");
            assert!(!args.contains("dangerously") && !args.contains("bypass"), "{p:?}: {args}");
            assert!(
                !args.contains("yolo") && !args.contains("approval-mode"),
                "{p:?} keeps the CLI's approvals: {args}"
            );
            assert!(!args.contains("danger-full-access"), "{p:?} keeps the CLI's sandbox: {args}");
        }
        let claude = RunnerPreset::Claude.runner();
        assert_eq!(claude.kind, Some(RunnerKind::ClaudeStreamJson));
        assert_eq!(claude.home, Some(HomeMode::Inherit), "the user's own login");
        let args = claude.args.unwrap();
        for flag in ["--output-format", "stream-json", "--verbose", "--permission-prompt-tool"] {
            assert!(args.iter().any(|a| a == flag), "{flag}: {args:?}");
        }
        assert_eq!(RunnerPreset::Codex.runner().kind, Some(RunnerKind::CodexExecJson));
        let gemini = RunnerPreset::Gemini.runner();
        assert_eq!(gemini.kind, Some(RunnerKind::GeminiStreamJson));
        assert_eq!(gemini.session_args.unwrap(), ["--resume", "{externalSessionId}"], "resumed by the init event's id");
    }
}
