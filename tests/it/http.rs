//! `serve --http`, black-box: the stdio scenarios over streamable HTTP in both protocol eras
//! (the `initialize` handshake with `Mcp-Session-Id`, and 2026-07-28 stateless requests), bearer
//! identity, and the hardening: 401s, Host/Origin checks, the body limit, slow headers, load.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::http_client::{Mcp, http, messages};
use common::{HttpServer, TestEnv};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn sha(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn start(env: &TestEnv) -> HttpServer {
    env.serve_http(&[])
}

const DESK: &str = "desk-token-0123456789";
const OTHER: &str = "other-token-0123456789";

fn env_with_tokens(extra: &str) -> TestEnv {
    let env = TestEnv::with_config(&format!(
        "{{server: {{tokens: [{{sha256: '{}', sessionKey: 'agent:main:desk'}}, {{sha256: '{}', sessionKey: 'agent:main:other'}}]{extra}}}}}",
        sha(DESK),
        sha(OTHER)
    ));
    env.seed(json!({"sessions": [{"key": "agent:main:cron:job", "messages": [{"role": "user", "content": "hello"}]}]}));
    env
}

#[test]
fn the_stdio_scenarios_pass_over_http_in_both_eras() {
    let env = env_with_tokens("");
    let server = start(&env);
    for modern in [false, true] {
        let mut c = if modern { Mcp::modern(server.port, DESK) } else { Mcp::legacy(server.port, DESK) };
        let tools = c.rpc("tools/list", json!({}));
        assert_eq!(tools["result"]["tools"].as_array().unwrap().len(), 6, "{tools}");
        let list = c.call("sessions_list", json!({}));
        let keys = common::keys_of(&list);
        assert!(keys.contains(&"agent:main:desk".to_string()), "the token's session: {list}");
        assert!(keys.iter().all(|k| k == "agent:main:desk" || k.starts_with("agent:main:subagent:")), "{keys:?}");
        let h = c.call("sessions_history", json!({"sessionKey": "agent:main:desk"}));
        assert_eq!(h["status"], "ok");
        // A send with a wait: the child of desk answers through the built-in echo agent.
        let spawn = c.call("sessions_spawn", json!({"task": "compute"}));
        assert_eq!(spawn["status"], "accepted", "{spawn}");
        let child = spawn["childSessionKey"].as_str().unwrap().to_string();
        let after = spawn["inbox"]["afterSeq"].as_i64().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let announce = loop {
            let h = c.call("sessions_history", json!({"sessionKey": "agent:main:desk", "afterSeq": after}));
            if let Some(m) = h["messages"].as_array().unwrap().first() {
                break m.clone();
            }
            assert!(Instant::now() < deadline, "no announce");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(announce["content"][0]["text"].as_str().unwrap().starts_with("Status: completed successfully"));
        let send = c.call("sessions_send", json!({"sessionKey": child, "message": "again?", "timeoutSeconds": 20}));
        assert_eq!(send["status"], "ok", "{send}");
        assert_eq!(send["reply"], "ECHO: again?");
    }
}

#[test]
fn a_stateless_client_declaring_tasks_polls_a_spawn_to_its_end_and_no_other_token_sees_it() {
    let env = env_with_tokens("");
    let server = start(&env);
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let mut desk = Mcp::modern(server.port, DESK);
    desk.capabilities = tasks.clone();
    let created = desk.rpc("tools/call", json!({"name": "sessions_spawn", "arguments": {"task": "compute"}}));
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let task_id = created["result"]["taskId"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = loop {
        let t = desk.rpc("tasks/get", json!({"taskId": task_id}));
        if t["result"]["status"] != "working" {
            break t;
        }
        assert!(Instant::now() < deadline, "the task never ended: {t}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(done["result"]["result"]["structuredContent"]["status"], "ok", "{done}");
    let mut other = Mcp::modern(server.port, OTHER);
    other.capabilities = tasks;
    for method in ["tasks/get", "tasks/cancel"] {
        let denied = other.rpc(method, json!({"taskId": task_id}));
        let missing = other.rpc(method, json!({"taskId": "00000000-0000-4000-8000-000000000000"}));
        assert_eq!(denied["error"]["code"], -32602, "{denied}");
        let strip = |v: &Value, id: &str| v["error"]["message"].as_str().unwrap().replace(id, "ID");
        assert_eq!(strip(&denied, &task_id), strip(&missing, "00000000-0000-4000-8000-000000000000"), "{method}");
    }
}

#[test]
fn bad_tokens_get_401_and_nothing_else() {
    let env = env_with_tokens("");
    env.seed(json!({"sessions": [{"key": "agent:main:w"}], "runTokens": [
        {"token": "smcp_run_ended", "sessionKey": "agent:main:w", "runId": "r1", "expiresAt": 1}]}));
    let server = start(&env);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let missing = "missing bearer token";
    let unknown = "token not recognised or expired";
    let basic = format!("Basic {DESK}");
    let cases = [
        (None, missing),
        (Some("Bearer nope"), unknown),
        (Some("Bearer smcp_run_ended"), unknown),
        (Some(&*basic), missing),
    ];
    for (auth, reason) in cases {
        let mut h = vec![("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
        if let Some(a) = auth {
            h.push(("Authorization", a));
        }
        let (status, headers, text) = http(server.port, "POST", &h, &body);
        assert_eq!(status, 401, "{auth:?}");
        assert!(headers.iter().any(|(k, v)| k == "www-authenticate" && v.starts_with("Bearer")), "{headers:?}");
        assert!(headers.iter().any(|(k, v)| k == "content-type" && v == "application/json"), "{headers:?}");
        let body: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{auth:?}: a JSON reason ({e}): {text}"));
        assert_eq!(body, json!({"error": "unauthorized", "error_description": reason}), "{auth:?}: nothing more");
    }
    // Another session's token acts as that session, and sees nothing of desk's.
    let mut other = Mcp::legacy(server.port, OTHER);
    let list = other.call("sessions_list", json!({}));
    assert_eq!(common::keys_of(&list), ["agent:main:other"]);
    let h = other.call("sessions_history", json!({"sessionKey": "agent:main:desk"}));
    assert_eq!(h["status"], "forbidden");
}

#[test]
fn serve_http_as_a_session_needs_no_header_on_loopback_but_still_rejects_bad_tokens() {
    let env = env_with_tokens("");
    let server = env.serve_http(&["--as", "agent:main:cron:job"]);
    for modern in [false, true] {
        let mut c = if modern { Mcp::modern(server.port, "") } else { Mcp::legacy(server.port, "") };
        let list = c.call("sessions_list", json!({}));
        assert_eq!(common::keys_of(&list), ["agent:main:cron:job"], "acts as the --as session: {list}");
    }
    // A token, when sent, is still checked: a bad one is 401, a good one acts as its own session.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string();
    let h = [("Authorization", "Bearer nope"), ("Content-Type", "application/json"), ("Accept", "application/json")];
    assert_eq!(http(server.port, "POST", &h, &body).0, 401);
    let mut desk = Mcp::legacy(server.port, DESK);
    assert!(common::keys_of(&desk.call("sessions_list", json!({}))).contains(&"agent:main:desk".to_string()));
    // Never with requireToken.
    let env = TestEnv::with_config("{security: {requireToken: true}}");
    let out = env.command(&["serve", "--http", "127.0.0.1:0", "--as", "main"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--as with --http"), "{out:?}");
}

/// `subscriptions/listen` (2026-07-28): one long-lived POST response that first acknowledges the
/// accepted filter, then carries `notifications/resources/updated` tagged with the subscription id.
#[test]
fn subscriptions_listen_notifies_when_a_watched_transcript_grows() {
    let env = env_with_tokens("");
    let server = start(&env);
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mine = "sessions://history/agent:main:desk";
    let body = json!({"jsonrpc": "2.0", "id": "sub-1", "method": "subscriptions/listen", "params": {
        "notifications": {"resourceSubscriptions": [mine, "sessions://history/agent:main:other"], "toolsListChanged": true},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {DESK}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: subscriptions/listen\r\nContent-Length: {}\r\n\r\n{body}",
        server.port,
        body.len()
    );
    stream.write_all(req.as_bytes()).unwrap();
    let mut seen = String::new();
    let mut read_until = |needle: &str, seen: &mut String| {
        let mut buf = [0u8; 4096];
        while !seen.contains(needle) {
            let n = stream.read(&mut buf).unwrap_or(0);
            assert!(n > 0, "stream ended before {needle:?}: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    };
    read_until("notifications/subscriptions/acknowledged", &mut seen);
    // Only the transcripts are accepted (our tool list never changes), both of them alike:
    // the acknowledgment does not reveal that agent:main:other exists and is invisible to desk.
    read_until("sessions://history/agent:main:other", &mut seen);
    assert!(!seen.contains("toolsListChanged"), "{seen}");
    // desk's transcript grows: a spawn's announce lands in its inbox.
    let mut c = Mcp::modern(server.port, DESK);
    assert_eq!(c.call("sessions_spawn", json!({"task": "compute"}))["status"], "accepted");
    read_until("notifications/resources/updated", &mut seen);
    let update = messages(&seen[seen.find("\r\n\r\n").unwrap() + 4..].replace("\r\n", "\n"))
        .into_iter()
        .find(|m| m["method"] == "notifications/resources/updated");
    let update = update.unwrap_or_else(|| panic!("no parsable update in {seen}"));
    assert_eq!(update["params"]["uri"], mine, "{update}");
    assert_eq!(update["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub-1", "{update}");
}

#[test]
fn foreign_host_and_origin_are_refused() {
    let env = env_with_tokens("");
    let server = start(&env);
    let auth = format!("Bearer {DESK}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string();
    let base = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let mut evil_host = base.to_vec();
    evil_host.push(("Host", "evil.example:80"));
    assert_eq!(http(server.port, "POST", &evil_host, &body).0, 403);
    let mut evil_origin = base.to_vec();
    evil_origin.push(("Origin", "http://evil.example"));
    assert_eq!(http(server.port, "POST", &evil_origin, &body).0, 403);
    let mut local_origin = base.to_vec();
    let origin = format!("http://localhost:{}", server.port);
    local_origin.push(("Origin", &origin));
    assert_eq!(http(server.port, "POST", &local_origin, &body).0, 200);
    // The health endpoint needs no token.
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(s, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200") && out.contains("\"ok\""), "{out}");
}

#[test]
fn the_body_limit_fits_the_largest_spawn_and_no_more() {
    let (config, _) = sessions_mcp::config::parse("{}").unwrap();
    let limit = sessions_mcp::server::http::max_body_bytes(&config);
    assert!(limit >= 5 * 1024 * 1024 * 4 / 3, "room for 5 MiB of attachments in base64");
    let env = env_with_tokens("");
    let server = start(&env);
    let auth = format!("Bearer {DESK}");
    let h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let frame = |len: usize| {
        let head = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}},"pad":""#;
        let tail = "\"}";
        format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()))
    };
    assert_eq!(http(server.port, "POST", &h, &frame(limit + 1)).0, 413, "one byte over");
    assert_ne!(http(server.port, "POST", &h, &frame(limit)).0, 413, "exactly at the limit");
}

#[test]
fn a_client_sending_one_header_byte_per_second_is_dropped() {
    let env = env_with_tokens(", headerTimeoutSeconds: 1");
    let server = start(&env);
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    let mut dropped = false;
    for b in b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaa" {
        if s.write_all(&[*b]).is_err() {
            dropped = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(400));
        if started.elapsed() > Duration::from_secs(6) {
            break;
        }
    }
    if !dropped {
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]);
        dropped = n == 0 || text.starts_with("HTTP/1.1 408");
    }
    assert!(dropped, "the slow client was not dropped");
    assert!(started.elapsed() < Duration::from_secs(8));
}

#[test]
fn two_hundred_clients_twenty_calls_each() {
    let n_clients = 200;
    let tokens: Vec<String> = (0..n_clients).map(|i| format!("load-token-{i:04}-abcdefghij")).collect();
    let list: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{{sha256: '{}', sessionKey: 'agent:main:c{i}'}}", sha(t)))
        .collect();
    // 200 clients on one address: more than the default maxConnectionsPerPeer (128) may be open.
    let env = TestEnv::with_config(&format!(
        "{{server: {{tokens: [{}], maxConnectionsPerPeer: 256}}, tools: {{sessions: {{visibility: 'self'}}}}}}",
        list.join(", ")
    ));
    let server = start(&env);
    let port = server.port;
    let handles: Vec<_> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, token)| {
            std::thread::spawn(move || {
                let mut c = Mcp::legacy(port, &token);
                let mut times = Vec::new();
                for _ in 0..20 {
                    let t = Instant::now();
                    let list = c.call("sessions_list", json!({}));
                    times.push(t.elapsed());
                    let keys = common::keys_of(&list);
                    assert_eq!(keys, [format!("agent:main:c{i}")], "only its own session");
                    assert!(
                        !list.to_string().contains(&format!("agent:main:c{}", (i + 1) % 200)) || (i + 1) % 200 == i
                    );
                }
                times
            })
        })
        .collect();
    let mut all: Vec<Duration> = handles.into_iter().flat_map(|h| h.join().expect("a client failed")).collect();
    all.sort();
    assert_eq!(all.len(), 4000, "every call answered");
    let p = |q: f64| all[((all.len() - 1) as f64 * q) as usize];
    eprintln!("200 clients x 20 calls: p50 {:?}, p99 {:?}, max {:?}", p(0.5), p(0.99), all.last().unwrap());
}

#[test]
fn tls_serves_https_and_plain_http_is_refused() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let mut env = env_with_tokens("");
    let (cert_path, key_path) = (env.dir.path().join("cert.pem"), env.dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    env.set_config(&format!(
        "{{server: {{tls: {{cert: '{}', key: '{}'}}, tokens: [{{sha256: '{}', sessionKey: 'agent:main:desk'}}]}}}}",
        cert_path.display(),
        key_path.display(),
        sha(DESK)
    ));
    let server = env.serve_http(&[]);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).unwrap();
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, TcpStream::connect(("127.0.0.1", server.port)).unwrap());
    write!(tls, "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = tls.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200") && out.contains("\"ok\""), "{out}");
    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = plain.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let mut buf = [0u8; 64];
    let n = plain.read(&mut buf).unwrap_or(0);
    assert!(!String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}

#[test]
fn idle_connections_are_closed() {
    let env = env_with_tokens(", idleTimeoutSeconds: 1");
    let server = start(&env);
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let started = Instant::now();
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the kept-alive connection was closed");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(800) && waited < Duration::from_secs(5), "{waited:?}");
}

#[test]
fn a_non_loopback_bind_needs_allowed_hosts_and_tls_or_insecure_remote() {
    let env = TestEnv::new();
    let out = env.command(&["serve", "--http", "0.0.0.0:0"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.allowedHosts"));
    let env = TestEnv::with_config("{server: {allowedHosts: ['mcp.example.org']}}");
    let out = env.command(&["serve", "--http", "0.0.0.0:0"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--insecure-remote"));
}

#[test]
fn attachment_limits_hold_over_http_too() {
    let env = env_with_tokens(
        "}, tools: {sessions_spawn: {attachments: {enabled: true, maxFiles: 2, maxFileBytes: 1048576, maxTotalBytes: 1048576}}",
    );
    let server = start(&env);
    let mut c = Mcp::legacy(server.port, DESK);
    let at = "a".repeat(1024 * 1024);
    let ok = c.call("sessions_spawn", json!({"task": "x", "attachments": [{"name": "big.txt", "content": at}]}));
    assert_eq!(ok["status"], "accepted", "exactly at maxFileBytes over HTTP");
    assert_eq!(ok["attachments"]["totalBytes"], 1024 * 1024);
    let over = "a".repeat(1024 * 1024 + 1);
    let bad = c.call("sessions_spawn", json!({"task": "x", "attachments": [{"name": "big.txt", "content": over}]}));
    assert_eq!(bad["status"], "invalid");
    assert!(bad["error"].as_str().unwrap().contains("maxFileBytes"));
}

/// A legacy SSE session: the GET stream and its message endpoint.
struct SseSession {
    reader: BufReader<TcpStream>,
    endpoint: String,
}

fn open_sse(port: u16, token: &str) -> SseSession {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n").unwrap();
    let mut reader = BufReader::new(s);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let endpoint = loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if let Some(d) = line.trim().strip_prefix("data: ").or_else(|| line.trim().strip_prefix("data:"))
            && d.starts_with("/message")
        {
            break d.trim().to_string();
        }
    };
    SseSession { reader, endpoint }
}

impl SseSession {
    fn post(&self, port: u16, token: &str, body: Value) -> u16 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST {} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.endpoint,
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    }

    /// The next JSON-RPC message on the stream with this id.
    fn response(&mut self, id: u64) -> Value {
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).unwrap();
            assert!(n > 0, "the SSE stream ended");
            let Some(d) = line.trim().strip_prefix("data:") else { continue };
            if let Ok(v) = serde_json::from_str::<Value>(d.trim())
                && v["id"] == json!(id)
            {
                return v;
            }
        }
    }
}

/// A legacy SSE session through its handshake; returns it and the `initialize` answer.
fn initialized_sse(port: u16, token: &str) -> (SseSession, Value) {
    let mut sse = open_sse(port, token);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}});
    assert_eq!(sse.post(port, token, init), 202);
    let answer = sse.response(1);
    assert_eq!(sse.post(port, token, json!({"jsonrpc": "2.0", "method": "notifications/initialized"})), 202);
    (sse, answer)
}

#[test]
fn the_legacy_sse_transport_serves_tools_with_the_same_bearer() {
    let env = env_with_tokens("");
    let server = start(&env);
    let port = server.port;
    let (mut sse, init) = initialized_sse(port, DESK);
    assert_eq!(init["result"]["serverInfo"]["name"], "sessions-mcp");
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sessions_list", "arguments": {}}});
    assert_eq!(sse.post(port, DESK, call.clone()), 202);
    let list = sse.response(2)["result"]["structuredContent"].clone();
    common::assert_conforms("sessions_list", &list);
    assert!(common::keys_of(&list).contains(&"agent:main:desk".to_string()), "{list}");
    // Another valid token's post is answered as for an unknown session (404); no token is 401.
    assert_eq!(sse.post(port, OTHER, call.clone()), 404);
    assert_eq!(sse.post(port, "wrong-token", call.clone()), 401);
    let stray = SseSession {
        reader: BufReader::new(TcpStream::connect(("127.0.0.1", port)).unwrap()),
        endpoint: "/message?sessionId=nope".into(),
    };
    assert_eq!(stray.post(port, DESK, call), 404);
    // The GET needs a token too.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 401"), "{out}");
}

/// (status, body) of one request on `/mcp` with this token and `Mcp-Session-Id`.
fn on_session(port: u16, method: &str, token: &str, session: &str, body: &str) -> (u16, String) {
    let auth = format!("Bearer {token}");
    let h = [
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", session),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let (status, _, body) = http(port, method, &h, body);
    (status, body)
}

#[test]
fn an_mcp_session_answers_only_the_token_that_opened_it_and_others_learn_nothing() {
    let env = env_with_tokens("");
    let server = start(&env);
    let mut desk = Mcp::legacy(server.port, DESK);
    let session = desk.session.clone().expect("a session id");
    let call = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "sessions_list", "arguments": {}}})
        .to_string();
    for (method, body) in [("POST", call.as_str()), ("GET", ""), ("DELETE", "")] {
        let foreign = on_session(server.port, method, OTHER, &session, body);
        let missing = on_session(server.port, method, OTHER, "3f1c0a52-0000-4000-8000-000000000000", body);
        assert_eq!(foreign, missing, "{method} with another token is answered as for a missing session");
        // rmcp answers 404 for a missing session, except DELETE, which it acknowledges (202).
        assert_eq!(foreign.0, if method == "DELETE" { 202 } else { 404 }, "{method}: {foreign:?}");
    }
    // The owner's session survived the foreign DELETE and still answers its token.
    let list = desk.call("sessions_list", json!({}));
    assert!(common::keys_of(&list).contains(&"agent:main:desk".to_string()), "{list}");
    let (status, _) = on_session(server.port, "DELETE", DESK, &session, "");
    assert!((200..300).contains(&status), "the owner may end it: {status}");
    assert_eq!(on_session(server.port, "POST", DESK, &session, &call).0, 404, "ended");
}

