//! The real Claude Code CLI as a `claude-stream-json` agent, offline: a fake Anthropic Messages API
//! on loopback (below) answers it. One session, three sends: a plain reply; a second turn that
//! resumes the CLI's own session (`--resume <stored session_id>`, so the API sees the earlier
//! turns); and a turn in which Claude calls our `sessions_list` through the generated
//! `--mcp-config` file (`sessions-mcp connect` with the run token) and answers with its result.
//! Then Claude Code as a spawned sub-agent: its reply, usage and cost land in the child session and
//! the announce reaches the requester; and a child allowed `sessions_list`
//! (`tools.subagents.tools.allow`) lists its own tree through this server. The send test runs
//! Claude Code with `--input-format stream-json` (the prompt as a user message), the others with
//! the prompt as plain stdin. Last, steering at the runner level (`Runner::execute` with a steer
//! channel): a steer written while Claude Code runs a tool reaches its model in the same turn,
//! beside the tool result; one written while the model's answer is on its way runs as a second
//! turn of the same process, whose result is the run's. And permission prompts at the runner
//! level: with `--permission-prompt-tool stdio`, Claude Code's prompt before a `Write` becomes an
//! approval request whose answer (allow, or deny with a message) decides the write in the same
//! run; without a prompt tool, `-p` denies the write at once. And a budget: a Claude Code child
//! whose model loops on a tool is stopped mid-turn when its live usage crosses its token budget.
//!
//! The CLI is `SESSIONS_MCP_CLAUDE`, else `claude` on PATH (`.ci/run --extended` installs npm
//! `@anthropic-ai/claude-code`). Without it the test prints why and passes — except in CI's
//! extended tier (`CI` and `SESSIONS_MCP_EXTENDED` set), where it fails.

use crate::common;

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;

use common::{TestEnv, agents_config, text_of};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

const KEY: &str = "agent:claude:main";

/// What the steering tests steer with; a request that carries it anywhere is answered "Steered".
const STEER: &str = "Also say PINEAPPLE";

/// A fake Anthropic Messages API: streams one deterministic message per request, from the last
/// user turn: a tool result → "done: <its text>"; text with LIST → a `sessions_list` call through
/// MCP; text with SYSTEM? → whether the system prompt carries our sub-agent context; the announce
/// step → ANNOUNCE_SKIP; anything else → "Hello from the fake API (<n> messages)". For steering:
/// [`STEER`] anywhere in the messages → "Steered: PINEAPPLE (<n> messages)"; text with SLEEP → a
/// Bash call that touches `tool-started` in its working directory and sleeps 3 s; text with WAIT →
/// the answer after a 4 s wait. For permission prompts: text with WRITE → a `Write` call (see
/// [`write_step`]). For budgets: text with LOOP → a call after every result (see [`loop_step`]).
fn fake_api() -> u16 {
    fake_api_reporting(None)
}

/// [`fake_api`], sending each request's body to `seen` as it arrives.
fn fake_api_reporting(seen: Option<UnboundedSender<Value>>) -> u16 {
    common::loopback_server(move |stream| answer(stream, seen.clone()))
}

fn answer(stream: TcpStream, seen: Option<UnboundedSender<Value>>) {
    let Some((_, body)) = common::read_http_request(&stream) else { return };
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    if let Some(seen) = seen {
        let _ = seen.send(request.clone());
    }
    if last_user_text(&request).contains("WAIT") {
        std::thread::sleep(std::time::Duration::from_secs(4));
    }
    if is_loop_request(&request) {
        std::thread::sleep(LOOP_LATENCY);
    }
    let mut out = stream;
    let _ = out.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n");
    let _ = out.write_all(reply_events(&request).as_bytes());
}

/// The blocks of the request's last user message.
fn last_user_blocks(request: &Value) -> Vec<Value> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    match messages.iter().rev().find(|m| m["role"] == "user").map(|m| m["content"].clone()) {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b,
        _ => vec![],
    }
}

/// The text blocks of the request's last user message.
fn last_user_text(request: &Value) -> String {
    last_user_blocks(request).iter().filter_map(|b| b["text"].as_str()).collect::<Vec<_>>().join(" ")
}

