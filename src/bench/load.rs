//! Concurrency and the memory it costs: many sessions_send waits outstanding on one stdio server
//! (waits are async: they must not cost a thread each), and many HTTP clients on one `serve
//! --http`, each on its own keep-alive connection, held open while the server's RSS is read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::Barrier;

use super::client::{Memory, StdioServer, serve_command, stop_child};
use super::{Bench, Group, Row, Samples, runs_stored, send};
use crate::store::Store;

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    waits(bench).await?;
    http_clients(bench).await
}

async fn waits(bench: &mut Bench) -> anyhow::Result<()> {
    let dir = bench.worlds.with_agent("waits", &send::script(), &[send::HOLD])?;
    let store = Store::open(&Store::path_in(&dir))?;
    let server = StdioServer::start(&dir).await?;
    let idle = server.memory();
    let n = bench.sizes.sends;
    let started = Instant::now();
    let sends = futures::future::join_all((0..n).map(|i| {
        let args = json!({"sessionKey": send::HOLD, "message": format!("w{i}"), "timeoutSeconds": 600});
        server.call("sessions_send", args)
    }));
    // Every send enqueues its run before it waits: n runs means n waits outstanding.
    let all_waiting = async {
        while runs_stored(&store)? < n as i64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Let the last sends reach their wait.
        tokio::time::sleep(Duration::from_millis(200)).await;
        anyhow::Ok(server.memory())
    };
    let holding = tokio::select! {
        r = sends => anyhow::bail!("the waits ended before all {n} were outstanding: {:?}", r.into_iter().find(Result::is_err)),
        m = all_waiting => m?,
    };
    let what = format!("{n} sessions_send waits outstanding on one server (threads idle → holding)");
    let value = format!("{} → {} threads", idle.threads, holding.threads);
    bench.push(Row::rate(Group::Load, what, value).with_rss(holding));
    let what = format!("time to put {n} waits in place");
    bench.push(Row::rate(Group::Load, what, format!("{:.2} s", started.elapsed().as_secs_f64())));
    server.stop().await
}

async fn http_clients(bench: &mut Bench) -> anyhow::Result<()> {
    let sessions = bench.sizes.list_sessions.iter().copied().find(|&n| n >= 1_000).unwrap_or(bench.sizes.big());
    let dir = bench.worlds.sessions(sessions)?;
    let mut child = serve_command(&dir, &["--http", "127.0.0.1:0", "--as", "main"])?
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .context("cannot start `sessions-mcp serve --http`")?;
    let pid = child.id().context("serve --http exited at once")?;
    let port = http_port(&dir.join("serve.log")).await?;
    let (n, calls) = (bench.sizes.http_clients, bench.sizes.http_calls_each);
    let hold = Arc::new(Barrier::new(n + 1));
    let started = Instant::now();
    let clients: Vec<_> = (0..n).map(|_| tokio::spawn(http_client(port, calls, hold.clone()))).collect();
    hold.wait().await;
    let elapsed = started.elapsed().as_secs_f64();
    let holding = Memory::of(pid);
    let mut samples = Samples::default();
    for c in clients {
        samples.extend(c.await??);
    }
    let what = format!("{n} HTTP clients × {calls} sessions_list limit 50 ({sessions} sessions), connections held");
    let rate = format!("{:.0} calls/s", (n * calls) as f64 / elapsed);
    bench.push(Row::latency(Group::Load, what, &samples).with_rate(rate).with_rss(holding));
    stop_child(&mut child).await
}

/// The port `serve --http 127.0.0.1:0` printed ("listening on http://127.0.0.1:PORT/mcp").
async fn http_port(log: &std::path::Path) -> anyhow::Result<u16> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(rest) = text.split("://127.0.0.1:").nth(1) {
            return rest.split('/').next().unwrap_or_default().parse().context("serve --http printed no port");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    anyhow::bail!("serve --http did not say where it listens within 30 s; see {}", log.display())
}

/// One client on its own connection: `calls` stateless (2026-07-28) tool calls, then it keeps the
/// connection open until every client is done and the server's memory has been read. Failed or
/// not, every client reaches the barrier, so that the reader never waits forever.
async fn http_client(port: u16, calls: usize, hold: Arc<Barrier>) -> anyhow::Result<Samples> {
    let result = http_calls(port, calls).await;
    hold.wait().await;
    result.map(|(samples, _connection)| samples)
}

type Connection = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn http_calls(port: u16, calls: usize) -> anyhow::Result<(Samples, Connection)> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    // The connection task ends when its sender is dropped.
    tokio::spawn(conn);
    let mut samples = Samples::default();
    for id in 0..calls {
        let t = Instant::now();
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "sessions_list", "arguments": {"limit": 50},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}});
        let request = hyper::Request::post("/mcp")
            .header("Host", format!("127.0.0.1:{port}"))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", "sessions_list")
            .body(Full::new(Bytes::from(body.to_string())))?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let text = String::from_utf8_lossy(&response.into_body().collect().await?.to_bytes()).to_string();
        let result = rpc_result(&text).filter(|_| status.is_success());
        anyhow::ensure!(result.is_some_and(|r| r["isError"] != json!(true)), "HTTP {status}: {text}");
        samples.push_since(t);
    }
    Ok((samples, sender))
}

/// The `result` of a JSON-RPC response sent as JSON or as an SSE `data:` event.
fn rpc_result(body: &str) -> Option<Value> {
    let from_sse = || {
        let data = body.lines().filter_map(|l| l.strip_prefix("data:")).find(|d| d.contains("\"result\""))?;
        serde_json::from_str::<Value>(data.trim()).ok()
    };
    let msg = serde_json::from_str::<Value>(body).ok().or_else(from_sse)?;
    msg.get("result").cloned()
}
