//! One CLI child end to end (issue 35): `sessions_spawn` of a child whose agent is Claude Code
//! (the `claude` preset) → the `subagents` wait that answers with its announce. The CLI is a fake
//! that stands for one model call per start: it logs the start, sleeps [`MODEL_S`] and answers in
//! stream-json with a `Notes:` section. Measured: the wall time per child and the CLI's starts
//! (its model calls) per child.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use super::client::StdioServer;
use super::{Bench, Group, Row, Samples, send};
use crate::store::Store;

/// How long the fake CLI's model call takes, per start.
const MODEL_S: u64 = 1;
const STARTS_LOG: &str = "cli-starts.log";

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let n = if bench.quick { 3 } else { 10 };
    let dir = world(bench)?;
    let store = Store::open(&Store::path_in(&dir))?;
    let server = StdioServer::start(&dir).await?;
    let samples = children(&server, &store, n).await?;
    server.stop().await?;
    let starts = std::fs::read_to_string(dir.join(STARTS_LOG)).unwrap_or_default().lines().count();
    let what = format!("one CLI child (fake claude, {MODEL_S} s per start): spawn → announce, {n} children");
    let value = format!("{:.1} CLI starts (model calls) per child", starts as f64 / n as f64);
    bench.push(Row::latency(Group::CliChild, what, &samples).with_rate(value));
    Ok(())
}

/// A world whose `main` runs the `claude` preset with the fake CLI as its command.
fn world(bench: &mut Bench) -> anyhow::Result<PathBuf> {
    let dir = bench.worlds.scratch("cli-child");
    std::fs::create_dir_all(&dir)?;
    let cli = fake_cli(&dir)?;
    let runner = json!({"preset": "claude", "command": cli.display().to_string()});
    let config = json!({"agents": {"list": [{"id": "main", "runner": runner}]}});
    std::fs::write(dir.join("config.json5"), config.to_string())?;
    Ok(dir)
}

/// The fake Claude Code: one line in [`STARTS_LOG`] per start, then one model call's time, then
/// an answer that ends with a Notes section.
fn fake_cli(dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let answer = json!({"type": "result", "subtype": "success", "is_error": false, "session_id": "fake-1",
        "result": "Summary: done\n\nNotes: nothing is left", "usage": {"input_tokens": 5, "output_tokens": 3}});
    let body = format!(
        "#!/bin/sh\n\
         if [ \"$1\" = \"--version\" ]; then echo '2.1.999 (Claude Code)'; exit 0; fi\n\
         echo start >> '{log}'\n\
         read -r message\n\
         sleep {MODEL_S}\n\
         printf '%s\\n' '{{\"type\":\"system\",\"subtype\":\"init\",\"session_id\":\"fake-1\"}}'\n\
         printf '%s\\n' '{answer}'\n",
        log = dir.join(STARTS_LOG).display(),
    );
    let path = dir.join("claude");
    std::fs::write(&path, body)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// `n` children one after another; a sample is a spawn's call to its wait's answer.
async fn children(server: &StdioServer, store: &Store, n: usize) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    for i in 0..n {
        let t = Instant::now();
        let spawned = server.call("sessions_spawn", json!({"task": format!("task {i}")})).await?;
        let child = spawned["childSessionKey"].as_str().context("sessions_spawn gave no childSessionKey")?;
        let args = json!({"action": "wait", "childSessionKeys": [child], "timeoutSeconds": 60});
        let waited = server.call("subagents", args).await?;
        samples.push_since(t);
        let outcome = waited["finished"][0]["outcome"].as_str().unwrap_or_default();
        anyhow::ensure!(outcome.starts_with("Status: completed successfully"), "the child did not complete: {waited}");
        send::idle(store).await?;
    }
    Ok(samples)
}
