//! `subagents` wait: how soon a wait answers once the child it waits for has announced (the
//! announce's ledger row is stamped in the store; the answer is stamped when the client reads
//! it), with the serve owning the runtime and through a daemon owning it. The child sleeps a
//! little first, so that every wait is in place before the announce.

use std::path::Path;

use anyhow::Context;
use serde_json::{Value, json};

use super::client::StdioServer;
use super::{Bench, Group, Row, Samples, daemon, send};
use crate::store::{Store, now_ms};

/// How long each child works before it answers.
const CHILD_MS: u64 = 100;

/// Children answer after [`CHILD_MS`]; the Notes step adds nothing.
fn script() -> Value {
    json!({
        "rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
        "default": {"sleepMs": CHILD_MS, "reply": "done: {input}"},
    })
}

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    daemon::both_setups(bench, "subagents", &script(), &[], measure).await
}

async fn measure(bench: &mut Bench, server: &StdioServer, dir: &Path, setup: &str) -> anyhow::Result<()> {
    let store = Store::open(&Store::path_in(dir))?;
    let n = bench.sizes.runs;
    waits(server, &store, n / 10).await?;
    let samples = waits(server, &store, n).await?;
    let what = format!("subagents wait answered after the child's announce, {setup}, {n} children");
    bench.push(Row::latency(Group::Subagents, what, &samples).with_rss(server.memory()));
    Ok(())
}

/// `n` spawns, each followed at once by a wait for that child; a sample is the time from the
/// announce row's commit to the wait's answer at the client (both in ms since the epoch).
async fn waits(server: &StdioServer, store: &Store, n: usize) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    for i in 0..n {
        let spawned = server.call("sessions_spawn", json!({"task": format!("task {i}")})).await?;
        let child = spawned["childSessionKey"].as_str().context("sessions_spawn gave no childSessionKey")?;
        let run_id = spawned["runId"].as_str().context("sessions_spawn gave no runId")?.to_string();
        let args = json!({"action": "wait", "childSessionKeys": [child], "timeoutSeconds": 60});
        let waited = server.call("subagents", args).await?;
        let answered = now_ms();
        anyhow::ensure!(
            waited["finished"].as_array().is_some_and(|f| f.len() == 1),
            "the wait did not finish: {waited}"
        );
        let announce = store.announce_of(&run_id)?.context("the child has no announce")?;
        samples.push_ms((answered - announce.at) as f64);
        send::idle(store).await?;
    }
    Ok(samples)
}
