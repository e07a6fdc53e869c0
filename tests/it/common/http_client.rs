//! A plain HTTP/1.1 MCP client for the black-box tests: one request per connection, JSON or SSE
//! bodies, both protocol eras (`initialize` + `Mcp-Session-Id`, or 2026-07-28 stateless requests).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

/// One HTTP/1.1 request; returns (status, lower-case headers, body).
pub fn http(port: u16, method: &str, headers: &[(&str, &str)], body: &str) -> (u16, Vec<(String, String)>, String) {
    http_to(port, method, "/mcp", headers, body)
}

/// [`http`] to another path.
pub fn http_to(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    let _ = s.write_all(req.as_bytes());
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap_or("").split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect::<Vec<_>>();
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    (status, headers, if chunked { dechunk(body) } else { body.to_string() })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// JSON-RPC messages of a JSON or SSE body.
pub fn messages(body: &str) -> Vec<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return vec![v];
    }
    body.split("\n\n")
        .filter_map(|ev| {
            let data: Vec<&str> = ev.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
            serde_json::from_str(&data.join("\n")).ok()
        })
        .collect()
}

/// A client in either protocol era.
pub struct Mcp {
    pub port: u16,
    pub token: String,
    pub session: Option<String>,
    pub modern: bool,
    next_id: u64,
    /// What a modern client declares in each request's `_meta`.
    pub capabilities: Value,
}

impl Mcp {
    pub fn legacy(port: u16, token: &str) -> Mcp {
        let mut c =
            Mcp { port, token: token.into(), session: None, modern: false, next_id: 1, capabilities: json!({}) };
        let init = c.rpc(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "sessions-mcp", "{init}");
        c.notify("notifications/initialized");
        c
    }

    pub fn modern(port: u16, token: &str) -> Mcp {
        Mcp { port, token: token.into(), session: None, modern: true, next_id: 1, capabilities: json!({}) }
    }

    pub fn post(&mut self, body: Value, method: &str, name: Option<&str>) -> (u16, Vec<(String, String)>, String) {
        let auth = format!("Bearer {}", self.token);
        let mut h: Vec<(&str, &str)> =
            vec![("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
        // An empty token sends no Authorization header at all (`serve --http --as`).
        if !self.token.is_empty() {
            h.push(("Authorization", &auth));
        }
        let sid = self.session.clone();
        if let Some(s) = &sid {
            h.push(("Mcp-Session-Id", s));
        }
        if self.modern {
            h.push(("MCP-Protocol-Version", "2026-07-28"));
            h.push(("Mcp-Method", method));
            if let Some(n) = name {
                h.push(("Mcp-Name", n));
            }
        }
        let out = http(self.port, "POST", &h, &body.to_string());
        if let Some((_, v)) = out.1.iter().find(|(k, _)| k == "mcp-session-id") {
            self.session = Some(v.clone());
        }
        out
    }

    pub fn notify(&mut self, method: &str) {
        let (status, _, _) = self.post(json!({"jsonrpc": "2.0", "method": method}), method, None);
        assert!(status == 202 || status == 200, "{method}: {status}");
    }

    pub fn rpc(&mut self, method: &str, mut params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        if self.modern {
            params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                     "io.modelcontextprotocol/clientCapabilities": self.capabilities});
        }
        // Mcp-Name carries the tool name, or the task id of tasks/*.
        let name = params.get("name").or_else(|| params.get("taskId")).and_then(Value::as_str).map(String::from);
        let (status, _, body) =
            self.post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}), method, name.as_deref());
        assert_eq!(status, 200, "{method}: {body}");
        messages(&body)
            .into_iter()
            .find(|m| m["id"] == json!(id))
            .unwrap_or_else(|| panic!("no answer to {method}: {body}"))
    }

    pub fn call(&mut self, tool: &str, args: Value) -> Value {
        let r = self.rpc("tools/call", json!({"name": tool, "arguments": args}));
        let structured = r["result"]["structuredContent"].clone();
        super::assert_conforms(tool, &structured);
        structured
    }
}

/// Posts a JSON-RPC request on the legacy era's session and closes the connection after `after`
/// without reading the answer: a client that goes away mid-request.
pub fn abandon_request(port: u16, token: &str, session: Option<&str>, body: &Value, after: Duration) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = body.to_string();
    let mut req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(sid) = session {
        req.push_str(&format!("Mcp-Session-Id: {sid}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).unwrap();
    std::thread::sleep(after);
    let _ = s.shutdown(std::net::Shutdown::Both);
}
