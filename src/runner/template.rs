//! The command template of CLI adapters (docs/RUNNER-PROTOCOL.md, Adapters; OpenClaw's cli-backends
//! vocabulary): which argv a turn gets — `args` or `resumeArgs`, the session, model, thinking and
//! system-prompt arguments — and the prompt written to the CLI's stdin (or appended as the last
//! argument with `input: "arg"`). Placeholders are substituted inside argv elements; an element
//! whose placeholders all resolve to empty is dropped.

use std::collections::BTreeMap;

use serde_json::Value;

use super::protocol::content_text;
use crate::config::{PromptInput, SessionMode, SystemPromptWhen};

/// How a CLI is called, from `agents.list[].runner` (CLI adapters only).
#[derive(Debug, Clone)]
pub struct CliTemplate {
    /// Replace `args` when the turn resumes the CLI's own session.
    pub resume_args: Option<Vec<String>>,
    /// `sessionArgs`, or `[sessionArg, "{externalSessionId}"]`.
    pub session_args: Vec<String>,
    pub session_mode: SessionMode,
    pub system_prompt_arg: Option<String>,
    pub system_prompt_when: SystemPromptWhen,
    pub model_arg: Option<String>,
    pub model_aliases: BTreeMap<String, String>,
    pub thinking: Thinking,
    pub input: PromptInput,
    pub max_prompt_arg_chars: usize,
}

/// How the thinking level reaches the CLI.
#[derive(Debug, Clone)]
pub enum Thinking {
    /// Not passed (the level is still recorded on the run).
    Ignored,
    /// `thinkingArgs`, with `{thinking}` substituted.
    Args(Vec<String>),
    /// `thinkingMap`: per level; a level not listed passes nothing.
    Map(BTreeMap<String, Vec<String>>),
}

/// What one turn puts into the template.
pub struct CliTurn<'a> {
    /// The stored session id is resumed (context `native`/`auto`); else the transcript is replayed.
    pub resuming: bool,
    pub model: Option<&'a str>,
    pub thinking: Option<&'a str>,
    pub system: Option<&'a str>,
    /// The transcript before the input, as the request's `messages` (empty when resuming).
    pub history: &'a [Value],
    /// The input message, rendered as the request's `input`.
    pub input: &'a Value,
    /// Arguments the server adds (Claude Code's `--mcp-config FILE`), before a prompt argument.
    pub extra: Vec<String>,
}

/// The argv after the program, and what to write to stdin (then closed).
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation {
    pub args: Vec<String>,
    pub stdin: String,
}

