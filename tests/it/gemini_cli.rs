//! The real Gemini CLI as a zero-config sub-agent, offline: a fake Gemini API (generativelanguage
//! `v1beta`) on loopback answers it, named by `GOOGLE_GEMINI_BASE_URL` with a `GEMINI_API_KEY`, as a
//! user with an API key runs it. With no config of ours and `gemini` the one agent CLI on PATH, a
//! spawn without `agentId` runs it through the `gemini` preset in the project its MCP client's root
//! names; its model reads the project's README.md with Gemini's own `read_file` tool and answers
//! with what it saw, which comes back through `subagents wait`.
//!
//! The server cannot wire its session tools into Gemini CLI (docs/AGENTS.md, Presets), so with no
//! config the fake model reports that no `sessions_list` was offered, and the test holds that; with
//! the opt-in entry docs/AGENTS.md gives in the user's `~/.gemini/settings.json` (`sessions-mcp
//! connect`, the run's variables named as `$VAR`), the child calls `sessions_list` back as itself.
//!
//! The other way round, Gemini CLI takes our agent, served over A2A (docs/A2A.md), as one of its
//! remote agents: its model hands it a task with `invoke_agent` and relays the answer.
//!
//! The CLI is `SESSIONS_MCP_GEMINI`, else `gemini` on PATH (`.ci/run --extended` installs npm
//! `@google/gemini-cli`). Without it the test prints why and passes — except in CI's extended tier
//! (`CI` and `SESSIONS_MCP_EXTENDED` set), where it fails.

use crate::common;

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestEnv;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// What the project's README.md starts with.
const PROJECT_MARK: &str = "# The user's project";

/// The request bodies of every `streamGenerateContent` call, in order.
type Seen = Arc<Mutex<Vec<Value>>>;

/// A fake Gemini API: `POST /v1beta/models/<model>:streamGenerateContent?alt=sse` streams one
/// deterministic answer (below); every other `POST` — `…:generateContent`, which the CLI's model
/// router (`--model auto`, its default) asks which model to use, and `…:countTokens` — gets a
/// short JSON answer.
fn fake_api() -> (u16, Seen) {
    let seen = Seen::default();
    let log = seen.clone();
    (common::loopback_server(move |stream| answer(stream, &log)), seen)
}

