//! Memory under sustained mixed load and after it (issue 14, point 12): one stdio server, warmed
//! up, then rounds of `soak` seconds in which workers each send to their own echo session with a
//! wait (one run per send), list, read history, and subscribe to a transcript and back; after
//! each round the server rests. RSS before, the peak sampled during, and after each rest: what
//! stays after a rest is retained (caches, allocator), and equal figures after two rounds say it
//! is bounded rather than a leak.

use std::time::{Duration, Instant};

use serde_json::json;

use super::client::StdioServer;
use super::{Bench, Group, Row, mib, runs_stored, send};
use crate::store::Store;

const WORKERS: usize = 8;
const ROUNDS: usize = 2;

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let sessions: Vec<String> = (0..WORKERS).map(|i| format!("agent:main:bench:soak{i}")).collect();
    let targets: Vec<&str> = sessions.iter().map(String::as_str).collect();
    let dir = bench.worlds.with_agent("soak", &send::script(), &targets)?;
    let store = Store::open(&Store::path_in(&dir))?;
    let server = StdioServer::start(&dir).await?;
    let (load, rest) = (Duration::from_secs(bench.sizes.soak_seconds), Duration::from_secs(bench.sizes.rest_seconds));
    // Warm: every path the load takes has run once.
    round(&server, &sessions, Instant::now()).await?;
    settle(&store, rest).await?;
    let warm = server.memory();
    for n in 1..=ROUNDS {
        let runs_before = runs_stored(&store)?;
        let (calls, peak) = sampled(&server, round(&server, &sessions, Instant::now() + load)).await?;
        settle(&store, rest).await?;
        let after = server.memory();
        let what = format!(
            "soak round {n}/{ROUNDS}: {}s of mixed load ({calls} calls, {} runs), then {}s rest",
            load.as_secs(),
            runs_stored(&store)? - runs_before,
            rest.as_secs()
        );
        let value = format!("warm {} → peak {} → after rest {}", mib(warm.rss_kb), mib(peak), mib(after.rss_kb));
        bench.push(Row::rate(Group::Soak, what, value).with_rss(after));
    }
    server.stop().await
}

/// Every worker repeats its mix until `until` (at least once); the number of calls made.
async fn round(server: &StdioServer, sessions: &[String], until: Instant) -> anyhow::Result<usize> {
    let workers = sessions.iter().map(|key| async move {
        let uri = json!({"uri": format!("sessions://history/{key}")});
        let mut calls = 0;
        loop {
            let reply =
                server.call("sessions_send", json!({"sessionKey": key, "message": "ping", "timeoutSeconds": 30}));
            anyhow::ensure!(reply.await?["status"] == "ok", "a soak send did not complete");
            server.call("sessions_list", json!({"limit": 50, "messageLimit": 2})).await?;
            server.call("sessions_history", json!({"sessionKey": key, "limit": 20})).await?;
            server.request("resources/subscribe", uri.clone()).await?;
            server.request("resources/unsubscribe", uri.clone()).await?;
            calls += 5;
            if Instant::now() >= until {
                return anyhow::Ok(calls);
            }
        }
    });
    Ok(futures::future::try_join_all(workers).await?.into_iter().sum())
}

/// Runs `work` while sampling the server's RSS twice a second; its result and the highest RSS.
async fn sampled<T>(server: &StdioServer, work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<(T, u64)> {
    let mut peak = server.memory().rss_kb;
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return Ok((done?, peak.max(server.memory().rss_kb))),
            _ = tokio::time::sleep(Duration::from_millis(500)) => peak = peak.max(server.memory().rss_kb),
        }
    }
}

/// Waits until no run is left (the announce steps of the last sends), then rests.
async fn settle(store: &Store, rest: Duration) -> anyhow::Result<()> {
    while store.unfinished_runs()? > 0 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(rest).await;
    Ok(())
}
