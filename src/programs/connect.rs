//! An MCP client of the owner's run socket (streamable HTTP over a Unix socket), used by
//! `sessions-mcp connect` (a stdio proxy for agents that only speak stdio MCP) and by the scripted
//! agent's `call` action. It speaks plain HTTP/1.1 with the run token as bearer and reads both
//! JSON and SSE answers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// Why a request to the socket failed.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot reach the sessions-mcp socket {path}: {source} (is a sessions-mcp owner running?)")]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("the socket refused the token (401): SESSIONS_MCP_TOKEN is unknown or its run has ended")]
    Unauthorized,
    #[error("HTTP {0} from the sessions-mcp socket: {1}")]
    Status(u16, String),
    #[error("talking to the sessions-mcp socket: {0}")]
    Http(String),
}

/// One MCP client connection state: the token and the legacy session id once initialized.
#[derive(Clone)]
pub struct SocketClient {
    socket: PathBuf,
    token: String,
    session_id: Arc<Mutex<Option<String>>>,
}

impl SocketClient {
    pub fn new(socket: &Path, token: &str) -> Self {
        SocketClient { socket: socket.to_path_buf(), token: token.to_string(), session_id: Arc::new(Mutex::new(None)) }
    }

    /// POSTs one JSON-RPC message; returns the JSON-RPC messages the answer carried.
    pub async fn post(&self, message: &str) -> Result<Vec<Value>, SocketError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| SocketError::Connect { path: self.socket.clone(), source })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| SocketError::Http(e.to_string()))?;
        tokio::spawn(conn);
        let mut req = hyper::Request::post("/mcp")
            .header(hyper::header::HOST, "localhost")
            .header(hyper::header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json, text/event-stream");
        if let Some(sid) = self.session_id.lock().await.clone() {
            req = req.header("mcp-session-id", sid);
        }
        let req =
            req.body(Full::new(Bytes::from(message.to_string()))).map_err(|e| SocketError::Http(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(|e| SocketError::Http(e.to_string()))?;
        let status = resp.status();
        if let Some(sid) = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
            *self.session_id.lock().await = Some(sid.to_string());
        }
        let sse = resp
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let body = resp.into_body().collect().await.map_err(|e| SocketError::Http(e.to_string()))?.to_bytes();
        let text = String::from_utf8_lossy(&body).to_string();
        if status == hyper::StatusCode::UNAUTHORIZED {
            return Err(SocketError::Unauthorized);
        }
        if !status.is_success() {
            return Err(SocketError::Status(status.as_u16(), text));
        }
        Ok(if sse { sse_messages(&text) } else { serde_json::from_str(&text).map(|v| vec![v]).unwrap_or_default() })
    }

    /// Initializes (legacy handshake), then calls one tool; returns its result.
    pub async fn call_tool(&self, tool: &str, arguments: &Value) -> Result<Value, SocketError> {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "sessions-mcp-agent", "version": env!("CARGO_PKG_VERSION")}}});
        self.post(&init.to_string()).await?;
        self.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()).await?;
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}});
        let answer = self.post(&call.to_string()).await?;
        let response = answer.into_iter().find(|m| m.get("id") == Some(&json!(2))).unwrap_or(Value::Null);
        Ok(response.get("result").cloned().or_else(|| response.get("error").cloned()).unwrap_or(Value::Null))
    }
}

/// The `data:` payloads of an SSE body that parse as JSON.
fn sse_messages(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .filter_map(|d| serde_json::from_str(&d).ok())
        .collect()
}

/// `sessions-mcp connect`: a stdio MCP proxy to the owner's socket with `SESSIONS_MCP_TOKEN`.
pub async fn connect() -> std::process::ExitCode {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let token = std::env::var("SESSIONS_MCP_TOKEN").unwrap_or_default();
    let socket = std::env::var("SESSIONS_MCP_SOCKET").unwrap_or_default();
    if token.is_empty() || socket.is_empty() {
        eprintln!("sessions-mcp connect: needs SESSIONS_MCP_TOKEN and SESSIONS_MCP_SOCKET (both are set inside a run)");
        return std::process::ExitCode::from(2);
    }
    let client = SocketClient::new(Path::new(&socket), &token);
    let stdout = Arc::new(Mutex::new(tokio::io::stdout()));
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut first = true;
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        // The first request (initialize) is answered before anything else is sent: it fixes the
        // session id; later requests run concurrently (a long wait must not block the others).
        let forward = {
            let client = client.clone();
            let stdout = stdout.clone();
            async move {
                match client.post(&line).await {
                    Ok(messages) => {
                        let mut out = stdout.lock().await;
                        for m in messages {
                            let _ = out.write_all(format!("{m}\n").as_bytes()).await;
                        }
                        let _ = out.flush().await;
                        true
                    }
                    Err(SocketError::Unauthorized) => {
                        eprintln!("sessions-mcp connect: {}", SocketError::Unauthorized);
                        false
                    }
                    Err(e) => {
                        eprintln!("sessions-mcp connect: {e}");
                        true
                    }
                }
            }
        };
        if first {
            first = false;
            if !forward.await {
                return std::process::ExitCode::from(2);
            }
        } else {
            tokio::spawn(forward);
        }
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_bodies_yield_their_json_messages() {
        let body = "event: message\ndata: {\"id\":1}\n\n: keep-alive\n\ndata: {\"id\":2,\ndata: \"x\":1}\n\n";
        assert_eq!(sse_messages(body), vec![json!({"id": 1}), json!({"id": 2, "x": 1})]);
    }
}
