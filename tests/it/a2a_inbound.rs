//! Our agents as A2A agents (docs/A2A.md), driven by the official Python A2A SDK (PyPI `a2a-sdk`,
//! pinned in `tests/clients/requirements.txt`) through `tests/clients/a2a_client.py`: the card, a
//! wrong token, a streamed reply, the next turn of a context, input-required answered, cancel, and
//! another caller's task not found; and, without Python, what the endpoint answers on the wire.

use crate::common;

use std::process::{Command, Stdio};

use common::http_client::http_to;
use common::{TestEnv, scripted_agent};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub(crate) const ALICE: &str = "a2a-alice-token-0123456789";
const BOB: &str = "a2a-bob-token-0123456789";

pub(crate) fn sha(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn env_exposing(agents: &[&str]) -> TestEnv {
    env_with(agents, json!({}))
}

/// `main` served over A2A: it echoes, asks an approval on "approve", sleeps on "slow", and on
/// "delegate" spawns a child that asks, and waits for it; on "type" it types its reply in pieces.
fn env_with(agents: &[&str], session: Value) -> TestEnv {
    env_with_server(agents, session, json!({}))
}

fn env_with_server(agents: &[&str], session: Value, server: Value) -> TestEnv {
    let mut env = TestEnv::new();
    let wait = json!({"tool": "subagents", "arguments": {"action": "wait", "timeoutSeconds": 120}});
    let script = json!({"rules": [
        {"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"},
        {"match": {"mode": "completion"}, "reply": "noted"},
        // A model that delegates and waits: the first wait returns when the child's approval is
        // told (it waits for a person), the second when the child is done.
        {"match": {"input": "delegate"},
         "call": [{"tool": "sessions_spawn", "arguments": {"task": "approve the release"}}, wait.clone(), wait],
         "reply": "child: {result}"},
        {"match": {"input": "approve"}, "ask": {"kind": "approval", "text": "May I deploy?", "details": {"toolName": "Deploy"}},
         "reply": "decision={decision} answer={answer}"},
        {"match": {"input": "slow"}, "sleepMs": 120_000, "reply": "too late"},
        {"match": {"input": "type"}, "sleepMs": 1500, "deltas": true, "reply": "typed for you: {input}"},
    ], "default": {"reply": "ECHO: {input}"}});
    let main = scripted_agent(&env, "main", &script, json!({}));
    let mut main = main;
    main["description"] = json!("Echoes what it is told; asks before it deploys.");
    let mut config = json!({
        "agents": {"list": [main]},
        "session": session,
        "server": {
            "tokens": [{"sha256": sha(ALICE), "sessionKey": "agent:main:alice"},
                       {"sha256": sha(BOB), "sessionKey": "agent:main:bob"}],
            "a2a": {"agents": agents},
        },
    });
    // The test's own server keys, merged in (`a2a` key by key).
    for (key, value) in server.as_object().unwrap() {
        match value.as_object().filter(|_| key == "a2a") {
            Some(a2a) => config["server"]["a2a"].as_object_mut().unwrap().extend(a2a.clone()),
            None => config["server"][key] = value.clone(),
        }
    }
    env.set_config(&config.to_string());
    env
}

pub(crate) fn rpc(port: u16, token: &str, method: &str, params: Value) -> (u16, Value) {
    let auth = format!("Bearer {token}");
    let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let (status, _, body) = http_to(port, "POST", "/a2a/main", &headers, &body);
    (status, serde_json::from_str(&body).unwrap_or_else(|_| json!({"raw": body})))
}

fn assert_nothing_ran(env: &TestEnv) {
    let runs = env.run_counts();
    assert!(runs.as_object().unwrap().values().all(|n| n == 0), "nothing ran: {runs}");
}

#[test]
fn the_python_a2a_sdk_streams_asks_answers_cancels_and_sees_only_its_own_tasks() {
    let Some(python) = crate::python_sdk::python_with("a2a.client", "a2a-sdk") else { return };
    let env = env_exposing(&["main"]);
    let server = env.serve_http(&[]);
    let base = format!("http://127.0.0.1:{}/a2a/main", server.port);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/a2a_client.py");
    let out = Command::new(&python).arg(&script).args([&base, ALICE, BOB]).stdin(Stdio::null()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ok a2a"),
        "the A2A client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The transcript records the peer and its context as the message's provenance.
    let line = stdout.lines().find_map(|l| l.strip_prefix("session ")).expect("the session line");
    let (key, context) = line.split_once(' ').unwrap();
    assert!(key.starts_with("agent:main:a2a:direct:"), "{key}");
    let show = env.show(key);
    let user = show["messages"].as_array().unwrap().iter().find(|m| m["role"] == "user").unwrap().clone();
    let p = &user["provenance"];
    assert_eq!((&p["kind"], &p["sourceTool"]), (&json!("external_user"), &json!("a2a")), "{user}");
    assert_eq!((&p["senderId"], &p["threadId"]), (&json!("agent:main:alice"), &json!(context)), "{user}");
    drop(server);
}

#[test]
fn on_the_wire_a_wrong_token_is_a_401_with_the_bearer_scheme_and_bad_params_name_the_field() {
    let env = env_exposing(&["main"]);
    let server = env.serve_http(&[]);
    let (status, headers, body) = http_to(server.port, "GET", "/a2a/main/.well-known/agent-card.json", &[], "");
    assert_eq!(status, 200, "{body}");
    let card: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(card["skills"][0]["description"], "Echoes what it is told; asks before it deploys.", "{card}");
    assert_eq!(card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"], "Bearer", "{card}");
    let bindings: Vec<&str> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["protocolBinding"].as_str().unwrap())
        .collect();
    assert_eq!(bindings, ["JSONRPC", "HTTP+JSON"], "{card}");
    let _ = headers;
    let (status, body) = rpc(server.port, "wrong-token", "GetTask", json!({"id": "x"}));
    assert_eq!(status, 401, "{body}");
    let (_, head, _) = http_to(server.port, "POST", "/a2a/main", &[("Content-Type", "application/json")], "{}");
    assert!(head.iter().any(|(k, v)| k == "www-authenticate" && v.starts_with("Bearer")), "{head:?}");
    let (status, body) = rpc(server.port, ALICE, "SendMessage", json!({"message": {"role": "ROLE_USER"}}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["error"]["code"], -32602, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("params.message"), "{body}");
    // A v0.3 name is served by its v1.0 method; an unknown one is not.
    let (_, body) = rpc(server.port, ALICE, "tasks/get", json!({"id": "x"}));
    assert_eq!(body["error"]["code"], -32001, "{body}");
    let (_, body) = rpc(server.port, ALICE, "tasks/list", json!({}));
    assert_eq!(body["error"]["code"], -32601, "{body}");
    let (_, body) = rpc(server.port, ALICE, "CreateTaskPushNotificationConfig", json!({}));
    assert_eq!(body["error"]["code"], -32003, "{body}");
    // A message with no text part is refused and starts nothing.
    let msg = json!({"message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"url": "https://x/y"}]}});
    let (_, body) = rpc(server.port, ALICE, "SendMessage", msg);
    assert_eq!(body["error"]["code"], -32005, "{body}");
    assert_nothing_ran(&env);
    drop(server);
}

/// A v0.3 client (Gemini CLI's, `@a2a-js/sdk` 0.3) finds the JSON-RPC URL as the card's `url`
/// and is answered in v0.3's shapes under v0.3's method names, by the same handlers.
#[test]
fn a_v03_client_finds_the_endpoint_on_the_card_and_is_answered_in_v03_shapes() {
    let env = env_exposing(&["main"]);
    let server = env.serve_http(&[]);
    let (_, _, body) = http_to(server.port, "GET", "/a2a/main/.well-known/agent-card.json", &[], "");
    let card: Value = serde_json::from_str(&body).unwrap();
    let url = format!("http://127.0.0.1:{}/a2a/main", server.port);
    assert_eq!((&card["url"], &card["preferredTransport"]), (&json!(url), &json!("JSONRPC")), "{card}");
    let msg = json!({"message": {"kind": "message", "role": "user", "messageId": "m1",
                                 "parts": [{"kind": "text", "text": "hello"}]}, "configuration": {"blocking": true}});
    let (_, body) = rpc(server.port, ALICE, "message/send", msg);
    let task = &body["result"];
    assert_eq!((&task["kind"], &task["status"]["state"]), (&json!("task"), &json!("completed")), "{body}");
    let reply = &task["status"]["message"];
    assert_eq!((&reply["kind"], &reply["role"]), (&json!("message"), &json!("agent")), "{body}");
    assert_eq!(reply["parts"], json!([{"kind": "text", "text": "ECHO: hello"}]), "{body}");
    let (_, body) = rpc(server.port, ALICE, "tasks/get", json!({"id": task["id"]}));
    assert_eq!(
        (&body["result"]["kind"], &body["result"]["status"]["state"]),
        (&json!("task"), &json!("completed")),
        "{body}"
    );
    let (_, body) = rpc(server.port, BOB, "tasks/get", json!({"id": task["id"]}));
    assert_eq!(body["error"]["code"], -32001, "another caller's task is not found: {body}");
    let (_, body) = rpc(server.port, ALICE, "tasks/cancel", json!({"id": task["id"]}));
    assert_eq!(body["error"]["code"], -32002, "{body}");
    drop(server);
}

#[test]
fn nothing_is_served_over_a2a_unless_the_config_exposes_the_agent() {
    let env = env_exposing(&[]);
    let server = env.serve_http(&[]);
    let (status, _, _) = http_to(server.port, "GET", "/a2a/main/.well-known/agent-card.json", &[], "");
    assert_eq!(status, 404);
    let (status, _) = rpc(server.port, ALICE, "GetTask", json!({"id": "x"}));
    assert_eq!(status, 404);
    drop(server);
    let env = env_exposing(&["other"]);
    let server = env.serve_http(&[]);
    let (status, _, _) = http_to(server.port, "GET", "/a2a/main/.well-known/agent-card.json", &[], "");
    assert_eq!(status, 404, "an agent not in server.a2a.agents");
    drop(server);
}

#[test]
fn the_send_policy_refuses_a_peers_message_on_channel_a2a_over_both_bindings() {
    let policy =
        json!({"sendPolicy": {"default": "allow", "rules": [{"action": "deny", "match": {"channel": "a2a"}}]}});
    let env = env_with(&["main"], policy);
    let server = env.serve_http(&[]);
    let msg = json!({"message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hello"}]}});
    let (status, body) = rpc(server.port, ALICE, "SendMessage", msg.clone());
    assert_eq!((status, &body["error"]["code"]), (200, &json!(-32600)), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("rule"), "{body}");
    let auth = format!("Bearer {ALICE}");
    let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    let (status, _, body) = http_to(server.port, "POST", "/a2a/main/message:send", &headers, &msg.to_string());
    assert_eq!(status, 403, "{body}");
    assert_nothing_ran(&env);
    drop(server);
}

#[test]
fn a_token_of_a_driven_session_is_refused_as_a_peer_and_a_repeated_message_id_starts_nothing_new() {
    let env = env_exposing(&["main"]);
    let server = env.serve_http(&[]);
    let msg =
        json!({"message": {"role": "ROLE_USER", "messageId": "m-1", "contextId": "c-1", "parts": [{"text": "hi"}]}});
    let (_, first) = rpc(server.port, ALICE, "SendMessage", msg.clone());
    assert_eq!(first["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{first}");
    assert_eq!(first["result"]["task"]["contextId"], "c-1", "{first}");
    // The same message id again (a retry): the same task, no second run.
    let (_, again) = rpc(server.port, ALICE, "SendMessage", msg);
    assert_eq!(again["result"]["task"]["id"], first["result"]["task"]["id"], "{again}");
    assert_eq!(env.run_counts()["ok"], 1, "{}", env.run_counts());
    // A client token minted for the context's own session (one our agent drives) may only read.
    let key = first["result"]["task"]["metadata"]["sessionKey"].as_str().unwrap().to_string();
    let out = env.run(&["token", "create", "--client", &key]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (status, body) = rpc(server.port, &token, "GetTask", json!({"id": first["result"]["task"]["id"]}));
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("may only read"), "{body}");
    drop(server);
}

#[test]
fn an_open_task_stream_holds_one_of_its_tokens_places() {
    use std::io::{BufRead, BufReader, Write};
    let env = env_with_server(&["main"], json!({}), json!({"maxStreamsPerCredential": 1}));
    let server = env.serve_http(&[]);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage",
        "params": {"message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "slow"}]}}})
    .to_string();
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        stream,
        "POST /a2a/main HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ALICE}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.contains("200"), "{status}");
    // While that stream is open, alice has no place left; bob has his own.
    let (busy, body) = rpc(server.port, ALICE, "GetTask", json!({"id": "x"}));
    assert_eq!(busy, 429, "{body}");
    let (free, body) = rpc(server.port, BOB, "GetTask", json!({"id": "x"}));
    assert_eq!((free, &body["error"]["code"]), (200, &json!(-32001)), "{body}");
    drop(reader);
    drop(stream);
    // The server sees the stream gone at its next write (a keep-alive at the latest).
    common::wait_until(std::time::Duration::from_secs(90), "alice's place back", || {
        (rpc(server.port, ALICE, "GetTask", json!({"id": "x"})).0 == 200).then_some(())
    });
    drop(server);
}

#[test]
fn a_peer_with_its_queue_full_is_told_to_retry_later_and_nothing_is_queued() {
    let env = env_with_server(&["main"], json!({}), json!({"a2a": {"maxQueuedRuns": 1}}));
    let server = env.serve_http(&[]);
    let send = |id: &str| {
        let msg = json!({"message": {"role": "ROLE_USER", "messageId": id, "contextId": "c", "parts": [{"text": "slow"}]},
                         "configuration": {"returnImmediately": true}});
        rpc(server.port, ALICE, "SendMessage", msg)
    };
    let (_, running) = send("m1");
    let first = running["result"]["task"]["id"].as_str().unwrap().to_string();
    common::wait_until(std::time::Duration::from_secs(30), "the first turn running", || {
        let (_, t) = rpc(server.port, ALICE, "GetTask", json!({"id": first}));
        (t["result"]["status"]["state"] == "TASK_STATE_WORKING").then_some(())
    });
    // The next turn of the same context waits behind it: the one queued run allowed.
    let (_, queued) = send("m2");
    assert_eq!(queued["result"]["task"]["status"]["state"], "TASK_STATE_SUBMITTED", "{queued}");
    let (status, full) = send("m3");
    assert_eq!((status, &full["error"]["code"]), (200, &json!(-32603)), "{full}");
    assert!(full["error"]["message"].as_str().unwrap().contains("server.a2a.maxQueuedRuns is 1"), "{full}");
    assert!(full["error"]["data"].to_string().contains("RetryInfo"), "{full}");
    let auth = format!("Bearer {ALICE}");
    let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    let body = json!({"message": {"role": "ROLE_USER", "messageId": "m4", "parts": [{"text": "hi"}]}}).to_string();
    let (status, head, body) = http_to(server.port, "POST", "/a2a/main/message:send", &headers, &body);
    assert_eq!(status, 429, "{body}");
    assert!(head.iter().any(|(k, v)| k == "retry-after" && v == "10"), "{head:?}");
    assert_eq!(env.run_counts()["queued"], 1, "{}", env.run_counts());
    drop(server);
}

/// A2A request bodies are bounded as `/mcp`'s are (`server::http::max_body_bytes`): one byte over
/// is answered on both bindings with the 413 `/mcp` gives, in its words, and starts nothing; a body
/// at the limit is read (and here refused for its params).
#[test]
fn a_body_over_the_mcp_limit_is_refused_with_mcps_413_on_both_bindings() {
    let (config, _) = sessions_mcp::config::parse("{}").unwrap();
    let limit = sessions_mcp::server::http::max_body_bytes(&config);
    let env = env_exposing(&["main"]);
    let server = env.serve_http(&[]);
    let auth = format!("Bearer {ALICE}");
    let headers = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Authorization", auth.as_str()),
    ];
    let padded = |head: &str, len: usize| format!("{head}\"pad\":\"{}\"}}", "x".repeat(len - head.len() - 9));
    let rpc_body = |len| padded(r#"{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{},"#, len);
    let (mcp_status, _, mcp_said) = http_to(server.port, "POST", "/mcp", &headers, &rpc_body(limit + 1));
    assert_eq!(mcp_status, 413, "{mcp_said}");
    for path in ["/a2a/main", "/a2a/main/message:send", "/a2a/main/message:stream"] {
        let body = |len| if path == "/a2a/main" { rpc_body(len) } else { padded("{", len) };
        assert_eq!(body(limit + 1).len(), limit + 1);
        let (status, _, said) = http_to(server.port, "POST", path, &headers, &body(limit + 1));
        assert_eq!((status, said.as_str()), (413, mcp_said.as_str()), "{path}: one byte over");
        let (status, _, said) = http_to(server.port, "POST", path, &headers, &body(limit));
        let said = &said[..said.len().min(300)];
        assert!(
            [200, 400].contains(&status) && said.contains("missing field"),
            "{path}: at the limit: {status} {said}"
        );
    }
    assert_nothing_ran(&env);
    drop(server);
}

/// v0.3's `configuration.blocking: false` answers a `message/send` at once, with the task still
/// under way, as v1.0's `returnImmediately: true` does; a `blocking` that is not a boolean is
/// refused naming it, and starts nothing.
#[test]
fn a_v03_send_with_blocking_false_answers_at_once() {
    let env = env_exposing(&["main"]);
    let server = env.serve_http(&[]);
    let msg = |id: &str, blocking: Value| {
        json!({"message": {"kind": "message", "role": "user", "messageId": id,
                           "parts": [{"kind": "text", "text": "slow"}]}, "configuration": {"blocking": blocking}})
    };
    let (_, body) = rpc(server.port, ALICE, "message/send", msg("m1", json!("no")));
    assert_eq!(body["error"]["code"], -32602, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("params.configuration.blocking"), "{body}");
    assert_nothing_ran(&env);
    let (_, body) = rpc(server.port, ALICE, "message/send", msg("m2", json!(false)));
    let task = &body["result"];
    assert_eq!(task["kind"], "task", "{body}");
    assert!(matches!(task["status"]["state"].as_str(), Some("submitted" | "working")), "{body}");
    let (_, body) = rpc(server.port, ALICE, "tasks/cancel", json!({"id": task["id"]}));
    assert_eq!(body["result"]["status"]["state"], "canceled", "{body}");
    drop(server);
}
