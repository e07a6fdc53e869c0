//! The dashboard at `/ui` (issue 21), black-box over HTTP: what an operator token and a client
//! token each see (a client's view holds its own tree and nothing else, and a session outside it
//! reads exactly like one that does not exist), the live stream, the actions (answer, cancel,
//! retry, dismiss) and the refusals (no token, a foreign Host or Origin, a non-JSON action, a
//! client's ledger act). `dashboard_browser` drives the same page in a real headless Chromium.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::http_client::{Mcp, http_to};
use common::{TestEnv, scripted_agent, wait_until};
use serde_json::{Value, json};

pub(crate) const OPERATOR: &str = "operator-token-0123456789";
pub(crate) const DESK: &str = "desk-token-0123456789";
pub(crate) const OTHER: &str = "other-token-0123456789";

pub(crate) fn sha(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// Agent `main` answers tasks (`slow …` after 3 s, `long …` after 8 s, `fail …` with an error, `ask …` with an approval first, `leak …` with a
/// question full of secrets first); two client
/// tokens (desk, other) and an operator token; sessions see their own tree.
pub(crate) fn env_with() -> TestEnv {
    env_seeing("tree", None, 64)
}

/// [`env_with`] with another visibility, a deliverer for the discord channel (a shell body), and
/// `server.maxStreamsPerCredential`.
fn env_seeing(visibility: &str, deliver: Option<&str>, streams_per_credential: u32) -> TestEnv {
    let mut env = TestEnv::new();
    let script = json!({"rules": [
        {"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"},
        {"match": {"inputRegex": "^long"}, "sleepMs": 8000, "reply": "long done"},
        {"match": {"inputRegex": "^fail"}, "error": {"code": "build_failed", "message": "the build broke: exit 2\nsee the log for more"}},
        {"match": {"inputRegex": "^slow"}, "sleepMs": 3000, "reply": "slow done", "usage": {"inputTokens": 700, "outputTokens": 50, "costUsd": 0.02}},
        {"match": {"inputRegex": "^ask"}, "ask": {"kind": "approval", "text": "May I deploy?", "details": {"toolName": "Bash"}},
         "reply": "decision={decision} answer={answer}"},
        {"match": {"inputRegex": "^leak"}, "ask": {"kind": "question", "text": "Use OPENAI_KEY sk-abcdefghijklmnopqrstuvwxyz?",
         "options": ["yes, sk-0123456789abcdefghij", "no"],
         "details": {"toolName": "Bash", "input": {"command": "curl -H 'Authorization: Bearer abcdefghijklmnop1234'"}, "password": "hunter2"}},
         "reply": "answer={answer}"}
    ], "default": {"reply": "RESULT: {input}", "usage": {"inputTokens": 100, "outputTokens": 20, "costUsd": 0.01}}});
    let main = scripted_agent(&env, "main", &script, json!({}));
    let worker = scripted_agent(
        &env,
        "worker",
        &json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCED"}], "default": {"reply": "ok: {input}"}}),
        json!({}),
    );
    let mut extra = json!({
        "server": {
            "operatorTokens": [{"sha256": sha(OPERATOR)}], "maxStreamsPerCredential": streams_per_credential,
            "tokens": [{"sha256": sha(DESK), "sessionKey": "agent:main:desk"}, {"sha256": sha(OTHER), "sessionKey": "agent:main:other"}],
        },
        "tools": {"sessions": {"visibility": visibility}, "agentToAgent": {"enabled": true}},
    });
    if let Some(body) = deliver {
        let path = env.write_file("deliver.sh", body);
        extra["channels"] = json!({"discord": {"deliver": ["/bin/sh", path.to_str().unwrap()]}});
    }
    env.set_config(&common::agents_config(vec![main, worker], extra));
    env
}

fn get(port: u16, path: &str, token: Option<&str>) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let (status, _, body) = http_to(port, "GET", path, &headers, "");
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

fn act(port: u16, token: &str, body: Value) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
    let (status, _, body) = http_to(port, "POST", "/ui/api/act", &headers, &body.to_string());
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

pub(crate) fn view(port: u16, token: &str) -> Value {
    let (status, v) = get(port, "/ui/api/view", Some(token));
    assert_eq!(status, 200, "{v}");
    v
}

/// Every node of a view's trees, depth first.
pub(crate) fn nodes(view: &Value) -> Vec<Value> {
    fn walk(n: &Value, out: &mut Vec<Value>) {
        out.push(n.clone());
        for c in n["children"].as_array().into_iter().flatten() {
            walk(c, out);
        }
    }
    let mut out = Vec::new();
    for r in view["trees"]["roots"].as_array().into_iter().flatten() {
        walk(r, &mut out);
    }
    out
}

pub(crate) fn node<'a>(all: &'a [Value], key: &str) -> Option<&'a Value> {
    all.iter().find(|n| n["key"] == key)
}

