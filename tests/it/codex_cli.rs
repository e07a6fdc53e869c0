//! The real OpenAI Codex CLI as a `codex-exec-json` agent, offline: a fake OpenAI Responses API on
//! loopback (below) answers it, configured as a custom model provider (`-c model_providers.fake=…`).
//! A send that replies with usage and stores Codex's thread id; a second send that resumes that
//! thread (`resumeArgs`: `exec … resume <id> -`, so the API sees the earlier turn); a turn in which
//! Codex runs a shell command whose call and result land in the transcript; a turn in which Codex
//! calls the server's own `sessions_list` through the `sessions-mcp connect` the server wired in
//! (with no run token in any process's argv); and a turn the API refuses, which ends the run
//! `error` with the API's message.
//!
//! The CLI is `SESSIONS_MCP_CODEX`, else `codex` on PATH (`.ci/run --extended` installs npm
//! `@openai/codex`). Without it the test prints why and passes — except in CI's extended tier
//! (`CI` and `SESSIONS_MCP_EXTENDED` set), where it fails.

use crate::common;

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::{TestEnv, agents_config, text_of};
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};

const KEY: &str = "agent:codex:main";
/// The namespace Codex puts the `sessions` MCP server's tools in, for the model.
const NAMESPACE: &str = "mcp__sessions";

/// What the fake API saw: the request bodies in order, and the command line of every process
/// alive when a request came in (Codex and its MCP servers are running then).
#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<Vec<Value>>>,
    cmdlines: Arc<Mutex<Vec<String>>>,
}

/// A fake Responses API: `POST /v1/responses` streams one deterministic output item, from the
/// request's input: after a function call's output → "done: <its output>"; the announce step →
/// ANNOUNCE_SKIP; a user message with ERROR → HTTP 400 with an error body; LIST → a call to our
/// `sessions_list` MCP tool (in the `mcp__sessions` namespace); TOOL → an `exec_command` call;
/// anything else → "Hello from the fake Responses API (<n> earlier replies)", n counting the
/// assistant messages it was sent.
fn fake_api() -> (u16, Seen) {
    let seen = Seen::default();
    let log = seen.clone();
    (common::loopback_server(move |stream| answer(stream, &log)), seen)
}

/// Every process's command line, its arguments joined by spaces.
fn cmdlines() -> Vec<String> {
    let procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    procs
        .filter_map(|p| std::fs::read(p.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .collect()
}

fn answer(stream: TcpStream, log: &Seen) {
    let Some((request_line, body)) = common::read_http_request(&stream) else { return };
    let mut out = stream;
    if !request_line.starts_with("POST /v1/responses ") {
        let _ = out.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
    }
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    log.requests.lock().unwrap().push(request.clone());
    log.cmdlines.lock().unwrap().extend(cmdlines());
    let _ = out.write_all(reply(&request).as_bytes());
}

/// The whole HTTP response to one `/v1/responses` request.
fn reply(request: &Value) -> String {
    let input = request["input"].as_array().cloned().unwrap_or_default();
    let last = input.iter().rev().find(|i| i["type"] == "function_call_output" || i["role"] == "user");
    let last = last.cloned().unwrap_or_default();
    let earlier = input.iter().filter(|i| i["role"] == "assistant").count();
    let user_text = input_text(&last);
    let item = if let Some(item) = paging_item(&input, &last) {
        item
    } else if let Some(item) = read_list_item(request, &input) {
        item
    } else if last["type"] == "function_call_output" {
        let output = last["output"].as_str().unwrap_or_default();
        let output = output.split("Output:\n").last().unwrap_or_default().trim();
        message(&format!("done: {output}"))
    } else if user_text.contains("Agent-to-agent announce step") {
        message("ANNOUNCE_SKIP")
    } else if user_text.contains("ERROR") {
        let body = json!({"error": {"message": "the fake API refuses: ERROR", "type": "invalid_request_error"}});
        let body = body.to_string();
        return format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    } else if user_text.contains("LIST") {
        sessions_list_call(request, "call_2")
    } else if user_text.contains("TOOL") {
        json!({"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
               "name": "exec_command", "arguments": json!({"cmd": "echo tool-output"}).to_string()})
    } else {
        message(&format!("Hello from the fake Responses API ({earlier} earlier replies)"))
    };
    let mut events = vec![
        json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
    ];
    if let Some(text) = item.pointer("/content/0/text") {
        events.push(json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
                           "item_id": item["id"], "delta": text}));
    }
    events.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    events.push(json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed",
        "output": [], "usage": {"input_tokens": 42, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 49}}}));
    let stream: String =
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
    format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{stream}")
}