fn answer(stream: TcpStream, log: &Seen) {
    let Some((request_line, body)) = common::read_http_request(&stream) else { return };
    let mut out = stream;
    let request: Value = serde_json::from_slice(&body).unwrap_or_default();
    let (status, content_type, body) = if !request_line.starts_with("POST /v1beta/models/") {
        ("404 Not Found", "application/json", json!({"error": {"code": 404, "status": "NOT_FOUND"}}).to_string())
    } else if request_line.contains(":streamGenerateContent") {
        log.lock().unwrap().push(request.clone());
        ("200 OK", "text/event-stream", format!("data: {}\r\n\r\n", chunk(model_turn(&request))))
    } else if request_line.contains(":countTokens") {
        ("200 OK", "application/json", json!({"totalTokens": 10}).to_string())
    } else {
        let choice = json!({"reasoning": "a fake router", "model_choice": "flash"}).to_string();
        ("200 OK", "application/json", chunk(json!({"text": choice})).to_string())
    };
    let _ = write!(
        out,
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// One finished model turn of one part, with usage.
fn chunk(part: Value) -> Value {
    json!({"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
           "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 8, "totalTokenCount": 108},
           "modelVersion": "gemini-2.5-flash"})
}

/// The model: after a user turn with READ_AND_LIST it calls Gemini's `read_file` on `README.md`
/// (relative: the CLI resolves it in its working directory), then our `sessions_list` when the CLI
/// offers it (under whatever name it gives an MCP tool), then answers `read: <whether the file's
/// text started with PROJECT_MARK>; listed: <the list's text, or "none offered">`. Anything else
/// gets a plain hello.
fn model_turn(request: &Value) -> Value {
    let contents = request["contents"].as_array().cloned().unwrap_or_default();
    let parts: Vec<&Value> = contents.iter().flat_map(|c| c["parts"].as_array().into_iter().flatten()).collect();
    if let Some(turn) = delegating_turn(&parts) {
        return turn;
    }
    if !parts.iter().any(|p| p["text"].as_str().is_some_and(|t| t.contains("READ_AND_LIST"))) {
        return json!({"text": "Hello from the fake Gemini API"});
    }
    let response_of = |name: &str| {
        let response = parts.iter().find_map(|p| p.get("functionResponse").filter(|r| r["name"] == name));
        response.map(|r| r["response"]["output"].as_str().map_or_else(|| r["response"].to_string(), String::from))
    };
    let Some(read) = response_of("read_file") else {
        return json!({"functionCall": {"name": "read_file", "args": {"file_path": "README.md"}}});
    };
    let list_tool = session_tools_offered(request).into_iter().find(|n| n.ends_with("sessions_list"));
    let listed = match &list_tool {
        Some(name) => match response_of(name) {
            Some(listed) => listed,
            None => return json!({"functionCall": {"name": name, "args": {}}}),
        },
        None => "none offered".to_string(),
    };
    json!({"text": format!("read: {}; listed: {listed}", read.starts_with(PROJECT_MARK))})
}

/// The model of the A2A tests: after a user turn `DELEGATE_TO_OURS: <task>` it hands the remote
/// agent `ours` the task through Gemini's `invoke_agent`; when the agent asks (its answer names an
/// ask), it answers `allow ship it` through `invoke_agent` again, once; then it answers
/// `relayed: <the agent's last answer>`.
fn delegating_turn(parts: &[&Value]) -> Option<Value> {
    let task = parts.iter().find_map(|p| p["text"].as_str()?.split("DELEGATE_TO_OURS: ").nth(1))?;
    let answers: Vec<&str> = parts
        .iter()
        .filter_map(|p| p.get("functionResponse").filter(|r| r["name"] == "invoke_agent"))
        .map(|r| r["response"]["output"].as_str().unwrap_or("(no output)"))
        .collect();
    let invoke = |prompt: &str| json!({"functionCall": {"name": "invoke_agent", "args": {"agent_name": "ours", "prompt": prompt}}});
    Some(match answers.as_slice() {
        [] => invoke(task),
        [asked] if asked.contains(" asks: ") => invoke("allow ship it"),
        [.., last] => json!({"text": format!("relayed: {last}")}),
    })
}

/// The declared tools whose name mentions `sessions_`.
fn session_tools_offered(request: &Value) -> Vec<String> {
    let tools = request["tools"].as_array().into_iter().flatten();
    let declared = tools.flat_map(|t| t["functionDeclarations"].as_array().into_iter().flatten());
    declared.filter_map(|d| d["name"].as_str()).filter(|n| n.contains("sessions_")).map(String::from).collect()
}

/// A PATH of a temporary bin dir holding only a `gemini` link to the CLI, node's dir (the CLI is
/// a node script), and the system's.
fn path_with_only_gemini(bin: &Path, gemini: &Path) -> String {
    std::os::unix::fs::symlink(gemini, bin.join("gemini")).unwrap();
    let node = std::process::Command::new("sh").args(["-c", "command -v node"]).output().unwrap();
    let node_dir = PathBuf::from(String::from_utf8_lossy(&node.stdout).trim()).parent().unwrap().to_path_buf();
    format!("{}:{}:/usr/bin:/bin", bin.display(), node_dir.display())
}

/// What one zero-config READ_AND_LIST spawn gave: the outcome `subagents wait` returned, the
/// child's key, the project it ran in, and the model requests.
struct Spawned {
    outcome: String,
    key: String,
    project: PathBuf,
    requests: Vec<Value>,
}

/// With no config of ours and `gemini` the one agent CLI on PATH, a client that declares a project
/// as its root spawns READ_AND_LIST without `agentId` and waits for it. `settings` is the user's
/// `~/.gemini/settings.json`.
fn spawn_read_and_list(gemini: &Path, settings: &Value) -> Spawned {
    let (bin, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let path = path_with_only_gemini(bin.path(), gemini);
    std::fs::create_dir_all(home.path().join(".gemini")).unwrap();
    std::fs::write(home.path().join(".gemini/settings.json"), settings.to_string()).unwrap();
    let (port, seen) = fake_api();
    let base_url = format!("http://127.0.0.1:{port}");
    let home = home.path().display().to_string();
    let vars = [
        ("PATH", path.as_str()),
        ("HOME", home.as_str()),
        ("SESSIONS_MCP_DISCOVERY", "path"),
        ("GEMINI_API_KEY", "fake-key"),
        ("GOOGLE_GEMINI_BASE_URL", base_url.as_str()),
    ];
    // The host is started elsewhere and names the user's project as its root.
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("README.md"), format!("{PROJECT_MARK}\n")).unwrap();
    let project_dir = std::fs::canonicalize(project.path()).unwrap();
    let env = TestEnv::new();
    let mut c = common::Client::start_declaring(env.serve_command(None, &vars), json!({"roots": {}}));
    c.set_roots(&[&project_dir]);
    let agents = c.call("agents_list", json!({}));
    assert_eq!(agents["agents"][0]["runner"], "gemini", "main runs the one CLI found: {agents}");
    let r = c.call("sessions_spawn", json!({"task": "READ_AND_LIST"}));
    assert_eq!(r["status"], "accepted", "{r}");
    assert_eq!(r["workspace"], json!({"mode": "project", "path": project_dir.display().to_string()}), "{r}");
    let key = r["childSessionKey"].as_str().unwrap().to_string();
    let w = c.call("subagents", json!({"action": "wait", "childSessionKeys": [key], "timeoutSeconds": 150}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}")).to_string();
    assert!(!project_dir.join(".gemini").exists(), "nothing of ours is written into the project");
    let requests = seen.lock().unwrap().clone();
    Spawned { outcome, key, project: project_dir, requests }
}

/// The user's Gemini settings after choosing "Use Gemini API key" at its first start (with a
/// custom base URL and no choice, Gemini CLI 0.61 exits 41 "Invalid auth method selected.").
fn api_key_settings() -> Value {
    json!({"security": {"auth": {"selectedType": "gemini-api-key"}}})
}

/// Issue 35: with no config of ours, Gemini CLI on PATH is discovered, and a spawn without
/// `agentId` runs it (main runs the one CLI found) in the project its MCP client's root names,
/// with the user's own Gemini settings and key; the child reads the project's README.md and its
/// answer is the outcome `subagents wait` returns. It is offered no session tools (docs/AGENTS.md,
/// Presets: the server cannot wire them into Gemini CLI).
#[test]
fn with_no_config_gemini_on_path_is_discovered_and_a_spawn_runs_it_in_the_clients_root() {
    let Some(gemini) = common::real_cli_or_skip("SESSIONS_MCP_GEMINI", "gemini", "Gemini") else { return };
    let spawned = spawn_read_and_list(&std::fs::canonicalize(&gemini).unwrap(), &api_key_settings());
    let outcome = &spawned.outcome;
    assert!(
        outcome.starts_with("Status: completed successfully\nResult: read: true; listed: none offered"),
        "{outcome}"
    );
    // The CLI told its model the directory it works in: the client's root.
    let first = spawned.requests.first().map(Value::to_string).unwrap_or_default();
    assert!(first.contains(&spawned.project.display().to_string()), "the model was told the project dir: {first}");
}

/// The opt-in docs/AGENTS.md gives: a `sessions` entry in the user's own `~/.gemini/settings.json`
/// that names the run's variables (`$SESSIONS_MCP_TOKEN`…, expanded by Gemini from its
/// environment, so the file holds no secret) gives a Gemini child the session tools; it lists its
/// own tree as itself.
#[test]
fn a_sessions_entry_in_the_users_gemini_settings_lets_the_child_call_sessions_list_as_itself() {
    let Some(gemini) = common::real_cli_or_skip("SESSIONS_MCP_GEMINI", "gemini", "Gemini") else { return };
    let mut settings = api_key_settings();
    let vars = ["SESSIONS_MCP_TOKEN", "SESSIONS_MCP_SOCKET", "SESSIONS_MCP_RUN_ID", "SESSIONS_MCP_SESSION_KEY"];
    let env: serde_json::Map<String, Value> = vars.iter().map(|v| (v.to_string(), json!(format!("${v}")))).collect();
    settings["mcpServers"] =
        json!({"sessions": {"command": common::bin(), "args": ["connect"], "env": env, "trust": true}});
    let spawned = spawn_read_and_list(&std::fs::canonicalize(&gemini).unwrap(), &settings);
    let outcome = &spawned.outcome;
    assert!(outcome.starts_with("Status: completed successfully\nResult: read: true; listed: "), "{outcome}");
    // Gemini hands its model an MCP tool's text between <untrusted_context> lines.
    let listed = outcome.split("; listed: ").nth(1).and_then(|r| r.split("\nStats:").next()).unwrap();
    let listed = listed.trim().trim_start_matches("<untrusted_context>").trim_end_matches("</untrusted_context>");
    let listed: Value = serde_json::from_str(listed.trim()).unwrap_or_else(|e| panic!("{e}: {outcome}"));
    assert_eq!(common::keys_of(&listed), [spawned.key.as_str()], "it called sessions_list back as itself: {outcome}");
}

/// What one Gemini CLI run that delegated a task to our agent over A2A gave: its stdout, the
/// model requests, and our server's env (its store).
struct Delegated {
    stdout: String,
    requests: Vec<Value>,
    env: TestEnv,
}

/// Our agent `main` (it echoes; on "approve" it asks an approval first), served over A2A to a
/// client token, declared to Gemini CLI as the user declares a remote agent — a `kind: remote` file
/// in `~/.gemini/agents/` naming our card's URL and the variable holding the token (`$VAR`, so the
/// file holds no secret); `gemini -p` is told to delegate `task` to it.
fn delegate_through_gemini(gemini: &Path, task: &str) -> Delegated {
    let mut env = TestEnv::new();
    let script = json!({"rules": [
        {"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"},
        {"match": {"input": "approve"}, "ask": {"kind": "approval", "text": "May I deploy?", "details": {"toolName": "Deploy"}},
         "reply": "decision={decision} answer={answer}"},
    ], "default": {"reply": "ECHO: {input}"}});
    let mut main = common::scripted_agent(&env, "main", &script, json!({}));
    main["description"] = json!("Echoes what it is told.");
    let token = hex::encode(Sha256::digest(GEMINI_PEER_TOKEN.as_bytes()));
    env.set_config(
        &json!({"agents": {"list": [main]},
                "server": {"tokens": [{"sha256": token, "sessionKey": "agent:main:gemini"}], "a2a": {"agents": ["main"]}}})
        .to_string(),
    );
    let server = env.serve_http(&[]);
    let (bin, home, project) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let gemini_dir = home.path().join(".gemini");
    std::fs::create_dir_all(gemini_dir.join("agents")).unwrap();
    std::fs::write(gemini_dir.join("settings.json"), api_key_settings().to_string()).unwrap();
    let card = format!("http://127.0.0.1:{}/a2a/main/.well-known/agent-card.json", server.port);
    let declared = format!(
        "---\nkind: remote\nname: ours\nagent_card_url: {card}\nauth:\n  type: http\n  scheme: Bearer\n  token: $OURS_A2A_TOKEN\n---\n"
    );
    std::fs::write(gemini_dir.join("agents/ours.md"), declared).unwrap();
    let (port, seen) = fake_api();
    let mut child = Command::new(gemini)
        .args(["-p", &format!("DELEGATE_TO_OURS: {task}"), "--approval-mode", "yolo", "--skip-trust"])
        .current_dir(project.path())
        .env_clear()
        .env("PATH", path_with_only_gemini(bin.path(), gemini))
        .env("HOME", home.path())
        .env("GEMINI_API_KEY", "fake-key")
        .env("GOOGLE_GEMINI_BASE_URL", format!("http://127.0.0.1:{port}"))
        .env("OURS_A2A_TOKEN", GEMINI_PEER_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = common::wait_child(&mut child, Duration::from_secs(150));
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(status.success(), "gemini failed: {status}\n{stdout}\n{stderr}");
    drop(server);
    let requests = seen.lock().unwrap().clone();
    Delegated { stdout: stdout.into_owned(), requests, env }
}

/// The client token Gemini CLI signs in with as our A2A peer.
const GEMINI_PEER_TOKEN: &str = "a2a-gemini-token-0123456789";

/// The one session of the A2A peer in `env`'s store, shown.
fn the_peers_session(env: &TestEnv) -> Value {
    let ls: Value = serde_json::from_slice(&env.run(&["ls", "--json"]).stdout).unwrap();
    let all = ls["sessions"].as_array().unwrap().iter().filter_map(|s| s["key"].as_str());
    let keys: Vec<&str> = all.filter(|k| k.starts_with("agent:main:a2a:direct:")).collect();
    assert_eq!(keys.len(), 1, "one session of the peer's context: {ls}");
    env.show(keys[0])
}

/// Issue 39: Gemini CLI's A2A client (v0.3) reads our card, sends the task with `message/stream`,
/// and its model relays our agent's answer; our store holds the session of that peer and context,
/// the message recorded as the peer's.
#[test]
fn gemini_cli_delegates_to_our_agent_served_over_a2a() {
    let Some(gemini) = common::real_cli_or_skip("SESSIONS_MCP_GEMINI", "gemini", "Gemini") else { return };
    let done = delegate_through_gemini(&std::fs::canonicalize(&gemini).unwrap(), "hello from gemini");
    assert!(
        done.stdout.contains("relayed: ECHO: hello from gemini"),
        "the model relayed our agent's answer:\n{}",
        done.stdout
    );
    // Gemini offered its model our agent, described by our card.
    let first = done.requests.first().map(Value::to_string).unwrap_or_default();
    assert!(first.contains("Echoes what it is told."), "our card described the agent: {first}");
    let show = the_peers_session(&done.env);
    let user = show["messages"].as_array().unwrap().iter().find(|m| m["role"] == "user").cloned().unwrap();
    assert!(user.to_string().contains("hello from gemini"), "{user}");
    let p = &user["provenance"];
    assert_eq!((&p["sourceTool"], &p["senderId"]), (&json!("a2a"), &json!("agent:main:gemini")), "{user}");
    assert_eq!(done.env.run_counts()["ok"], 1, "one run, done");
}

/// Our agent's approval reaches Gemini's model as the task's question (v0.3: the stream ends at
/// `input-required`); the model's next `invoke_agent` goes into the same task and answers it, and
/// the agent's reply after the decision is relayed. One run: the answer started nothing new.
#[test]
fn gemini_cli_answers_our_agents_approval_into_the_same_task() {
    let Some(gemini) = common::real_cli_or_skip("SESSIONS_MCP_GEMINI", "gemini", "Gemini") else { return };
    let done = delegate_through_gemini(&std::fs::canonicalize(&gemini).unwrap(), "approve the deploy");
    assert!(done.stdout.contains("relayed: decision=allow answer=ship it"), "{}", done.stdout);
    let asked = done.requests.iter().map(Value::to_string).find(|r| r.contains("May I deploy?"));
    assert!(asked.is_some(), "the model was shown the question: {:?}", done.requests);
    the_peers_session(&done.env);
    assert_eq!(done.env.run_counts()["ok"], 1, "one run, answered and done");
}