#[test]
fn a_request_id_already_in_flight_on_a_session_is_refused_at_once_and_freed_after() {
    let mut env = TestEnv::new();
    let script = json!({"default": {"sleepMs": 2500, "reply": "slow: {input}"}});
    let worker = common::scripted_agent(&env, "worker", &script, json!({}));
    let mut config: Value =
        serde_json::from_str(&common::agents_config(vec![json!({"id": "main"}), worker], json!({}))).unwrap();
    config["server"] = json!({"tokens": [{"sha256": sha(DESK), "sessionKey": "agent:main:desk"}]});
    env.set_config(&config.to_string());
    let server = start(&env);
    let desk = Mcp::legacy(server.port, DESK);
    let session = desk.session.clone().unwrap();
    let slow = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "sessions_send",
        "arguments": {"sessionKey": "agent:worker:main", "message": "one", "timeoutSeconds": 30}}})
    .to_string();
    let port = server.port;
    let (first_session, first_body) = (session.clone(), slow.clone());
    let first = std::thread::spawn(move || on_session(port, "POST", DESK, &first_session, &first_body));
    // Its run exists only once the request went through the guard and reached the tool.
    common::wait_until(Duration::from_secs(10), "the slow send's run", || {
        // The send makes the session first, so `show` may find nothing on the first polls.
        let shown = env.try_show("agent:worker:main").ok()?;
        (!common::runs_of(&shown, None).is_empty()).then_some(())
    });
    let ping = json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}).to_string();
    let refused = common::wait_until(Duration::from_secs(10), "the duplicate to be refused", || {
        let (status, body) = on_session(port, "POST", DESK, &session, &ping);
        let answer = messages(&body).into_iter().find(|m| m["id"] == 7)?;
        (status == 200 && answer.get("error").is_some()).then_some(answer)
    });
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("request id 7 is already in flight"), "{refused}");
    let (status, body) = first.join().unwrap();
    let answer = messages(&body).into_iter().find(|m| m["id"] == 7).unwrap_or_else(|| panic!("{status} {body}"));
    assert_eq!(answer["result"]["structuredContent"]["reply"], "slow: one", "the first request is answered: {answer}");
    let (_, body) = on_session(port, "POST", DESK, &session, &ping);
    let again = messages(&body).into_iter().find(|m| m["id"] == 7).unwrap();
    assert!(again.get("result").is_some(), "the id is free once answered: {again}");
}