/// What the project's README.md starts with in [`read_list_item`]'s test.
const PROJECT_MARK: &str = "# The user's project";

/// The call to our `sessions_list` as Codex advertised it (a namespace of the server's tools),
/// else a message saying it was not offered.
fn sessions_list_call(request: &Value, call_id: &str) -> Value {
    let tools = request["tools"].as_array().cloned().unwrap_or_default();
    let namespace = tools.iter().find(|t| t["type"] == "namespace" && t["name"] == NAMESPACE);
    let listed = namespace.and_then(|n| n["tools"].as_array()).into_iter().flatten();
    match listed.filter_map(|t| t["name"].as_str()).find(|n| *n == "sessions_list") {
        Some(name) => json!({"id": format!("fc_{call_id}"), "type": "function_call", "status": "completed",
                             "call_id": call_id, "namespace": NAMESPACE, "name": name, "arguments": "{}"}),
        None => message(&format!("no {NAMESPACE} namespace with sessions_list in {}", json!(tools))),
    }
}

/// A model that reads the project and calls back: after a user turn with READ_AND_LIST it runs
/// `head -n 1 README.md` in its working directory, then calls our `sessions_list`, then answers
/// `read: <whether the README started with PROJECT_MARK>; listed: <the list's text>`.
fn read_list_item(request: &Value, input: &[Value]) -> Option<Value> {
    if !input.iter().any(|i| i["role"] == "user" && input_text(i).contains("READ_AND_LIST")) {
        return None;
    }
    let outputs: Vec<&str> = input
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].as_str().unwrap_or_default())
        .map(|o| o.split("Output:\n").last().unwrap_or_default().trim())
        .collect();
    Some(match outputs.len() {
        0 => json!({"id": "fc_read", "type": "function_call", "status": "completed", "call_id": "call_read",
                    "name": "exec_command", "arguments": json!({"cmd": "head -n 1 README.md"}).to_string()}),
        1 => sessions_list_call(request, "call_list"),
        _ => message(&format!("read: {}; listed: {}", outputs[0].contains(PROJECT_MARK), outputs[1])),
    })
}

/// The session a PAGE turn reads, page by page, backwards from its newest message.
const BIG: &str = "agent:codex:big";

/// A model that pages: after a user turn with PAGE it calls `sessions_history` on [`BIG`], then
/// follows each answer's `nextBeforeSeq` until there is none, and says "paged".
fn paging_item(input: &[Value], last: &Value) -> Option<Value> {
    let answers_a_page = last["call_id"].as_str().is_some_and(|id| id.starts_with("call_page_"));
    if !(answers_a_page || last["role"] == "user" && input_text(last).contains("PAGE")) {
        return None;
    }
    let outputs = page_outputs(input);
    let next = match outputs.last() {
        None => Some(json!({"sessionKey": BIG})),
        Some(page) => page
            .as_ref()
            .ok()
            .and_then(|p| p["nextBeforeSeq"].as_i64())
            .map(|n| json!({"sessionKey": BIG, "beforeSeq": n})),
    };
    Some(match next {
        Some(arguments) => {
            json!({"id": format!("fc_page_{}", outputs.len()), "type": "function_call", "status": "completed",
            "call_id": format!("call_page_{}", outputs.len()), "namespace": NAMESPACE, "name": "sessions_history",
            "arguments": arguments.to_string()})
        }
        None => message("paged"),
    })
}

/// The paging calls' outputs as the model received them: the JSON after Codex's `Output:`
/// header, or the raw text when it is not JSON.
fn page_outputs(input: &[Value]) -> Vec<Result<Value, String>> {
    input
        .iter()
        .filter(|i| {
            i["type"] == "function_call_output" && i["call_id"].as_str().is_some_and(|id| id.starts_with("call_page_"))
        })
        .map(|i| {
            let output = i["output"].as_str().unwrap_or_default();
            let json = output.split("Output:\n").last().unwrap_or_default().trim();
            serde_json::from_str(json).map_err(|_| output.to_string())
        })
        .collect()
}

/// The text of a Responses API input message (its `input_text` / `output_text` parts).
fn input_text(item: &Value) -> String {
    item["content"].as_array().into_iter().flatten().filter_map(|c| c["text"].as_str()).collect()
}

fn last_user_text(request: &Value) -> String {
    let input = request["input"].as_array().cloned().unwrap_or_default();
    input.iter().rev().find(|i| i["role"] == "user").map(input_text).unwrap_or_default()
}

