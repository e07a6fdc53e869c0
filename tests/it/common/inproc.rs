//! The rmcp server in-process: one caller, newline-delimited JSON-RPC over a duplex pipe. For
//! requests that exist only at the protocol level (`resources/read`, `tasks/get`).

use rmcp::ServiceExt;
use serde_json::{Value, json};
use sessions_mcp::access::Access;
use sessions_mcp::access::caller::Caller;
use sessions_mcp::server::SessionsServer;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines, ReadHalf, WriteHalf};

pub struct Rpc {
    writer: WriteHalf<DuplexStream>,
    reader: Lines<BufReader<ReadHalf<DuplexStream>>>,
    next_id: u64,
    server: tokio::task::JoinHandle<()>,
}

impl Rpc {
    /// Starts a server for `caller` (without runtime) and completes the MCP handshake.
    pub async fn start(access: Access, caller: Caller) -> Rpc {
        let (client, server) = tokio::io::duplex(1 << 20);
        let handler = SessionsServer::new(access, caller, None);
        let server = tokio::spawn(async move {
            if let Ok(running) = handler.serve(server).await {
                let _ = running.waiting().await;
            }
        });
        let (read, writer) = tokio::io::split(client);
        let mut rpc = Rpc { writer, reader: BufReader::new(read).lines(), next_id: 0, server };
        let hello =
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});
        rpc.request("initialize", hello).await;
        rpc.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        rpc
    }

    async fn send(&mut self, message: &Value) {
        let line = message.to_string() + "\n";
        self.writer.write_all(line.as_bytes()).await.expect("write to the server");
    }

    /// One request; returns `{result}` or `{error}` (without the id, so answers compare).
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        while let Some(line) = self.reader.next_line().await.expect("read from the server") {
            let mut reply: Value = serde_json::from_str(&line).expect("the server writes JSON");
            if reply["id"] == json!(id) {
                let obj = reply.as_object_mut().expect("a reply object");
                obj.remove("id");
                obj.remove("jsonrpc");
                return reply;
            }
        }
        panic!("the server closed the pipe before answering {method}");
    }
}

impl Drop for Rpc {
    fn drop(&mut self) {
        self.server.abort();
    }
}