fn reply_events(request: &Value) -> String {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let blocks = last_user_blocks(request);
    let result = blocks.iter().find(|b| b["type"] == "tool_result");
    let text = last_user_text(request);
    let looping = loop_step(&messages);
    let (input_tokens, output_tokens) = if looping.is_some() { LOOP_USAGE } else { (10, 6) };
    let (block, stop) = if let Some(next) = looping {
        next
    } else if let Some(next) = paging_step(&messages) {
        next
    } else if let Some(next) = write_step(&messages) {
        next
    } else if let Some(next) = spawn_wait_step(&messages) {
        next
    } else if let Some(next) = read_list_step(&messages) {
        next
    } else if request["messages"].to_string().contains(STEER) {
        (json!({"type": "text", "text": format!("Steered: PINEAPPLE ({} messages)", messages.len())}), "end_turn")
    } else if let Some(r) = result {
        (json!({"type": "text", "text": format!("done: {}", tool_output(r))}), "end_turn")
    } else if text.contains("Agent-to-agent announce step") || text.contains("Reply exactly ANNOUNCE_SKIP") {
        (json!({"type": "text", "text": "ANNOUNCE_SKIP"}), "end_turn")
    } else if text.contains("SYSTEM?") {
        // What the host put in the model's system prompt from our `system` (--append-system-prompt).
        let system = request["system"].to_string();
        let seen = system.contains("Sub-agent context.") && system.contains("Requester session:");
        (json!({"type": "text", "text": format!("sub-agent context in the system prompt: {seen}")}), "end_turn")
    } else if text.contains("SLEEP") {
        let command = "touch tool-started && sleep 3 && echo slept";
        (json!({"type": "tool_use", "id": "toolu_sleep", "name": "Bash", "input": {"command": command}}), "tool_use")
    } else if text.contains("LIST") {
        (
            json!({"type": "tool_use", "id": "toolu_list", "name": "mcp__sessions__sessions_list", "input": {}}),
            "tool_use",
        )
    } else {
        (json!({"type": "text", "text": format!("Hello from the fake API ({} messages)", messages.len())}), "end_turn")
    };
    let (start, delta) = match block["type"].as_str() {
        Some("text") => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": block["text"]})),
        _ => (
            json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
        ),
    };
    let events = [
        json!({"type": "message_start", "message": {"id": format!("msg_{}", messages.len()), "type": "message",
            "role": "assistant", "model": "claude-sonnet-4-5", "content": [], "stop_reason": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": start}),
        json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": output_tokens}}),
        json!({"type": "message_stop"}),
    ];
    events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect()
}

/// The text of a `tool_result` block as the model reads it, without the reminders Claude Code
/// appends.
fn tool_output(result: &Value) -> String {
    let output = match &result["content"] {
        Value::String(s) => s.clone(),
        other => text_of(other),
    };
    output.split("<system-reminder>").next().unwrap_or("").trim().to_string()
}

/// The text of every tool result in `messages`, oldest first ([`tool_output`]).
fn tool_outputs(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| tool_output(&b))
        .collect()
}

/// The file a WRITE turn creates with Claude Code's `Write` tool, in its working directory.
const WRITTEN: &str = "written.txt";

/// A model that writes: after a turn that says WRITE, it calls `Write` (id `toolu_write`) to create
/// [`WRITTEN`] in the working directory Claude Code names in its first message ("Primary working
/// directory: …"); after that call's result it says whether the write happened: `wrote: yes`
/// when Claude Code reports the file created, else `wrote: no (<the result's text>)` — for a
/// permission denied, the text is the denial's message. `Write` must be among the CLI's tools
/// (`--tools Write`) and not allowed outright (no `--allowedTools Write`), so that it needs
/// permission.
fn write_step(messages: &[Value]) -> Option<(Value, &'static str)> {
    let last = messages.iter().rev().find(|m| m["role"] == "user")?;
    let blocks = last["content"].as_array().cloned().unwrap_or_default();
    if let Some(result) = blocks.iter().find(|b| b["type"] == "tool_result" && b["tool_use_id"] == "toolu_write") {
        let output = tool_output(result);
        let wrote = result["is_error"] != true && output.starts_with("File created successfully");
        let verdict = if wrote { "wrote: yes".to_string() } else { format!("wrote: no ({output})") };
        return Some((json!({"type": "text", "text": verdict}), "end_turn"));
    }
    if !text_of(&last["content"]).contains("WRITE") {
        return None;
    }
    let workdir = primary_workdir(messages)?;
    let input = json!({"file_path": format!("{workdir}/{WRITTEN}"), "content": "written by the fake model\n"});
    Some((json!({"type": "tool_use", "id": "toolu_write", "name": "Write", "input": input}), "tool_use"))
}

/// The working directory Claude Code names in its first message ("Primary working directory: …").
fn primary_workdir(messages: &[Value]) -> Option<String> {
    messages.iter().find_map(|m| {
        let text = text_of(&m["content"]);
        let after = text.split_once("Primary working directory: ")?.1;
        after.split_whitespace().next().map(String::from)
    })
}

/// What the project's README.md starts with in [`read_list_step`]'s test.
const PROJECT_MARK: &str = "# The user's project";

/// A model that reads the project and calls back: after a turn that says READ_AND_LIST, it calls
/// `Read` on README.md in its working directory, then our `sessions_list`, then answers
/// `read: <whether the README started with PROJECT_MARK> in <workdir>; listed: <the list's text>`.
fn read_list_step(messages: &[Value]) -> Option<(Value, &'static str)> {
    let first = messages.first().map(|m| text_of(&m["content"])).unwrap_or_default();
    if !first.contains("READ_AND_LIST") {
        return None;
    }
    let workdir = primary_workdir(messages)?;
    let results = tool_outputs(messages);
    let call = |id: &str, name: &str, input: Value| {
        (json!({"type": "tool_use", "id": id, "name": name, "input": input}), "tool_use")
    };
    Some(match results.len() {
        0 => call("toolu_read", "Read", json!({"file_path": format!("{workdir}/README.md")})),
        1 => call("toolu_list", "mcp__sessions__sessions_list", json!({})),
        _ => {
            let read = results[0].contains(PROJECT_MARK);
            (json!({"type": "text", "text": format!("read: {read} in {workdir}; listed: {}", results[1])}), "end_turn")
        }
    })
}

/// The session a PAGE turn reads, page by page, backwards from its newest message.
const BIG: &str = "agent:claude:big";

/// A model that pages: after a turn that says PAGE, it calls `sessions_history` on [`BIG`], then
/// follows each answer's `nextBeforeSeq`; when there is none, it reports what reached it: how many
/// tool results came, whether each was whole JSON, their largest size, and every seq it read.
fn paging_step(messages: &[Value]) -> Option<(Value, &'static str)> {
    let last = messages.iter().rev().find(|m| m["role"] == "user")?;
    let answers_a_page = last["content"].to_string().contains("toolu_page_");
    if !answers_a_page && !text_of(&last["content"]).contains("PAGE") {
        return None;
    }
    let results = tool_outputs(messages);
    let parsed: Vec<Value> = results.iter().filter_map(|t| serde_json::from_str(t).ok()).collect();
    let call = |input: Value| {
        let id = format!("toolu_page_{}", results.len());
        (json!({"type": "tool_use", "id": id, "name": "mcp__sessions__sessions_history", "input": input}), "tool_use")
    };
    match parsed.last() {
        None if results.is_empty() => Some(call(json!({"sessionKey": BIG}))),
        Some(last) if parsed.len() == results.len() && last["nextBeforeSeq"].is_i64() => {
            Some(call(json!({"sessionKey": BIG, "beforeSeq": last["nextBeforeSeq"]})))
        }
        _ => {
            let mut seqs: Vec<i64> = parsed
                .iter()
                .flat_map(|p| p["messages"].as_array().cloned().unwrap_or_default())
                .filter_map(|m| m["seq"].as_i64())
                .collect();
            seqs.sort();
            let largest = results.iter().map(String::len).max().unwrap_or(0);
            let report = json!({"results": results.len(), "whole": parsed.len(), "largest": largest, "seqs": seqs});
            Some((json!({"type": "text", "text": format!("paged: {report}")}), "end_turn"))
        }
    }
}

/// How many `sessions_list` calls a LOOP turn makes before it answers.
const LOOP_CALLS: usize = 50;

/// The input and output tokens each message of a LOOP turn reports (the output in its
/// `message_delta`, the `message_start` saying 1, as the real API streams it).
const LOOP_USAGE: (i64, i64) = (400, 100);

/// How long the API takes to answer each request of a LOOP turn: a stop lands while the next
/// request waits, as it would against the real API, which takes longer still.
const LOOP_LATENCY: std::time::Duration = std::time::Duration::from_millis(300);

/// How the ids of a LOOP turn's calls begin (then the call's number, from 0).
const LOOP_ID: &str = "toolu_loop_";

/// A model that keeps going: after a turn that says LOOP, it calls `sessions_list`, and again
/// after each result, [`LOOP_CALLS`] times; then it answers `looped <n>`.
fn loop_step(messages: &[Value]) -> Option<(Value, &'static str)> {
    let last = messages.iter().rev().find(|m| m["role"] == "user")?;
    let answers_a_call = last["content"].to_string().contains(LOOP_ID);
    if !answers_a_call && !text_of(&last["content"]).contains("LOOP") {
        return None;
    }
    let done = messages
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result" && b["tool_use_id"].as_str().is_some_and(|id| id.starts_with(LOOP_ID)))
        .count();
    if done == LOOP_CALLS {
        return Some((json!({"type": "text", "text": format!("looped {done}")}), "end_turn"));
    }
    let id = format!("{LOOP_ID}{done}");
    Some((json!({"type": "tool_use", "id": id, "name": "mcp__sessions__sessions_list", "input": {}}), "tool_use"))
}

/// Whether the request is one of a LOOP turn's.
fn is_loop_request(request: &Value) -> bool {
    loop_step(request["messages"].as_array().map_or(&[], Vec::as_slice)).is_some()
}

/// A model that delegates: after a turn that says DELEGATE, it spawns a `claude` child, then
/// calls `subagents` wait, then reports the wait's answer as it reached it (`waited: <text>`).
/// With ASK HOST instead, the child is the caller's own (scripted) agent, whose task makes it ask
/// for approval.
fn spawn_wait_step(messages: &[Value]) -> Option<(Value, &'static str)> {
    let first = messages.first().map(|m| text_of(&m["content"])).unwrap_or_default();
    let spawn = if first.contains("DELEGATE") {
        json!({"task": "Say hello", "agentId": "claude"})
    } else if first.contains("ASK HOST") {
        json!({"task": "ask for a.txt"})
    } else {
        return None;
    };
    let results: Vec<String> = messages
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "tool_result")
        .map(|b| b["content"].as_str().map_or_else(|| text_of(&b["content"]), String::from))
        .collect();
    let call = |name: &str, input: Value| {
        let id = format!("toolu_delegate_{}", results.len());
        (json!({"type": "tool_use", "id": id, "name": name, "input": input}), "tool_use")
    };
    Some(match results.len() {
        0 => call("mcp__sessions__sessions_spawn", spawn),
        1 => call("mcp__sessions__subagents", json!({"action": "wait", "timeoutSeconds": 120})),
        _ => {
            let seen = results[1].split("<system-reminder>").next().unwrap_or("").trim().to_string();
            (json!({"type": "text", "text": format!("waited: {seen}")}), "end_turn")
        }
    })
}

/// The CLI, or None after saying why the test is skipped (a failure in CI's extended tier).
fn cli_or_skip() -> Option<PathBuf> {
    common::real_cli_or_skip("SESSIONS_MCP_CLAUDE", "claude", "Claude Code")
}

/// How the runs get their prompt: Claude Code's `--input-format stream-json` (a user message on
/// stdin, as the claude preset does), or plain stdin up to EOF.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Prompt {
    StreamJson,
    Plain,
    /// Stream-json input, the `Write` tool not allowed outright, and its permission prompt on
    /// stdio (the runner hands it on as an approval request).
    AskToWrite,
}

