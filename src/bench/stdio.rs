//! The real binary over stdio: cold start (process start → `initialize` answered → `tools/list`
//! answered) on an empty and on the large store, RSS idle and with the large store open, and
//! sessions_list / sessions_history latency as a client sees it.

use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};

use super::client::{Memory, StdioServer};
use super::worlds::history_key;
use super::{Bench, Group, Row, Samples, sample};

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let empty = bench.worlds.empty()?;
    cold_start(bench, &empty, "empty store").await?;
    let big = bench.sizes.big();
    let big_dir = bench.worlds.sessions(big)?;
    cold_start(bench, &big_dir, &format!("{big}-session store")).await?;
    list(bench).await?;
    history(bench).await
}

async fn cold_start(bench: &mut Bench, state_dir: &Path, store: &str) -> anyhow::Result<()> {
    let (mut init, mut listed) = (Samples::default(), Samples::default());
    let mut memory = Memory::default();
    for _ in 0..bench.sizes.starts {
        let t = Instant::now();
        let server = StdioServer::spawn(state_dir)?;
        server.initialize().await?;
        init.push_since(t);
        server.request("tools/list", json!({})).await?;
        listed.push_since(t);
        memory = server.memory();
        server.stop().await?;
    }
    let n = bench.sizes.starts;
    bench.push(Row::latency(Group::Stdio, format!("cold start → initialize answered, {store} ({n} starts)"), &init));
    bench.push(
        Row::latency(Group::Stdio, format!("cold start → tools/list answered, {store} ({n} starts)"), &listed)
            .with_rss(memory),
    );
    Ok(())
}

async fn list(bench: &mut Bench) -> anyhow::Result<()> {
    for &n in bench.sizes.list_sessions {
        let server = StdioServer::start(&bench.worlds.sessions(n)?).await?;
        for message_limit in [0, 5] {
            let args = json!({"limit": 50, "messageLimit": message_limit});
            let samples = calls(&server, "sessions_list", args, bench.sizes.calls).await?;
            let what = format!("list limit 50 messageLimit {message_limit}, {n} sessions");
            bench.push(Row::latency(Group::Stdio, what, &samples).with_rss(server.memory()));
        }
        server.stop().await?;
    }
    Ok(())
}

async fn history(bench: &mut Bench) -> anyhow::Result<()> {
    let sizes = bench.sizes.history_messages;
    let server = StdioServer::start(&bench.worlds.histories(sizes)?).await?;
    for &n in sizes {
        let key = history_key(n);
        for tools in [false, true] {
            let args = json!({"sessionKey": key, "limit": 200, "includeTools": tools});
            let samples = calls(&server, "sessions_history", args, bench.sizes.calls).await?;
            let what = format!("history limit 200{}, {n} messages", if tools { " includeTools" } else { "" });
            bench.push(Row::latency(Group::Stdio, what, &samples).with_rss(server.memory()));
        }
        let last =
            server.call("sessions_history", json!({"sessionKey": key, "limit": 1, "includeTools": true})).await?;
        let last_seq = last["messages"][0]["seq"].as_i64().ok_or_else(|| anyhow::anyhow!("no seq in {last}"))?;
        let args = json!({"sessionKey": key, "afterSeq": last_seq - 10, "includeTools": true});
        let samples = calls(&server, "sessions_history", args, bench.sizes.calls).await?;
        bench.push(Row::latency(Group::Stdio, format!("history afterSeq (last 10), {n} messages"), &samples));
    }
    server.stop().await
}

/// Times `n` calls of one tool with the same arguments.
async fn calls(server: &StdioServer, tool: &str, args: Value, n: usize) -> anyhow::Result<Samples> {
    sample(n, || {
        let args = args.clone();
        async move { server.call_ok(tool, args).await }
    })
    .await
}