#[test]
fn an_operator_sees_every_tree_and_a_client_token_only_its_own_with_transcripts_by_the_same_rules() {
    let env = env_with();
    let server = env.serve_http(&[]);
    let port = server.port;
    let a = Mcp::legacy(port, DESK).call("sessions_spawn", json!({"task": "hello", "label": "greeter"}));
    let child_a = a["childSessionKey"].as_str().unwrap().to_string();
    let b = Mcp::legacy(port, OTHER).call("sessions_spawn", json!({"task": "secret work"}));
    let child_b = b["childSessionKey"].as_str().unwrap().to_string();

    let v = wait_until(Duration::from_secs(30), "both children completed", || {
        let v = view(port, OPERATOR);
        let all = nodes(&v);
        let done = |k: &str| node(&all, k).is_some_and(|n| n["state"] == "completed");
        (done(&child_a) && done(&child_b)).then_some(v)
    });
    assert_eq!(v["viewer"], json!({"name": "operator", "operator": true}));
    let all = nodes(&v);
    let a_node = node(&all, &child_a).unwrap();
    assert_eq!(a_node["parent"], "agent:main:desk", "{a_node}");
    assert_eq!(a_node["label"], "greeter");
    assert_eq!(a_node["tokens"], json!({"in": 100, "out": 20}), "{a_node}");
    assert_eq!(a_node["costUsd"], 0.01);
    assert!(a_node["run"]["runtimeMs"].as_i64().is_some(), "{a_node}");
    let roots: Vec<&str> = v["trees"]["roots"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert!(roots.contains(&"agent:main:desk") && roots.contains(&"agent:main:other"), "{roots:?}");
    assert!(v["runs"].as_array().unwrap().iter().any(|r| r["sessionKey"] == child_b.as_str()), "{}", v["runs"]);
    assert!(v["usage"]["hourly"][0]["tokensIn"].as_i64().unwrap() >= 200, "{}", v["usage"]);

    // The desk's token: its tree only — not a key, run or delivery of the other's anywhere.
    let d = view(port, DESK);
    assert_eq!(d["viewer"], json!({"name": "agent:main:desk", "operator": false}));
    assert_eq!(d["trees"]["rootsTotal"], 1);
    let keys: Vec<String> = nodes(&d).iter().map(|n| n["key"].as_str().unwrap().to_string()).collect();
    assert_eq!(keys, vec!["agent:main:desk".to_string(), child_a.clone()]);
    let text = d.to_string();
    assert!(!text.contains(&child_b) && !text.contains("agent:main:other") && !text.contains("secret"), "{text}");
    // A filter is the operator's; the client's view is the same with one.
    let (_, filtered) = get(port, "/ui/api/view?filter=other", Some(DESK));
    assert_eq!(filtered["trees"], d["trees"]);

    // Transcripts: who said each message.
    let (status, t) = get(port, &format!("/ui/api/transcript?session={child_a}"), Some(DESK));
    assert_eq!(status, 200, "{t}");
    let msgs = t["messages"].as_array().unwrap();
    let task = msgs.iter().find(|m| m["role"] == "user").unwrap();
    assert_eq!(task["from"]["kind"], "session", "{task}");
    assert_eq!(task["from"]["session"], "agent:main:desk", "{task}");
    assert!(task["text"].as_str().unwrap().contains("hello"), "{task}");
    let reply = msgs.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(reply["from"]["kind"], "agent");
    assert_eq!(reply["text"], "RESULT: hello");
    // The other's child, to the desk, reads exactly like a session that does not exist.
    let fake = format!("agent:main:subagent:{}", uuid_like(&child_b));
    let (hidden_status, hidden) = get(port, &format!("/ui/api/transcript?session={child_b}"), Some(DESK));
    let (missing_status, missing) = get(port, &format!("/ui/api/transcript?session={fake}"), Some(DESK));
    assert_eq!(hidden_status, missing_status);
    assert_ne!(hidden_status, 200);
    assert_eq!(hidden.to_string().replace(&child_b, "KEY"), missing.to_string().replace(&fake, "KEY"));
    let (status, _) = get(port, &format!("/ui/api/transcript?session={child_b}"), Some(OPERATOR));
    assert_eq!(status, 200);
}

/// A key of the same shape as `key` that no session has.
fn uuid_like(key: &str) -> String {
    let id = key.rsplit(':').next().unwrap();
    id.chars()
        .map(|c| {
            if c == '-' {
                '-'
            } else if c == '0' {
                '1'
            } else {
                '0'
            }
        })
        .collect()
}

#[test]
fn without_a_good_token_from_a_foreign_host_or_origin_or_not_as_json_nothing_is_shown_or_done() {
    let env = env_with();
    let server = env.serve_http(&[]);
    let port = server.port;
    // The page itself holds no data and loads for anyone; its API does not.
    let (status, headers, body) = http_to(port, "GET", "/ui", &[], "");
    assert_eq!(status, 200);
    assert!(body.contains("<title>sessions-mcp dashboard</title>"));
    let csp = headers.iter().find(|(k, _)| k == "content-security-policy").map(|(_, v)| v.clone()).unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    let (status, _, js) = http_to(port, "GET", "/ui/app.js", &[], "");
    assert!(status == 200 && js.contains("/ui/api/events"));
    for token in [None, Some("nonsense")] {
        let (status, v) = get(port, "/ui/api/view", token);
        assert_eq!(status, 401, "{v}");
    }
    let auth = format!("Bearer {OPERATOR}");
    let (status, _, _) =
        http_to(port, "GET", "/ui/api/view", &[("Authorization", &auth), ("Host", "evil.example")], "");
    assert_eq!(status, 403, "a foreign Host (DNS rebinding)");
    let (status, _, _) =
        http_to(port, "GET", "/ui/api/view", &[("Authorization", &auth), ("Origin", "http://evil.example")], "");
    assert_eq!(status, 403, "a foreign Origin");
    let (status, _, _) = http_to(port, "GET", "/ui", &[("Host", "evil.example")], "");
    assert_eq!(status, 403, "the page too");
    // An action must be JSON (a form post from elsewhere is not).
    let body = json!({"action": "dismiss", "deliveryId": 1}).to_string();
    let (status, _, text) = http_to(
        port,
        "POST",
        "/ui/api/act",
        &[("Authorization", &auth), ("Content-Type", "application/x-www-form-urlencoded")],
        &body,
    );
    assert_eq!(status, 415, "{text}");
    let (status, v) = act(port, OPERATOR, json!({"action": "explode"}));
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("allowed: {action: \"cancel\", sessionKey}"), "{v}");
    let (status, v) = act(port, OPERATOR, json!({"action": "dismiss", "deliveryId": 999}));
    assert_eq!((status, v["error"].as_str().unwrap()), (404, "no delivery 999"));
    // Ledger acts are the operator's.
    let (status, v) = act(port, DESK, json!({"action": "retry", "deliveryId": 1}));
    assert_eq!(status, 403, "{v}");
}