/// An env with agents `main` (the caller, may spawn `claude` children) and `claude` (the real CLI
/// against a fake API), plus `extra` config keys; and the variables `serve` needs for the CLI.
fn claude_env(claude: &PathBuf, prompt: Prompt, extra: Value) -> (TestEnv, Vec<(&'static str, String)>) {
    claude_env_on(fake_api(), claude, prompt, &[], extra)
}

/// [`claude_env`] with the fake API on `port` and `more_args` for the CLI.
fn claude_env_on(
    port: u16,
    claude: &PathBuf,
    prompt: Prompt,
    more_args: &[&str],
    extra: Value,
) -> (TestEnv, Vec<(&'static str, String)>) {
    let mut env = TestEnv::new();
    let passthrough = [
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_AUTOUPDATER",
        "DISABLE_TELEMETRY",
    ];
    // Only our MCP tools, allowed without a prompt (never the permission bypass).
    let mut args = json!([
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "claude-sonnet-4-5",
        "--tools",
        "",
        "--strict-mcp-config",
        "--allowedTools",
        "mcp__sessions"
    ]);
    if prompt != Prompt::Plain {
        args.as_array_mut().unwrap().extend([json!("--input-format"), json!("stream-json")]);
    }
    if prompt == Prompt::AskToWrite {
        args[7] = json!("Write");
        args.as_array_mut().unwrap().extend([json!("--permission-prompt-tool"), json!("stdio")]);
    }
    args.as_array_mut().unwrap().extend(more_args.iter().map(|a| json!(a)));
    let runner = json!({
        "kind": "claude-stream-json",
        "command": claude,
        "args": args,
        "sessionArgs": ["--resume", "{externalSessionId}"],
        "systemPromptArg": "--append-system-prompt",
        "env": {"passthrough": passthrough},
        "timeoutSeconds": 120,
    });
    let main = json!({"id": "main", "subagents": {"allowAgents": ["claude"]}});
    env.set_config(&agents_config(vec![main, json!({"id": "claude", "runner": runner})], extra));
    env.seed(json!({"sessions": [{"key": KEY}]}));
    let vars = vec![
        ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
        ("ANTHROPIC_API_KEY", "sk-fake".to_string()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_string()),
        ("DISABLE_AUTOUPDATER", "1".to_string()),
        ("DISABLE_TELEMETRY", "1".to_string()),
    ];
    (env, vars)
}

fn serve(env: &TestEnv, vars: &[(&'static str, String)]) -> common::Client {
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.serve_with(None, &vars)
}

/// Spawns a `claude` child with `task` and waits for its announce in `main`'s inbox.
fn spawn_and_wait(c: &mut common::Client, task: &str) -> (String, String) {
    let r = c.call("sessions_spawn", json!({"task": task, "agentId": "claude"}));
    assert_eq!(r["status"], "accepted", "{r}");
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    let after = r["inbox"]["afterSeq"].as_i64().unwrap();
    let announce = common::wait_until(std::time::Duration::from_secs(150), "the announce", || {
        let h = c.call("sessions_history", json!({"sessionKey": "main", "afterSeq": after}));
        h["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).find(|t| t.starts_with("Status:"))
    });
    (child, announce)
}

/// Issue 35: with no config at all, Claude Code on PATH is discovered, and a spawn with no
/// `agentId` (an unconfigured `main`) runs it through the `claude` preset, with the user's HOME,
/// in the project its MCP client's root names: the child reads the project's README.md and
/// calls `sessions_list` back through this server as itself.
#[test]
fn with_no_config_claude_on_path_is_discovered_and_an_unconfigured_main_runs_it_as_a_child() {
    let Some(claude) = cli_or_skip() else { return };
    let claude = std::fs::canonicalize(&claude).unwrap();
    let (bin, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::os::unix::fs::symlink(&claude, bin.path().join("claude")).unwrap();
    let node_dir = which_dir("node");
    let path = format!("{}:{node_dir}:/usr/bin:/bin", bin.path().display());
    let env = TestEnv::new();
    let port = fake_api();
    let vars = [
        ("PATH", path),
        ("HOME", home.path().display().to_string()),
        ("SESSIONS_MCP_DISCOVERY", "path".to_string()),
        ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
        ("ANTHROPIC_API_KEY", "sk-fake".to_string()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_string()),
        ("DISABLE_AUTOUPDATER", "1".to_string()),
        ("DISABLE_TELEMETRY", "1".to_string()),
    ];
    // The host is started elsewhere and names the user's project as its root.
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("README.md"), format!("{PROJECT_MARK}\n")).unwrap();
    let project_dir = std::fs::canonicalize(project.path()).unwrap();
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut c = common::Client::start_declaring(env.serve_command(None, &vars), json!({"roots": {}}));
    c.set_roots(&[&project_dir]);
    let agents = c.call("agents_list", json!({}));
    assert_eq!(agents["agents"][0]["runner"], "claude", "{agents}");
    assert!(agents["agents"][1]["version"].as_str().is_some_and(|v| v.contains("Claude Code")), "{agents}");
    let r = c.call("sessions_spawn", json!({"task": "READ_AND_LIST"}));
    assert_eq!(r["status"], "accepted", "{r}");
    assert!(r.get("warning").is_none(), "{r}");
    assert_eq!(r["workspace"], json!({"mode": "project", "path": project_dir.display().to_string()}), "{r}");
    let key = r["childSessionKey"].as_str().unwrap();
    let w = c.call("subagents", json!({"action": "wait", "childSessionKeys": [key], "timeoutSeconds": 150}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}"));
    let read = format!("Status: completed successfully\nResult: read: true in {}; listed: ", project_dir.display());
    assert!(outcome.starts_with(&read), "it read the project's README: {outcome}");
    let listed = outcome.split("; listed: ").nth(1).and_then(|r| r.lines().next()).unwrap();
    let listed: Value = serde_json::from_str(listed).unwrap_or_else(|e| panic!("{e}: {outcome}"));
    assert_eq!(common::keys_of(&listed), [key], "it called sessions_list back as itself: {outcome}");
    assert!(!outcome.contains("Warning:"), "{outcome}");
}

/// The directory of `program` on PATH (the Claude Code script needs `node` beside it).
fn which_dir(program: &str) -> String {
    let out = std::process::Command::new("sh").args(["-c", &format!("command -v {program}")]).output().unwrap();
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    path.parent().map(|p| p.display().to_string()).unwrap_or_default()
}

#[test]
fn claude_code_as_a_spawned_child_replies_with_usage_and_cost_and_is_announced() {
    let Some(claude) = cli_or_skip() else { return };
    let (env, vars) = claude_env(&claude, Prompt::Plain, json!({}));
    let mut c = serve(&env, &vars);
    let (child, announce) = spawn_and_wait(&mut c, "Say hello");
    assert!(announce.starts_with("Status: completed successfully"), "{announce}");
    assert!(announce.contains("Result: Hello from the fake API"), "{announce}");
    let show = env.show(&child);
    let reply = show["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").cloned().unwrap();
    assert!(text_of(&reply["content"]).starts_with("Hello from the fake API"), "{reply}");
    assert!(reply["usage"]["outputTokens"].as_i64().is_some_and(|n| n > 0), "usage: {reply}");
    assert!(reply["usage"]["costUsd"].as_f64().is_some_and(|c| c > 0.0), "cost: {reply}");
    assert!(show["session"]["totalTokens"].as_i64().is_some_and(|n| n > 0), "{show}");
}

/// Claude Code hands our sub-agent context to its model as part of the system prompt.
#[test]
fn a_claude_child_gets_the_sub_agent_context_in_its_system_prompt() {
    let Some(claude) = cli_or_skip() else { return };
    let (env, vars) = claude_env(&claude, Prompt::Plain, json!({}));
    let mut c = serve(&env, &vars);
    let (_, announce) = spawn_and_wait(&mut c, "SYSTEM?");
    assert!(announce.contains("Result: sub-agent context in the system prompt: true"), "{announce}");
}

#[test]
fn a_claude_child_allowed_sessions_list_lists_its_own_tree_through_this_server() {
    let Some(claude) = cli_or_skip() else { return };
    // visibility `tree` (the default): a child sees itself and its own children
    let allow = json!({"tools": {"subagents": {"tools": {"allow": ["sessions_list"]}}}});
    let (env, vars) = claude_env(&claude, Prompt::Plain, allow);
    let mut c = serve(&env, &vars);
    let (child, announce) = spawn_and_wait(&mut c, "LIST the sessions");
    assert!(announce.starts_with("Status: completed successfully"), "{announce}");
    // its tree is itself alone: not main, not agent:claude:main
    let listed: Value = serde_json::from_str(
        announce.split("Result: done: ").nth(1).and_then(|r| r.lines().next()).expect("the listing in the Result"),
    )
    .expect("the Result is the sessions_list answer");
    assert_eq!(common::keys_of(&listed), vec![child.clone()], "{announce}");
    let show = env.show(&child);
    let call = common::first_tool_call(show["messages"].as_array().unwrap());
    assert_eq!(call["name"], "mcp__sessions__sessions_list");
}

/// Budgets with the real CLI: a Claude Code child whose model would call a tool [`LOOP_CALLS`]
/// times is stopped when the usage it reports live crosses its token budget, and announced
/// `budget exceeded` with what it spent — over the budget by less than one API message's usage
/// (the CLI runs with `--include-partial-messages`, as the claude preset configures it, so each
/// message's output count arrives as it streams). The API hears from it at most once more (the
/// request already on its way), and no process of its run is left.
#[test]
fn a_claude_child_is_stopped_at_its_token_budget_and_announced_budget_exceeded() {
    let Some(claude) = cli_or_skip() else { return };
    const LIMIT: i64 = 1700;
    let per_message = LOOP_USAGE.0 + LOOP_USAGE.1;
    let (seen, mut requests) = tokio::sync::mpsc::unbounded_channel();
    let allow = json!({"tools": {"subagents": {"tools": {"allow": ["sessions_list"]}}}});
    let port = fake_api_reporting(Some(seen));
    let (env, vars) = claude_env_on(port, &claude, Prompt::Plain, &["--include-partial-messages"], allow);
    let mut c = serve(&env, &vars);
    let spawn = json!({"task": "LOOP over the sessions", "agentId": "claude", "budget": {"tokens": LIMIT}});
    let r = c.call("sessions_spawn", spawn);
    assert_eq!(r["status"], "accepted", "{r}");
    let child = r["childSessionKey"].as_str().unwrap().to_string();
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 120}));
    let finished = &w["finished"][0];
    assert_eq!(finished["runState"], "budget_exceeded", "{w}");
    let outcome = finished["outcome"].as_str().unwrap_or_default();
    let status = outcome.lines().next().unwrap_or_default();
    let shown = status
        .strip_prefix("Status: budget exceeded: ")
        .and_then(|rest| rest.strip_suffix(&format!(" tokens of 1,700 tokens (the budget of {child})")))
        .unwrap_or_else(|| panic!("{outcome}"));
    let spent: i64 = shown.replace(',', "").parse().unwrap();
    eprintln!("spent {spent} tokens of {LIMIT}");
    assert!(spent > LIMIT && spent < LIMIT + per_message, "stopped within one message of the budget: {outcome}");
    assert!(outcome.contains(&format!("budget {shown}/1,700 tokens")), "the Stats line: {outcome}");
    let list = c.call("subagents", json!({"action": "list"}));
    let row = &list["children"][0];
    assert_eq!(row["runState"], "budget_exceeded", "{row}");
    assert_eq!(row["budget"]["spent"], json!({"tokens": spent}), "{row}");
    assert_eq!(row["budget"]["exceeded"], "tokens", "{row}");
    let run = common::runs_of(&env.show(&child), Some("spawn")).pop().unwrap();
    assert_eq!(run["status"], "budget_exceeded", "{run}");
    common::assert_no_process_carries(
        &[run["runId"].as_str().unwrap().to_string()],
        std::time::Duration::from_secs(10),
    );
    let mut asked = 0;
    while let Ok(request) = requests.try_recv() {
        asked += i64::from(is_loop_request(&request));
    }
    eprintln!("the API got {asked} of the loop's requests");
    assert!(asked <= spent / per_message + 1, "{asked} requests for {spent} tokens of {per_message} a message");
    c.close();
}

#[test]
fn claude_code_replies_resumes_its_session_and_calls_our_tools_through_mcp() {
    let Some(claude) = cli_or_skip() else { return };
    let (env, vars) = claude_env(&claude, Prompt::StreamJson, json!({}));
    let mut c = serve(&env, &vars);
    let mut send = |message: &str| {
        let r = c.call("sessions_send", json!({"sessionKey": KEY, "message": message, "timeoutSeconds": 120}));
        assert_eq!(r["status"], "ok", "{message}: {r}");
        r["reply"].as_str().unwrap_or_default().to_string()
    };

    assert_eq!(send("Say hello"), "Hello from the fake API (1 messages)");
    // Resumed natively: the CLI sends the earlier turns (and the announce step's) upstream again.
    let second = send("Again");
    let seen: usize = second
        .strip_prefix("Hello from the fake API (")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{second}"));
    assert!(seen >= 3, "the second turn resumed the first: {second}");
    let third = send("LIST the sessions");
    assert!(third.starts_with("done: ") && third.contains(KEY), "sessions_list answered through MCP: {third}");

    let show = env.show(KEY);
    let messages = show["messages"].as_array().unwrap();
    let call = common::first_tool_call(messages);
    assert_eq!(call["name"], "mcp__sessions__sessions_list");
    let result = messages.iter().find(|m| m["role"] == "toolResult").expect("a toolResult message");
    assert!(text_of(&result["content"]).contains("\"status\""), "{result}");
    let cost = messages.iter().filter_map(|m| m["usage"]["costUsd"].as_f64()).next();
    assert!(cost.is_some_and(|c| c > 0.0), "Claude Code's cost on the reply: {messages:?}");
}

/// Claude Code as the host of our tools, with a model that pages a 60-message transcript
/// backwards: every answer reaches the model whole (valid JSON, within the 10,000-byte budget,
/// never Claude Code's preview), and following `nextBeforeSeq` reads every message exactly once.
#[test]
fn claude_code_hands_every_page_to_its_model_whole_and_paging_reads_every_message_once() {
    let Some(claude) = cli_or_skip() else { return };
    let (env, vars) = claude_env(&claude, Prompt::Plain, json!({}));
    let long: Vec<Value> =
        (0..60).map(|i| json!({"role": "user", "content": format!("{i} {}", "z".repeat(800))})).collect();
    // In the tree of the child's session, so the default visibility lets it read the transcript.
    env.seed(json!({"sessions": [{"key": BIG, "spawnedBy": KEY, "messages": long}]}));
    let mut c = serve(&env, &vars);
    let r = c.call("sessions_send", json!({"sessionKey": KEY, "message": "PAGE through it", "timeoutSeconds": 120}));
    assert_eq!(r["status"], "ok", "{r}");
    let reply = r["reply"].as_str().unwrap_or_default();
    let report: Value =
        serde_json::from_str(reply.strip_prefix("paged: ").unwrap_or_else(|| panic!("{reply}"))).unwrap();
    eprintln!("what Claude Code handed its model: {report}");
    let results = report["results"].as_u64().unwrap();
    assert!(results > 4, "the transcript took several pages: {report}");
    assert_eq!(report["whole"], results, "every answer reached the model as whole JSON: {report}");
    assert!(report["largest"].as_u64().unwrap() <= 10_000, "{report}");
    assert_eq!(report["seqs"], json!((1..=60).collect::<Vec<i64>>()), "every message exactly once");
}

/// A Claude Code run at the runner level, steerable: `--input-format stream-json`, against a fake
/// API that reports each request; the steer sender, the API's requests, the run and its workdir.
struct SteeredRun {
    steers: UnboundedSender<sessions_mcp::runner::Steer>,
    requests: tokio::sync::mpsc::UnboundedReceiver<Value>,
    run: tokio::task::JoinHandle<sessions_mcp::runner::Outcome>,
    workdir: PathBuf,
    _dir: tempfile::TempDir,
}

impl SteeredRun {
    /// With Bash allowed.
    fn start(claude: &PathBuf, prompt: &str) -> Self {
        Self::start_with(claude, prompt, &["--tools", "Bash", "--allowedTools", "Bash"], None)
    }

    /// With `tool_args` for Claude Code's tools and permissions, handing its input requests to
    /// `asks` (None: the run cannot ask).
    fn start_with(
        claude: &PathBuf,
        prompt: &str,
        tool_args: &[&str],
        asks: Option<UnboundedSender<sessions_mcp::runner::InputRequest>>,
    ) -> Self {
        let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
        let port = fake_api_reporting(Some(seen));
        let dir = tempfile::tempdir().unwrap();
        let (workdir, home) = (dir.path().join("work"), dir.path().join("home"));
        std::fs::create_dir_all(&workdir).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        let mut args = json!([
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            "claude-sonnet-4-5"
        ]);
        args.as_array_mut().unwrap().extend(tool_args.iter().map(|a| json!(a)));
        let runner = json!({"kind": "claude-stream-json", "command": claude, "args": args, "timeoutSeconds": 120});
        let config = json!({"agents": {"list": [{"id": "claude", "workspace": workdir, "runner": runner}]}});
        let spec = common::runner::spec(&config, "claude");
        let env = [
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            ("HOME", home.display().to_string()),
            ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
            ("ANTHROPIC_API_KEY", "sk-fake".to_string()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_string()),
            ("DISABLE_AUTOUPDATER", "1".to_string()),
            ("DISABLE_TELEMETRY", "1".to_string()),
        ];
        let env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let (steers, rx) = tokio::sync::mpsc::unbounded_channel();
        let input = sessions_mcp::runner::Input::Prompt(prompt.to_string());
        let cancel = tokio_util::sync::CancellationToken::new();
        let run =
            tokio::spawn(async move { common::runner::execute_asking(&spec, input, env, rx, asks, cancel).await });
        SteeredRun { steers, requests, run, workdir, _dir: dir }
    }

    /// The run's outcome, and every request the API got.
    async fn finish(mut self) -> (sessions_mcp::runner::Outcome, Vec<Value>) {
        let outcome = self.run.await.unwrap();
        let mut requests = Vec::new();
        while let Ok(r) = self.requests.try_recv() {
            requests.push(r);
        }
        (outcome, requests)
    }
}

/// The request that carried the steer (there must be exactly one) and its last message.
fn steered_request(requests: &[Value]) -> (&Value, &Value) {
    let carrying: Vec<&Value> = requests.iter().filter(|r| r["messages"].to_string().contains(STEER)).collect();
    assert_eq!(carrying.len(), 1, "one request carried the steer: {requests:?}");
    (carrying[0], carrying[0]["messages"].as_array().unwrap().last().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_steer_written_while_claude_code_runs_a_tool_reaches_its_model_in_the_same_turn() {
    let Some(claude) = cli_or_skip() else { return };
    let run = SteeredRun::start(&claude, "SLEEP first, then answer");
    let started = run.workdir.join("tool-started");
    common::wait_until(std::time::Duration::from_secs(60), "the Bash tool to start", || started.exists().then_some(()));
    assert!(common::runner::steer(&run.steers, STEER).await, "the steer went in");
    let (outcome, requests) = run.finish().await;
    assert_eq!(outcome.status, sessions_mcp::runner::RunStatus::Ok, "{outcome:?}");
    assert_eq!(outcome.reply.as_deref(), Some("Steered: PINEAPPLE (3 messages)"));
    // Claude Code hands the steer to its model beside the tool's result, within the turn.
    let (request, last) = steered_request(&requests);
    assert_eq!(request["messages"].as_array().unwrap().len(), 3, "{request}");
    let result = &last["content"][0];
    assert_eq!(result["type"], "tool_result", "{last}");
    let output = result["content"].as_str().map_or_else(|| text_of(&result["content"]), String::from);
    assert!(output.starts_with("slept") && output.contains(STEER), "{output}");
    let assistant: Vec<String> =
        outcome.messages.iter().filter(|m| m.role == "assistant").map(|m| m.content.to_string()).collect();
    assert!(assistant.iter().all(|t| !t.contains("Hello from the fake API")), "one turn only: {assistant:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_steer_written_while_the_answer_is_on_its_way_runs_as_a_second_turn_whose_result_is_the_runs() {
    let Some(claude) = cli_or_skip() else { return };
    let mut run = SteeredRun::start(&claude, "WAIT, then say hello");
    let first = tokio::time::timeout(std::time::Duration::from_secs(60), run.requests.recv()).await;
    assert!(first.is_ok_and(|r| r.is_some()), "the first request reached the fake API");
    // The fake holds its answer for 4 s: the steer arrives while the first turn is under way.
    assert!(common::runner::steer(&run.steers, STEER).await, "the steer went in");
    let (outcome, requests) = run.finish().await;
    assert_eq!(outcome.status, sessions_mcp::runner::RunStatus::Ok, "{outcome:?}");
    assert_eq!(outcome.reply.as_deref(), Some("Steered: PINEAPPLE (3 messages)"));
    let replies: Vec<String> = outcome.messages.iter().map(|m| text_of(&m.content)).collect();
    assert_eq!(replies, ["Hello from the fake API (1 messages)", "Steered: PINEAPPLE (3 messages)"]);
    // The steer is the second turn's user message, after the first turn's answer.
    let (_, last) = steered_request(&requests);
    assert_eq!(last["role"], "user");
    assert!(text_of(&last["content"]).contains(STEER), "{last}");
    let usage = outcome.usage.expect("usage");
    assert_eq!(usage["outputTokens"], 12, "both turns' tokens: {usage}");
}

/// Through the tool, end to end: a running Claude Code child steered with `subagents` takes the
/// steer within its run and announces the steered answer.
#[test]
fn a_claude_child_steered_with_subagents_announces_the_steered_answer() {
    let Some(claude) = cli_or_skip() else { return };
    let (env, vars) = claude_env(&claude, Prompt::StreamJson, json!({}));
    let mut c = serve(&env, &vars);
    let r = c.call("sessions_spawn", json!({"task": "WAIT, then say hello", "agentId": "claude"}));
    let child = r["childSessionKey"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
    common::wait_until(std::time::Duration::from_secs(60), "the child to run", || {
        let l = c.call("subagents", json!({"action": "list"}));
        (l["children"][0]["runState"] == "running").then_some(())
    });
    let s = c.call("subagents", json!({"action": "steer", "childSessionKey": child, "message": STEER}));
    assert_eq!(s["targetDisposition"], "steered", "{s}");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 150}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}"));
    assert!(outcome.starts_with("Status: completed successfully\nResult: Steered: PINEAPPLE"), "{outcome}");
    let show = env.show(&child);
    assert!(common::runs_of(&show, Some("steer")).is_empty(), "taken within the run: {}", show["runs"]);
    let steer = show["messages"].as_array().unwrap().iter().find(|m| m["provenance"]["sourceTool"] == "subagents");
    assert!(steer.is_some_and(|m| text_of(&m["content"]) == STEER), "{}", show["messages"]);
}

/// Claude Code as the host of `subagents`: its model spawns a child and waits for it with one
/// call, and the wait's answer — the child's outcome inline — reaches the model whole.
#[test]
fn claude_code_hands_a_subagents_wait_with_the_childs_outcome_to_its_model_whole() {
    let Some(claude) = cli_or_skip() else { return };
    let (env, vars) = claude_env(&claude, Prompt::StreamJson, json!({}));
    let mut c = serve(&env, &vars);
    let r = c.call("sessions_send", json!({"sessionKey": KEY, "message": "DELEGATE", "timeoutSeconds": 240}));
    assert_eq!(r["status"], "ok", "{r}");
    let reply = r["reply"].as_str().unwrap_or_default();
    let seen = reply.strip_prefix("waited: ").unwrap_or_else(|| panic!("{reply}"));
    let answer: Value = serde_json::from_str(seen).unwrap_or_else(|e| panic!("the model got whole JSON ({e}): {seen}"));
    assert_eq!(answer["status"], "ok", "{answer}");
    let outcome = answer["finished"][0]["outcome"].as_str().unwrap_or_default();
    assert!(outcome.starts_with("Status: completed successfully\nResult: Hello from the fake API"), "{answer}");
}

/// Claude Code started with `--permission-prompt-tool stdio` asks its host before a tool that
/// needs permission (`Write`, not allowed outright): the runner hands the prompt on as an
/// approval request and writes the answer back into the same run. Allowed, the file is written;
/// denied, the model gets the denial's text as the tool's result.
#[tokio::test(flavor = "multi_thread")]
async fn claude_codes_permission_prompt_on_stdio_is_an_approval_request_answered_within_the_run() {
    let Some(claude) = cli_or_skip() else { return };
    let prompt_tool = ["--tools", "Write", "--permission-prompt-tool", "stdio"];
    for (decision, text, reply) in [
        (sessions_mcp::runner::Decision::Allow, None, "wrote: yes".to_string()),
        (
            sessions_mcp::runner::Decision::Deny,
            Some("Not in this directory"),
            "wrote: no (Not in this directory)".into(),
        ),
    ] {
        let (asks, mut requests) = tokio::sync::mpsc::unbounded_channel();
        let mut run = SteeredRun::start_with(&claude, "WRITE a file", &prompt_tool, Some(asks));
        let request = tokio::time::timeout(std::time::Duration::from_secs(60), requests.recv())
            .await
            .expect("Claude Code asked in time")
            .expect("Claude Code asked");
        assert_eq!(request.kind, sessions_mcp::runner::InputKind::Approval);
        assert_eq!(request.text, format!("Claude Code asks to use Write: {WRITTEN}"));
        let details = request.details.clone().unwrap_or_default();
        assert_eq!((details["toolName"].as_str(), details["toolUseId"].as_str()), (Some("Write"), Some("toolu_write")));
        let written = run.workdir.join(WRITTEN);
        assert!(!written.exists(), "nothing is written before the answer");
        let answer = sessions_mcp::runner::InputAnswer { decision, text: text.map(String::from) };
        assert!(request.answer.send(answer).is_ok(), "the run waited for the answer");
        // Awaited in place: `finish` would remove the workdir with the run.
        let outcome = (&mut run.run).await.unwrap();
        assert_eq!(outcome.status, sessions_mcp::runner::RunStatus::Ok, "{outcome:?}");
        assert_eq!(outcome.reply.as_deref(), Some(reply.as_str()));
        assert_eq!(written.exists(), decision == sessions_mcp::runner::Decision::Allow);
    }
}

/// Without a way to ask (`--permission-prompt-tool` not given), Claude Code in `-p` mode denies
/// a tool that needs permission at once, and its model is told so.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_permission_prompt_tool_claude_code_denies_a_write_at_once() {
    let Some(claude) = cli_or_skip() else { return };
    let mut run = SteeredRun::start_with(&claude, "WRITE a file", &["--tools", "Write"], None);
    let written = run.workdir.join(WRITTEN);
    let outcome = (&mut run.run).await.unwrap();
    assert_eq!(outcome.status, sessions_mcp::runner::RunStatus::Ok, "{outcome:?}");
    let reply = outcome.reply.unwrap_or_default();
    assert!(reply.starts_with("wrote: no (Claude requested permissions to write to"), "{reply}");
    assert!(!written.exists());
}

/// End to end through the tree: a Claude Code child's permission prompt reaches its requester as
/// a `subagents` attention, the requester allows, and the write happens in the same run.
#[test]
fn a_claude_childs_permission_prompt_is_answered_by_its_requester_through_subagents() {
    let Some(claude) = cli_or_skip() else { return };
    let (env, vars) = claude_env(&claude, Prompt::AskToWrite, json!({}));
    let mut c = serve(&env, &vars);
    let r = c.call("sessions_spawn", json!({"task": "WRITE a file", "agentId": "claude"}));
    assert_eq!(r["status"], "accepted", "{r}");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 120}));
    assert_eq!(w["status"], "attention", "{w}");
    let request = &w["requests"][0];
    assert_eq!(request["details"]["toolName"], "Write", "{request}");
    let ok = c.call("subagents", json!({"action": "respond", "requestId": request["requestId"], "decision": "allow"}));
    assert_eq!(ok["status"], "ok", "{ok}");
    let w = c.call("subagents", json!({"action": "wait", "timeoutSeconds": 120}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}"));
    assert!(outcome.starts_with("Status: completed successfully\nResult: wrote: yes"), "{outcome}");
}

/// Claude Code as the host of `env`'s server, against the fake API on `port`, in the isolated
/// `home`: `-p`, then `args`, with stream-json output.
fn claude_host(
    claude: &std::path::Path,
    env: &TestEnv,
    port: u16,
    home: &std::path::Path,
    args: &[&str],
) -> std::process::Command {
    let serve = env.command(&["serve"]);
    let serve_args: Vec<String> = serve.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    let mcp =
        json!({"mcpServers": {"sessions": {"command": serve.get_program().to_string_lossy(), "args": serve_args}}});
    let mcp_file = env.write_file("host-mcp.json", &mcp.to_string());
    let mut host = std::process::Command::new(claude);
    // `args` right after -p: a prompt there is not taken for another --mcp-config file.
    host.arg("-p")
        .args(args)
        .args(["--output-format", "stream-json", "--verbose"])
        .args(["--model", "claude-sonnet-4-5", "--tools", "", "--strict-mcp-config", "--allowedTools", "mcp__sessions"])
        .arg("--mcp-config")
        .arg(&mcp_file)
        .env("HOME", home)
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}"))
        .env("ANTHROPIC_API_KEY", "sk-fake")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .stderr(std::process::Stdio::null());
    host
}

/// What the fake model saw its `subagents wait` answer (`waited: <json>`), from Claude Code's
/// `result` event.
fn waited(result: &Value) -> Value {
    let reply = result["result"].as_str().unwrap_or_default();
    let seen = reply.strip_prefix("waited: ").unwrap_or_else(|| panic!("{result}"));
    serde_json::from_str(seen).unwrap_or_else(|e| panic!("the model got whole JSON ({e}): {seen}"))
}

/// Claude Code as the host (an external root over stdio, protocol 2026-07-28): its sub-agent asks
/// for approval while the model waits with `subagents`; our server answers the wait
/// `input_required` with an elicitation, Claude Code hands it to its own host (a `control_request`
/// of subtype `elicitation` on its stream-json stdout: here the test, as a person would answer in
/// its UI), and retries the wait with the answer, which reaches the child in the same run; the
/// model gets the child's outcome, which says a person at Claude Code answered.
#[test]
fn claude_code_as_the_host_shows_a_sub_agents_approval_as_an_elicitation_and_the_answer_reaches_the_child() {
    use std::io::{BufRead, BufReader};
    let Some(claude) = cli_or_skip() else { return };
    let port = fake_api();
    let env = crate::asks::env_with(json!({}));
    let home = tempfile::tempdir().unwrap();
    let mut host = claude_host(&claude, &env, port, home.path(), &["--input-format", "stream-json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = host.stdin.take().unwrap();
    let prompt = json!({"type": "user", "message": {"role": "user", "content": "ASK HOST"}});
    writeln!(stdin, "{prompt}").unwrap();
    let mut asked = Vec::new();
    let mut result = None;
    for line in BufReader::new(host.stdout.take().unwrap()).lines() {
        let Ok(event) = serde_json::from_str::<Value>(&line.unwrap()) else { continue };
        if event["type"] == "control_request" && event["request"]["subtype"] == "elicitation" {
            asked.push(event["request"].clone());
            let answer = json!({"action": "accept", "content": {"decision": "allow", "text": "from the host"}});
            let reply = json!({"type": "control_response",
                               "response": {"subtype": "success", "request_id": event["request_id"], "response": answer}});
            writeln!(stdin, "{reply}").unwrap();
        } else if event["type"] == "result" {
            result = Some(event);
            break;
        }
    }
    drop(stdin);
    let _ = host.wait();
    assert_eq!(asked.len(), 1, "one elicitation: {asked:?}");
    let message = asked[0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("asks for approval: May I write ask for a.txt?"), "{asked:?}");
    let answer = waited(&result.expect("Claude Code ended its turn"));
    assert_eq!(answer["status"], "ok", "{answer}");
    let outcome = answer["finished"][0]["outcome"].as_str().unwrap_or_default();
    assert!(outcome.contains("Result: decision=allow answer=from the host"), "{answer}");
    assert!(outcome.contains(": allow by a person at claude-code"), "who answered: {outcome}");
}

/// Claude Code `-p` with no host behind it cancels the elicitation by itself: that is no person's
/// answer. The child is not denied; the transcript records that the host answered unseen, and the
/// model's wait tells it the approval is now its to answer (no person is reachable).
#[test]
fn claude_code_print_mode_cancels_unseen_and_the_approval_falls_to_the_model_not_denied() {
    let Some(claude) = cli_or_skip() else { return };
    let port = fake_api();
    // A generous threshold: Claude Code's own cancel is fast, but this machine may be loaded.
    let env = crate::asks::env_with(json!({"approvals": {"autoAnswerMs": 10000}}));
    let home = tempfile::tempdir().unwrap();
    let out = claude_host(&claude, &env, port, home.path(), &["ASK HOST"])
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["type"] == "result")
        .unwrap_or_else(|| panic!("no result event: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    let answer = waited(&result);
    assert_eq!(answer["status"], "attention", "{answer}");
    assert_eq!(answer["requests"][0]["waitsFor"], "you", "no person at claude -p: {answer}");
    let child = answer["requests"][0]["childSessionKey"].as_str().unwrap();
    let texts: Vec<String> =
        env.show(child)["messages"].as_array().unwrap().iter().map(|m| text_of(&m["content"])).collect();
    assert!(texts.iter().any(|t| t.contains("answered it by itself in ")), "{texts:?}");
    assert!(!texts.iter().any(|t| t.starts_with("[answer to ")), "nothing answered, nothing denied: {texts:?}");
}