fn message(text: &str) -> Value {
    json!({"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// The CLI, or None after saying why the test is skipped (a failure in CI's extended tier).
fn cli_or_skip() -> Option<PathBuf> {
    common::real_cli_or_skip("SESSIONS_MCP_CODEX", "codex", "Codex")
}

/// A served env whose agent `codex` is the real CLI against a fake API, and that API's log.
fn codex_env(codex: &PathBuf) -> (TestEnv, common::Client, Seen) {
    let (port, seen) = fake_api();
    let mut env = TestEnv::new();
    let provider = format!(
        r#"model_providers.fake={{name="fake", base_url="http://127.0.0.1:{port}/v1", env_key="CODEX_API_KEY", wire_api="responses"}}"#
    );
    // The run's HOME is under the test's temporary directory, where Codex will not set up its
    // sandbox helper; the commands it runs here are the fake API's `echo`.
    let flags = ["--json", "--skip-git-repo-check", "--sandbox", "danger-full-access", "-m", "gpt-5", "-c"];
    let mut args: Vec<Value> = std::iter::once("exec").chain(flags).map(Value::from).collect();
    args.extend([json!("model_provider=fake"), json!("-c"), json!(provider)]);
    let mut resume_args = args.clone();
    args.push(json!("-"));
    resume_args.extend([json!("resume"), json!("{externalSessionId}"), json!("-")]);
    let runner = json!({
        "kind": "codex-exec-json",
        "command": codex,
        "args": args,
        "resumeArgs": resume_args,
        "env": {"passthrough": ["CODEX_API_KEY"]},
        "timeoutSeconds": 120,
    });
    env.set_config(&agents_config(vec![json!({"id": "main"}), json!({"id": "codex", "runner": runner})], json!({})));
    env.seed(json!({"sessions": [{"key": KEY}]}));
    let c = env.serve_with(None, &[("CODEX_API_KEY", "sk-fake")]);
    (env, c, seen)
}

fn send(c: &mut common::Client, message: &str) -> Value {
    c.call("sessions_send", json!({"sessionKey": KEY, "message": message, "timeoutSeconds": 120}))
}

fn stored_thread_id(env: &TestEnv) -> Option<String> {
    let db =
        Connection::open_with_flags(env.state_dir().join("sessions.db"), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    db.query_row("SELECT external_session_id FROM sessions WHERE key = ?1", [KEY], |r| r.get(0)).unwrap()
}

/// Codex names its thread as the prompt cache key of every request in it.
fn thread_of(request: &Value) -> String {
    request["prompt_cache_key"].as_str().unwrap_or_else(|| panic!("no prompt_cache_key: {request}")).to_string()
}

/// Issue 35: with no config of ours, Codex on PATH is discovered, and a spawn of agent `codex` runs
/// in the project its MCP client's root names, reads its README.md and calls `sessions_list` back
/// as itself; it runs
/// it through the `codex` preset with the user's own Codex home (here its config.toml names the
/// fake provider, as a user's would name theirs).
#[test]
fn with_no_config_codex_on_path_is_discovered_and_a_spawn_runs_it_with_the_users_codex_home() {
    let Some(codex) = cli_or_skip() else { return };
    let codex = std::fs::canonicalize(&codex).unwrap();
    let (bin, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::os::unix::fs::symlink(&codex, bin.path().join("codex")).unwrap();
    let (port, _seen) = fake_api();
    let codex_home = home.path().join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    let config = format!(
        "model = \"gpt-5\"\nmodel_provider = \"fake\"\n[model_providers.fake]\nname = \"fake\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nenv_key = \"CODEX_API_KEY\"\nwire_api = \"responses\"\n"
    );
    std::fs::write(codex_home.join("config.toml"), config).unwrap();
    let node = std::process::Command::new("sh").args(["-c", "command -v node"]).output().unwrap();
    let node_dir = PathBuf::from(String::from_utf8_lossy(&node.stdout).trim()).parent().unwrap().to_path_buf();
    let path = format!("{}:{}:/usr/bin:/bin", bin.path().display(), node_dir.display());
    let env = TestEnv::new();
    let home = home.path().display().to_string();
    let vars = [
        ("PATH", path.as_str()),
        ("HOME", home.as_str()),
        ("SESSIONS_MCP_DISCOVERY", "path"),
        ("CODEX_API_KEY", "sk-fake"),
    ];
    // The host is started elsewhere and names the user's project as its root.
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("README.md"), format!("{PROJECT_MARK}\n")).unwrap();
    let project_dir = std::fs::canonicalize(project.path()).unwrap();
    let mut c = common::Client::start_declaring(env.serve_command(None, &vars), json!({"roots": {}}));
    c.set_roots(&[&project_dir]);
    let agents = c.call("agents_list", json!({}));
    assert_eq!(agents["agents"][0]["runner"], "codex", "main runs the one CLI found: {agents}");
    let r = c.call("sessions_spawn", json!({"task": "READ_AND_LIST", "agentId": "codex"}));
    assert_eq!(r["status"], "accepted", "{r}");
    assert_eq!(r["workspace"], json!({"mode": "project", "path": project_dir.display().to_string()}), "{r}");
    let key = r["childSessionKey"].as_str().unwrap();
    let w = c.call("subagents", json!({"action": "wait", "childSessionKeys": [key], "timeoutSeconds": 150}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}"));
    assert!(outcome.starts_with("Status: completed successfully\nResult: read: true; listed: "), "{outcome}");
    let listed = outcome.split("; listed: ").nth(1).and_then(|r| r.lines().next()).unwrap();
    let listed: Value = serde_json::from_str(listed).unwrap_or_else(|e| panic!("{e}: {outcome}"));
    assert_eq!(common::keys_of(&listed), [key], "it called sessions_list back as itself: {outcome}");
}

#[test]
fn codex_replies_with_usage_and_its_second_turn_resumes_its_own_thread() {
    let Some(codex) = cli_or_skip() else { return };
    let (env, mut c, seen) = codex_env(&codex);
    let requests = seen.requests;

    let first = send(&mut c, "Say hello");
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["reply"], "Hello from the fake Responses API (0 earlier replies)");
    let thread = thread_of(&requests.lock().unwrap()[0]);
    assert_eq!(stored_thread_id(&env).as_deref(), Some(thread.as_str()), "Codex's thread id is the session's");
    let show = env.show(KEY);
    let reply = show["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").cloned().unwrap();
    assert_eq!((reply["usage"]["inputTokens"].as_i64(), reply["usage"]["outputTokens"].as_i64()), (Some(42), Some(7)));

    // Resumed natively: the same thread, and the API is sent the first turn's reply again (with
    // the announce step's ANNOUNCE_SKIP when that step ran first: it runs after the send answers).
    let second = send(&mut c, "Again");
    assert_eq!(second["status"], "ok", "{second}");
    assert!(second["reply"].as_str().is_some_and(|r| r.starts_with("Hello from the fake Responses API")), "{second}");
    let requests = requests.lock().unwrap();
    let again = requests.iter().find(|r| last_user_text(r).ends_with("Again")).expect("the second turn's request");
    let replies: Vec<String> =
        again["input"].as_array().unwrap().iter().filter(|i| i["role"] == "assistant").map(input_text).collect();
    assert_eq!(replies.first().map(String::as_str), Some("Hello from the fake Responses API (0 earlier replies)"));
    assert!(requests.iter().all(|r| thread_of(r) == thread), "every turn resumed the first's thread");
    assert_eq!(stored_thread_id(&env), Some(thread));
    // Codex reports the thread's running totals (42, 84, 126, … in); each turn records its own.
    let show = env.show(KEY);
    let usages: Vec<(Option<i64>, Option<i64>)> = show["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["usage"].is_object())
        .map(|m| (m["usage"]["inputTokens"].as_i64(), m["usage"]["outputTokens"].as_i64()))
        .collect();
    assert!(usages.len() >= 2, "a usage per turn: {usages:?}");
    assert!(usages.iter().all(|u| *u == (Some(42), Some(7))), "each turn's own usage: {usages:?}");
}

#[test]
fn a_command_codex_runs_lands_in_the_transcript_as_a_call_and_its_result() {
    let Some(codex) = cli_or_skip() else { return };
    let (env, mut c, _) = codex_env(&codex);
    let r = send(&mut c, "Run a TOOL please");
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["reply"], "done: tool-output");

    let messages = env.show(KEY)["messages"].as_array().cloned().unwrap();
    let call = common::first_tool_call(&messages);
    assert_eq!(call["name"], "command_execution");
    assert!(call["arguments"]["command"].as_str().is_some_and(|c| c.contains("echo tool-output")), "{call}");
    let result = messages.iter().find(|m| m["role"] == "toolResult").expect("a toolResult message");
    assert_eq!(text_of(&result["content"]).trim(), "tool-output", "{result}");
}

#[test]
fn a_request_the_api_refuses_ends_the_run_as_an_error_with_the_apis_message() {
    let Some(codex) = cli_or_skip() else { return };
    let (env, mut c, _) = codex_env(&codex);
    let r = send(&mut c, "ERROR please");
    assert_eq!(r["status"], "error", "{r}");
    assert!(r["error"].as_str().is_some_and(|e| e.contains("the fake API refuses: ERROR")), "{r}");
    let run = common::runs_of(&env.show(KEY), Some("send")).pop().expect("the run");
    assert_eq!(run["status"], "error", "{run}");
    assert!(run["error"].as_str().is_some_and(|e| e.contains("the fake API refuses: ERROR")), "{run}");
}

#[test]
fn codex_calls_the_servers_own_tools_through_connect_and_the_token_stays_out_of_argv() {
    let Some(codex) = cli_or_skip() else { return };
    let (env, mut c, seen) = codex_env(&codex);
    let r = send(&mut c, "LIST the sessions");
    assert_eq!(r["status"], "ok", "{r}");
    // The fake API answers with the tool's output: the run's own session, seen through its token.
    let reply = r["reply"].as_str().unwrap_or_default();
    assert!(reply.starts_with(r#"done: {"status":"ok""#), "{r}");
    assert!(reply.contains(&format!("sessions://history/{KEY}")), "{r}");

    let messages = env.show(KEY)["messages"].as_array().cloned().unwrap();
    let call = common::first_tool_call(&messages);
    assert_eq!(call["name"], "sessions_list", "{call}");
    let result = messages.iter().find(|m| m["role"] == "toolResult").expect("a toolResult message");
    assert_eq!((result["toolName"].as_str(), result["isError"].as_bool()), (Some("sessions_list"), Some(false)));
    assert!(text_of(&result["content"]).contains(&format!("sessions://history/{KEY}")), "{result}");

    // While Codex ran: it was given the server by name only, started `connect`, and no process
    // had the run token in its command line.
    let cmdlines = seen.cmdlines.lock().unwrap();
    let env_vars = r#"mcp_servers.sessions.env_vars=["SESSIONS_MCP_TOKEN","#;
    assert!(cmdlines.iter().any(|c| c.contains(" exec --json ") && c.contains(env_vars)), "{cmdlines:?}");
    assert!(cmdlines.iter().any(|c| c.ends_with("sessions-mcp connect ")), "{cmdlines:?}");
    assert!(!cmdlines.iter().any(|c| c.contains("smcp_run_")), "a run token in argv: {cmdlines:?}");
}

/// Codex as the host of our tools, with a model that pages a 60-message transcript backwards:
/// Codex cuts any tool output over ~12,000 bytes out of the middle, so every answer must stay
/// within the 10,000-byte budget to reach the model whole; following `nextBeforeSeq` then reads
/// every message exactly once.
#[test]
fn codex_hands_every_page_to_its_model_whole_and_paging_reads_every_message_once() {
    let Some(codex) = cli_or_skip() else { return };
    let (env, mut c, seen) = codex_env(&codex);
    let long: Vec<Value> =
        (0..60).map(|i| json!({"role": "user", "content": format!("{i} {}", "z".repeat(800))})).collect();
    // In the tree of the child's session, so the default visibility lets it read the transcript.
    env.seed(json!({"sessions": [{"key": BIG, "spawnedBy": KEY, "messages": long}]}));
    let r = send(&mut c, "PAGE through it");
    assert_eq!((r["status"].as_str(), r["reply"].as_str()), (Some("ok"), Some("paged")), "{r}");
    let requests = seen.requests.lock().unwrap();
    let outputs = page_outputs(requests.last().unwrap()["input"].as_array().unwrap());
    let pages: Vec<&Value> =
        outputs.iter().map(|o| o.as_ref().unwrap_or_else(|raw| panic!("not JSON: {raw}"))).collect();
    let sizes: Vec<usize> = pages.iter().map(|p| p.to_string().len()).collect();
    eprintln!("what Codex handed its model: {} pages of {sizes:?} bytes", pages.len());
    assert!(pages.len() > 4 && sizes.iter().all(|s| *s <= 10_000), "{sizes:?}");
    let mut seqs: Vec<i64> = pages
        .iter()
        .flat_map(|p| p["messages"].as_array().unwrap().clone())
        .filter_map(|m| m["seq"].as_i64())
        .collect();
    seqs.sort();
    assert_eq!(seqs, (1..=60).collect::<Vec<i64>>(), "every message exactly once");
}