#[test]
fn the_operator_answers_a_childs_approval_and_cancels_a_running_child_from_the_dashboard() {
    let env = env_with();
    let server = env.serve_http(&[]);
    let port = server.port;
    let mut desk = Mcp::legacy(port, DESK);
    let asking =
        desk.call("sessions_spawn", json!({"task": "ask to deploy"}))["childSessionKey"].as_str().unwrap().to_string();
    let ask = wait_until(Duration::from_secs(30), "the ask in the view", || {
        view(port, OPERATOR)["asks"].as_array().and_then(|a| a.first().cloned())
    });
    assert_eq!(ask["sessionKey"], asking.as_str());
    assert_eq!(ask["text"], "May I deploy?");
    assert_eq!(ask["details"]["toolName"], "Bash");
    let n = nodes(&view(port, OPERATOR));
    assert_eq!(node(&n, &asking).unwrap()["state"], "waiting");
    // The other client cannot answer it (nor learn that it exists).
    let (status, v) =
        act(port, OTHER, json!({"action": "respond", "requestId": ask["requestId"], "decision": "allow"}));
    assert_eq!(status, 404, "{v}");
    let (status, v) = act(
        port,
        OPERATOR,
        json!({"action": "respond", "requestId": ask["requestId"], "decision": "allow", "text": "go"}),
    );
    assert_eq!(status, 200, "{v}");
    let (status, v) = act(port, DESK, json!({"action": "respond", "requestId": ask["requestId"], "decision": "deny"}));
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("already answered (allow) by operator via dashboard"), "{v}");
    let w = desk.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert!(w["finished"][0]["outcome"].as_str().unwrap().contains("decision=allow answer=go"), "{w}");

    let slow =
        desk.call("sessions_spawn", json!({"task": "slow job"}))["childSessionKey"].as_str().unwrap().to_string();
    wait_until(Duration::from_secs(30), "the slow child running", || {
        (node(&nodes(&view(port, DESK)), &slow)?["state"] == "running").then_some(())
    });
    let (status, v) = act(port, DESK, json!({"action": "cancel", "sessionKey": slow}));
    assert_eq!(status, 200, "{v}");
    assert!(v["note"].as_str().unwrap().starts_with("cancelled: "), "{v}");
    assert_eq!(node(&nodes(&view(port, OPERATOR)), &slow).unwrap()["state"], "cancelled");
    // A client may cancel only below itself.
    let (status, _) = act(port, OTHER, json!({"action": "cancel", "sessionKey": slow}));
    assert_eq!(status, 404);
}