#[test]
fn the_legacy_message_endpoint_takes_the_same_large_bodies_as_mcp() {
    let env = env_with_tokens("");
    let server = start(&env);
    let port = server.port;
    let (mut sse, _) = initialized_sse(port, DESK);
    // 3.8 MB: legal on /mcp (its limit fits 5 MiB of attachments), over axum's 2 MB default.
    let big = json!({"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"_meta": {"pad": "x".repeat(3_800_000)}}});
    assert_eq!(sse.post(port, DESK, big), 202, "a legal large body is accepted on /message too");
    assert!(sse.response(2).get("result").is_some());
}

fn status_and_start(s: &mut TcpStream) -> (u16, String) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = String::new();
    while !got.contains("\r\n\r\n") || (got.starts_with("HTTP/1.1 429") && !got.ends_with('}')) {
        let n = s.read(&mut buf).expect("an answer before the read timeout");
        if n == 0 {
            break;
        }
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let status = got.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, got)
}

fn health_from(s: &mut TcpStream) -> (u16, String) {
    write!(s, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    status_and_start(s)
}

#[test]
fn one_token_cannot_fill_the_listener_with_streams() {
    let env = env_with_tokens("");
    let server = start(&env);
    let port = server.port;
    let mut streams = Vec::new();
    let mut refused = Vec::new();
    for _ in 0..260 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(s, "GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {DESK}\r\nAccept: text/event-stream\r\n\r\n").unwrap();
        match status_and_start(&mut s) {
            (200, _) => streams.push(s),
            (429, text) => refused.push(text),
            other => panic!("GET /sse: {other:?}"),
        }
    }
    assert_eq!(streams.len(), 64, "server.maxStreamsPerCredential streams are open");
    assert_eq!(refused.len(), 196);
    let body: Value = serde_json::from_str(&refused[0][refused[0].find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(body["limit"], "server.maxStreamsPerCredential", "{body}");
    assert_eq!(body["max"], 64, "{body}");
    assert!(body["error"].as_str().unwrap().contains("retry later"), "{body}");
    // Everyone else is still served.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert_eq!(health_from(&mut s).0, 200);
    let mut other = Mcp::legacy(port, OTHER);
    assert_eq!(other.call("sessions_list", json!({}))["status"], "ok");
    // Closing streams gives their places back.
    drop(streams.drain(..10));
    common::wait_until(Duration::from_secs(20), "a stream place is free again", || {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(s, "GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {DESK}\r\nAccept: text/event-stream\r\n\r\n").unwrap();
        (status_and_start(&mut s).0 == 200).then_some(())
    });
}

#[test]
fn one_address_cannot_fill_the_listener_with_connections() {
    let env = env_with_tokens(", headerTimeoutSeconds: 120");
    let server = start(&env);
    let port = server.port;
    let idle: Vec<TcpStream> = (0..128).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    let auth = format!("Bearer {DESK}");
    let h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
    let (status, _, body) = http(port, "POST", &h, &ping);
    assert_eq!(status, 429, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(body["limit"], "server.maxConnectionsPerPeer", "{body}");
    assert_eq!(body["max"], 128, "{body}");
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert_eq!(health_from(&mut s).0, 200, "health answers even past the cap");
    // 127.0.0.2 is another address on the loopback interface.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut elsewhere = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        socket.connect(([127, 0, 0, 1], port).into()).await.unwrap().into_std().unwrap()
    });
    elsewhere.set_nonblocking(false).unwrap();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).to_string();
    write!(
        elsewhere,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {OTHER}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (status, text) = status_and_start(&mut elsewhere);
    assert_eq!(status, 200, "{text}");
    drop(idle);
}