/// Substitutes `{name}` placeholders inside argv elements; an element whose placeholders all
/// resolve to empty is dropped.
pub fn substitute(args: &[String], vars: &[(&str, &str)]) -> Vec<String> {
    args.iter()
        .filter_map(|arg| {
            let mut out = arg.clone();
            let (mut had, mut empty) = (false, true);
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

impl CliTemplate {
    /// The invocation of one turn; `args` are the agent's `args`, `vars` the placeholder values.
    pub fn invocation(&self, args: &[String], vars: &[(&str, &str)], turn: CliTurn) -> Invocation {
        let resume_args = self.resume_args.as_ref().filter(|_| turn.resuming);
        let mut argv = substitute(resume_args.map_or(args, Vec::as_slice), vars);
        // resumeArgs carry their own session arguments; otherwise they are added when resuming
        // (or on every run with sessionMode "always", for CLIs that let the caller pick the id).
        let session = match self.session_mode {
            SessionMode::Always => true,
            SessionMode::Existing => turn.resuming && resume_args.is_none(),
            SessionMode::None => false,
        };
        if session {
            argv.extend(substitute(&self.session_args, vars));
        }
        if let (Some(flag), Some(model)) = (&self.model_arg, turn.model) {
            let name = self.model_aliases.get(model).map_or(model, String::as_str);
            argv.extend([flag.clone(), name.to_string()]);
        }
        argv.extend(self.thinking_args(turn.thinking, vars));
        let system = turn.system.filter(|_| !turn.resuming || self.system_prompt_when == SystemPromptWhen::Always);
        if let (Some(flag), Some(text)) = (&self.system_prompt_arg, system) {
            argv.extend([flag.clone(), text.to_string()]);
        }
        argv.extend(turn.extra);
        // Without a system-prompt argument the system text leads the prompt.
        let prompt_system = system.filter(|_| self.system_prompt_arg.is_none());
        let prompt = render_prompt(prompt_system, turn.history, turn.input);
        if self.input == PromptInput::Arg && prompt.chars().count() <= self.max_prompt_arg_chars {
            argv.push(prompt);
            return Invocation { args: argv, stdin: String::new() };
        }
        Invocation { args: argv, stdin: prompt }
    }

    fn thinking_args(&self, level: Option<&str>, vars: &[(&str, &str)]) -> Vec<String> {
        let Some(level) = level else { return Vec::new() };
        match &self.thinking {
            Thinking::Ignored => Vec::new(),
            Thinking::Args(args) => substitute(args, vars),
            Thinking::Map(map) => map.get(level).map(|args| substitute(args, vars)).unwrap_or_default(),
        }
    }
}

/// The prompt of a CLI turn: the input alone when there is nothing before it; otherwise the
/// system text and the transcript as `### system` / `### user` / `### assistant` blocks, then the
/// input as the last `### user` block. Tool calls and results stay out: the CLI ran its own tools
/// and the text of each turn says what came of them.
pub fn render_prompt(system: Option<&str>, history: &[Value], input: &Value) -> String {
    let input_text = content_text(&input["content"]);
    let mut blocks: Vec<(&str, String)> = system.map(|s| ("system", s.to_string())).into_iter().collect();
    for m in history {
        let role = m["role"].as_str().unwrap_or("");
        let text = content_text(&m["content"]);
        if matches!(role, "user" | "assistant") && !text.trim().is_empty() {
            blocks.push((role, text));
        }
    }
    if blocks.is_empty() {
        return input_text;
    }
    blocks.push(("user", input_text));
    blocks.iter().map(|(role, text)| format!("### {role}\n{text}")).collect::<Vec<_>>().join("\n\n")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claude_like() -> CliTemplate {
        CliTemplate {
            resume_args: None,
            session_args: vec!["--resume".into(), "{externalSessionId}".into()],
            session_mode: SessionMode::Existing,
            system_prompt_arg: Some("--append-system-prompt".into()),
            system_prompt_when: SystemPromptWhen::First,
            model_arg: Some("--model".into()),
            model_aliases: BTreeMap::from([("anthropic/claude-sonnet-4-5".into(), "sonnet".into())]),
            thinking: Thinking::Map(BTreeMap::from([("high".into(), vec!["--effort".into(), "high".into()])])),
            input: PromptInput::Stdin,
            max_prompt_arg_chars: 100,
        }
    }

    fn turn<'a>(resuming: bool, history: &'a [Value], input: &'a Value) -> CliTurn<'a> {
        CliTurn {
            resuming,
            model: Some("anthropic/claude-sonnet-4-5"),
            thinking: Some("high"),
            system: Some("SYS"),
            history,
            input,
            extra: vec!["--mcp-config".into(), "/w/m.json".into()],
        }
    }

    #[test]
    fn a_first_turn_replays_with_system_model_and_thinking_and_the_prompt_on_stdin() {
        let history = [json!({"role": "user", "content": "hi"}), json!({"role": "assistant", "content": "hello"})];
        let input = json!({"role": "user", "content": [{"type": "text", "text": "next"}]});
        let inv = claude_like().invocation(&["-p".into()], &[("externalSessionId", "")], turn(false, &history, &input));
        let expected = [
            "-p",
            "--model",
            "sonnet",
            "--effort",
            "high",
            "--append-system-prompt",
            "SYS",
            "--mcp-config",
            "/w/m.json",
        ];
        assert_eq!(inv.args, expected);
        assert_eq!(inv.stdin, "### user\nhi\n\n### assistant\nhello\n\n### user\nnext");
    }

    #[test]
    fn a_resumed_turn_passes_the_stored_id_and_only_the_input() {
        let input = json!({"role": "user", "content": "again"});
        let inv = claude_like().invocation(&["-p".into()], &[("externalSessionId", "abc")], turn(true, &[], &input));
        assert_eq!(inv.args[..3], ["-p", "--resume", "abc"]);
        assert!(!inv.args.contains(&"SYS".to_string()), "system goes only on the first turn: {:?}", inv.args);
        assert_eq!(inv.stdin, "again");
    }

    #[test]
    fn resume_args_replace_args_and_carry_their_own_session_arguments() {
        let mut t = claude_like();
        t.resume_args = Some(vec!["exec".into(), "resume".into(), "{externalSessionId}".into(), "-".into()]);
        t.model_arg = None;
        t.thinking = Thinking::Ignored;
        let input = json!({"role": "user", "content": "x"});
        let mut tu = turn(true, &[], &input);
        tu.extra.clear();
        let inv = t.invocation(&["exec".into(), "-".into()], &[("externalSessionId", "T1")], tu);
        assert_eq!(inv.args, ["exec", "resume", "T1", "-"]);
    }

    #[test]
    fn without_a_system_argument_the_system_text_leads_the_prompt_and_arg_input_is_the_last_element() {
        let mut t = claude_like();
        t.system_prompt_arg = None;
        t.input = PromptInput::Arg;
        let input = json!({"role": "user", "content": "q"});
        let mut tu = turn(false, &[], &input);
        tu.extra.clear();
        let inv = t.invocation(&[], &[], tu);
        assert_eq!(inv.args.last().unwrap(), "### system\nSYS\n\n### user\nq");
        assert_eq!(inv.stdin, "");
        t.max_prompt_arg_chars = 3;
        let mut tu = turn(false, &[], &input);
        tu.extra.clear();
        assert_eq!(t.invocation(&[], &[], tu).stdin, "### system\nSYS\n\n### user\nq", "too long for argv: stdin");
    }

    #[test]
    fn placeholders_substitute_and_empty_ones_drop() {
        let args = ["--model={model}".to_string(), "{sessionKey}".into(), "plain".into()];
        assert_eq!(
            substitute(&args, &[("model", ""), ("sessionKey", "agent:main:main")]),
            ["agent:main:main", "plain"]
        );
        assert_eq!(substitute(&args, &[("model", "m1"), ("sessionKey", "k")]), ["--model=m1", "k", "plain"]);
    }
}