#[test]
fn a_failed_channel_delivery_is_retried_and_a_second_one_dismissed_from_the_ledger() {
    // Fails until a file `ok` appears beside it.
    let deliver = "d=$(dirname \"$0\"); if [ -f \"$d/ok\" ]; then cat >> \"$d/delivered.jsonl\"; echo >> \"$d/delivered.jsonl\"; \
                   else echo 'discord is down' >&2; exit 1; fi\n";
    let env = env_seeing("all", Some(deliver), 64);
    let delivered = env.dir.path().join("delivered.jsonl");
    for target in ["agent:worker:discord:group:ops", "agent:worker:discord:group:dev"] {
        env.seed(json!({"sessions": [{"key": target}]}));
    }
    let server = env.serve_http(&[]);
    let port = server.port;
    let mut desk = Mcp::legacy(port, DESK);
    for (target, text) in [("agent:worker:discord:group:ops", "one"), ("agent:worker:discord:group:dev", "two")] {
        let r = desk.call("sessions_send", json!({"sessionKey": target, "message": text, "timeoutSeconds": 30}));
        assert_eq!(r["status"], "ok", "{r}");
    }
    let failed = wait_until(Duration::from_secs(30), "two failed deliveries", || {
        let v = view(port, OPERATOR);
        let f: Vec<Value> = v["deliveries"].as_array()?.iter().filter(|d| d["status"] == "failed").cloned().collect();
        (f.len() == 2).then_some(f)
    });
    assert_eq!(failed[0]["lastError"].as_str().map(|e| e.contains("discord is down")), Some(true), "{failed:?}");
    std::fs::write(env.dir.path().join("ok"), "").unwrap();
    let (status, v) = act(port, OPERATOR, json!({"action": "retry", "deliveryId": failed[0]["id"]}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = act(port, OPERATOR, json!({"action": "dismiss", "deliveryId": failed[1]["id"]}));
    assert_eq!(status, 200, "{v}");
    let (status, v) = act(port, OPERATOR, json!({"action": "retry", "deliveryId": failed[1]["id"]}));
    assert_eq!(status, 400, "a dismissed one is not retried: {v}");
    let states = wait_until(Duration::from_secs(30), "the retried one delivered", || {
        let v = view(port, OPERATOR);
        let by_id = |id: &Value| v["deliveries"].as_array()?.iter().find(|d| d["id"] == *id).cloned();
        let (a, b) = (by_id(&failed[0]["id"])?, by_id(&failed[1]["id"])?);
        (a["status"] == "delivered").then_some((a, b))
    });
    assert_eq!(states.1["status"], "dismissed");
    assert!(states.1["lastError"].as_str().unwrap().starts_with("dismissed by operator; before: "), "{:?}", states.1);
    let line = std::fs::read_to_string(&delivered).unwrap();
    assert_eq!(line.lines().count(), 1, "only the retried one went out: {line}");
}

#[test]
fn a_secret_in_a_childs_ask_is_masked_in_subagents_list_and_wait_and_in_the_dashboard_as_in_its_transcript() {
    let env = env_with();
    let server = env.serve_http(&[]);
    let port = server.port;
    let mut desk = Mcp::legacy(port, DESK);
    let child =
        desk.call("sessions_spawn", json!({"task": "leak it"}))["childSessionKey"].as_str().unwrap().to_string();
    let w = desk.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    assert_eq!(w["status"], "attention", "{w}");
    let listed = desk.call("subagents", json!({"action": "list"}));
    let operator = wait_until(Duration::from_secs(30), "the ask in the operator's view", || {
        view(port, OPERATOR)["asks"].as_array().and_then(|a| a.first().cloned())
    });
    let shown = [
        ("wait", w["requests"][0].clone()),
        ("list", listed["children"][0]["pendingRequests"][0].clone()),
        ("client's dashboard", view(port, DESK)["asks"][0].clone()),
        ("operator's dashboard", operator),
    ];
    for (path, ask) in &shown {
        assert_eq!(ask["text"], "Use OPENAI_KEY sk-abc…wxyz?", "{path}: {ask}");
        assert_eq!(ask["options"], json!(["yes, sk-012…ghij", "no"]), "{path}: {ask}");
        assert_eq!(ask["details"]["input"]["command"], "curl -H 'Authorization: Bearer abcdef…1234'", "{path}: {ask}");
        assert_eq!(ask["details"]["password"], "***", "{path}: {ask}");
        assert_eq!(ask["details"]["toolName"], "Bash", "{path}: {ask}");
    }
    // The child's reply echoes the answer: the outcome `wait` returns is masked as its transcript is.
    let id = shown[0].1["requestId"].clone();
    let answer = "ghp_abcdefghijklmnopqrstuvwxyz0123 it is";
    let ok = desk.call("subagents", json!({"action": "respond", "requestId": id, "decision": "allow", "text": answer}));
    assert_eq!(ok["status"], "ok", "{ok}");
    let w = desk.call("subagents", json!({"action": "wait", "timeoutSeconds": 30}));
    let outcome = w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("{w}"));
    assert!(outcome.contains("answer=ghp_ab…0123 it is") && !outcome.contains("ghp_abcdefghij"), "{outcome}");
    let (_, t) = get(port, &format!("/ui/api/transcript?session={child}"), Some(DESK));
    let transcript = t["messages"].to_string();
    assert!(transcript.contains("sk-abc…wxyz") && !transcript.contains("sk-abcdefghij"), "{transcript}");
}

/// Reads server-sent events from `/ui/api/events` until `until` accepts one (event, data).
pub(crate) fn read_events(port: u16, token: &str, query: &str, mut until: impl FnMut(&str, &Value) -> bool) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET /ui/api/events{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut event = String::new();
    for line in BufReader::new(s).lines() {
        let line = line.expect("the stream stays open");
        if let Some(e) = line.strip_prefix("event: ") {
            event = e.to_string();
        } else if let Some(d) = line.strip_prefix("data: ") {
            let data: Value = serde_json::from_str(d).unwrap_or(Value::Null);
            if until(&event, &data) {
                return;
            }
        }
    }
    panic!("the event stream ended");
}

#[test]
fn the_live_stream_sends_the_view_at_once_then_again_when_a_run_moves_and_when_the_open_transcript_grows() {
    let env = env_with();
    let server = env.serve_http(&[]);
    let port = server.port;
    let mut desk = Mcp::legacy(port, DESK);
    let child =
        desk.call("sessions_spawn", json!({"task": "slow start"}))["childSessionKey"].as_str().unwrap().to_string();
    let mut seen = Vec::new();
    let mut grew = false;
    read_events(port, DESK, &format!("?session={child}"), |event, data| {
        if event == "transcript" {
            assert_eq!(data["sessionKey"], child.as_str());
            grew = true;
        }
        if event == "view" {
            let state = node(&nodes(data), &child).map(|n| n["state"].as_str().unwrap().to_string());
            seen.push(state.unwrap_or_default());
        }
        grew && seen.last().is_some_and(|s| s == "completed")
    });
    assert!(seen.iter().any(|s| s == "running" || s == "queued"), "the first view came before the end: {seen:?}");
}

/// Opens `/ui/api/events` and reads the answer's status line; the stream stays open while the
/// reader lives.
fn open_stream(port: u16, token: &str) -> (u16, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET /ui/api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\r\n")
        .unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, reader)
}

