//! sessions_send over stdio: fire-and-forget accepts (each run is durable, `synchronous=FULL`,
//! before `accepted`), end-to-end runs with the scripted agent, and what a run costs beyond the
//! agent process itself (the same agent started directly, request line in, `final` out).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::client::{self, StdioServer};
use super::worlds::SCRIPT_FILE;
use super::{Bench, Group, Row, Samples, runs_stored};
use crate::store::Store;

/// A session whose runs sleep ten minutes: sends to it queue behind the first one.
pub const HOLD: &str = "agent:main:bench:hold";
/// A session whose runs answer at once.
pub const ECHO: &str = "agent:main:bench:echo";

/// The agent of the send worlds: the announce step is skipped, HOLD sleeps, the rest echo.
pub fn script() -> Value {
    json!({
        "rules": [
            {"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"},
            {"match": {"session": HOLD}, "sleepMs": 600_000, "reply": "late"},
        ],
        "default": {"reply": "pong: {input}"},
    })
}

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    accepts(bench).await?;
    let dir = bench.worlds.with_agent("send-runs", &script(), &[ECHO])?;
    let sent = end_to_end(bench, &dir).await?;
    let direct = direct_agent(&dir, bench.sizes.runs).await?;
    let what = format!("scripted agent started directly (request line → final → exit), {} starts", bench.sizes.runs);
    bench.push(Row::latency(Group::Send, what, &direct));
    let overhead = sent.pct(0.5) - direct.pct(0.5);
    let what = "run overhead beyond the agent process (p50 send with wait − p50 direct agent)";
    bench.push(Row::rate(Group::Send, what, format!("{overhead:.2} ms")));
    Ok(())
}

/// Sends that return `accepted` while the target's queue grows behind a sleeping run, so that no
/// agent process competes with the server for the cores.
async fn accepts(bench: &mut Bench) -> anyhow::Result<()> {
    let dir = bench.worlds.with_agent("send-accepts", &script(), &[HOLD])?;
    let server = StdioServer::start(&dir).await?;
    let n = bench.sizes.sends;
    let mut samples = Samples::default();
    let started = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        let args = json!({"sessionKey": HOLD, "message": format!("m{i}"), "timeoutSeconds": 0});
        let r = server.call("sessions_send", args).await?;
        anyhow::ensure!(r["status"] == "accepted", "a fire-and-forget send was not accepted: {r}");
        samples.push_since(t);
    }
    let rate = format!("{:.0} accepts/s", n as f64 / started.elapsed().as_secs_f64());
    let what = format!("send fire-and-forget accepted (synchronous=FULL), {n} sends");
    bench.push(Row::latency(Group::Send, what, &samples).with_rate(rate).with_rss(server.memory()));
    server.stop().await
}

/// Sends that wait for the reply, one at a time, on a server that owns the runtime.
async fn end_to_end(bench: &mut Bench, dir: &Path) -> anyhow::Result<Samples> {
    let store = Store::open(&Store::path_in(dir))?;
    let server = StdioServer::start(dir).await?;
    let n = bench.sizes.runs;
    let started = Instant::now();
    let samples = sends_with_wait(&server, &store, n).await?;
    let runs = runs_stored(&store)?;
    let rate = format!("{:.1} runs/s", runs as f64 / started.elapsed().as_secs_f64());
    let what = format!("send with wait, end to end (run + announce step), {n} sends");
    bench.push(Row::latency(Group::Send, what, &samples).with_rate(rate).with_rss(server.memory()));
    server.stop().await?;
    Ok(samples)
}

/// `n` sends to [`ECHO`] that wait for the reply, one at a time; each also runs the announce step,
/// which the next send waits out so that every sample is one run on an idle runtime.
pub async fn sends_with_wait(server: &StdioServer, store: &Store, n: usize) -> anyhow::Result<Samples> {
    let mut samples = Samples::default();
    for i in 0..n {
        let t = Instant::now();
        let args = json!({"sessionKey": ECHO, "message": format!("ping {i}"), "timeoutSeconds": 30});
        let r = server.call("sessions_send", args).await?;
        anyhow::ensure!(r["reply"] == format!("pong: ping {i}"), "unexpected send result {r}");
        samples.push_since(t);
        idle(store).await?;
    }
    Ok(samples)
}

/// Until no run is queued or running.
pub async fn idle(store: &Store) -> anyhow::Result<()> {
    while store.unfinished_runs()? > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// The scripted agent alone: start it, write the request line, read `final`, wait for its exit.
async fn direct_agent(dir: &Path, n: usize) -> anyhow::Result<Samples> {
    let script = dir.join(SCRIPT_FILE);
    let request = json!({"type": "run", "protocol": 1, "mode": "send", "sessionKey": ECHO,
                         "input": {"role": "user", "content": "ping"}, "messages": []});
    let mut samples = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let mut child = client::command(&dir.join("agent.log"))?
            .arg("agent")
            .arg("--script")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start `sessions-mcp agent`")?;
        let mut stdin = child.stdin.take().context("agent has no stdin")?;
        stdin.write_all(format!("{request}\n").as_bytes()).await?;
        drop(stdin);
        let mut lines = BufReader::new(child.stdout.take().context("agent has no stdout")?).lines();
        while let Some(line) = lines.next_line().await? {
            if line.contains("\"final\"") {
                break;
            }
        }
        anyhow::ensure!(
            child.wait().await?.success(),
            "the scripted agent failed; see {}",
            dir.join("agent.log").display()
        );
        samples.push_since(t);
    }
    Ok(samples)
}