#[test]
fn a_client_token_that_opens_live_streams_until_refused_leaves_the_operator_room_for_one() {
    let env = env_with();
    let server = env.serve_http(&[]);
    let port = server.port;
    let mut held = Vec::new();
    let refused = loop {
        let (status, stream) = open_stream(port, DESK);
        if status != 200 {
            break status;
        }
        held.push(stream);
        assert!(held.len() <= 64, "a client token kept opening streams past the listener's 64");
    };
    assert_eq!(refused, 429);
    let (status, _operator) = open_stream(port, OPERATOR);
    assert_eq!(status, 200, "the operator was refused a stream after the client held {}", held.len());
    assert!(held.len() < 64, "the client took {} of the listener's 64 streams", held.len());
}

#[test]
fn live_streams_count_against_max_streams_per_credential_with_the_tokens_other_requests() {
    let env = env_seeing("tree", None, 3);
    let server = env.serve_http(&[]);
    let port = server.port;
    let held: Vec<_> = (0..3).map(|_| open_stream(port, DESK)).collect();
    assert!(held.iter().all(|(status, _)| *status == 200));
    let (status, mut refused) = open_stream(port, DESK);
    assert_eq!(status, 429, "a fourth stream for one token");
    let mut answer = String::new();
    let _ = std::io::Read::read_to_string(&mut refused, &mut answer);
    assert!(answer.contains("server.maxStreamsPerCredential is 3"), "{answer}");
    // The same token's MCP requests share the count; another token's do not.
    let mcp = |token: &str| {
        let auth = format!("Bearer {token}");
        let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
        http_to(port, "POST", "/mcp", &headers, "{}").0
    };
    assert_eq!(mcp(DESK), 429);
    assert_ne!(mcp(OTHER), 429);
    drop(held);
    wait_until(Duration::from_secs(30), "the closed streams' places given back", || {
        (open_stream(port, DESK).0 == 200).then_some(())
    });
}

#[test]
fn on_a_loopback_serve_with_as_the_page_needs_no_token_and_shows_that_sessions_tree() {
    let env = env_with();
    let server = env.serve_http(&["--as", "agent:main:desk"]);
    let port = server.port;
    let (status, hello) = get(port, "/ui/api/hello", None);
    assert_eq!((status, hello), (200, json!({"anonymous": true})));
    let (status, v) = get(port, "/ui/api/view", None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["viewer"], json!({"name": "agent:main:desk", "operator": false}));
    // A token sent is checked as always; an operator's still sees everything.
    assert_eq!(get(port, "/ui/api/view", Some("nonsense")).0, 401);
    assert_eq!(view(port, OPERATOR)["viewer"]["operator"], true);
    let plain = env.serve_http(&[]);
    assert_eq!(get(plain.port, "/ui/api/hello", None).1, json!({"anonymous": false}));
}

#[test]
fn a_daemon_with_http_serves_the_dashboard_and_runs_what_its_clients_spawn() {
    let env = env_with();
    let daemon = env.daemon_http(&[]);
    let port = daemon.port;
    let child = Mcp::legacy(port, DESK).call("sessions_spawn", json!({"task": "hello"}));
    let child = child["childSessionKey"].as_str().unwrap().to_string();
    wait_until(Duration::from_secs(30), "the child completed in the daemon's view", || {
        (node(&nodes(&view(port, OPERATOR)), &child)?["state"] == "completed").then_some(())
    });
    let (status, _, body) = http_to(port, "GET", "/ui", &[], "");
    assert!(status == 200 && body.contains("sessions-mcp dashboard"));
}
