//! A `daemon` owning the runtime with a `serve` that does not (the setup docs/AGENTS.md recommends for
//! desktop hosts), against one `serve` owning it: a send with wait, and a subscription update (a
//! fire-and-forget send's reply landing in the subscriber's own transcript), each as p50, p99 and
//! p90. Through a daemon both cross processes twice: the serve wakes the daemon for the queued
//! run, and the daemon tells the serve that the run ended or the transcript grew.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use super::client::{self, StdioServer, stop_child};
use super::{Bench, Group, Row, Samples, send};
use crate::keys::SessionKey;
use crate::store::Store;

/// The subscriber's own transcript (the bench client is the operator, `main`).
const MAIN_URI: &str = "sessions://history/main";
/// How long a daemon may take to bind its socket, and an update to arrive, before the row fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// Each setup on a world of its own: a run's request carries its session's transcript, which
/// grows with every send, so the setup measured second on one world would pay for the first.
pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    both_setups(bench, "daemon", &send::script(), &[send::ECHO], measure).await
}

/// Measures on a world named `name-owner` with a serve owning the runtime, then on `name-follower`
/// with a serve following a daemon that owns it; `measure` gets the setup's name.
pub(super) async fn both_setups(
    bench: &mut Bench,
    name: &str,
    script: &Value,
    targets: &[&str],
    measure: impl AsyncFn(&mut Bench, &StdioServer, &Path, &str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = bench.worlds.with_agent(&format!("{name}-owner"), script, targets)?;
    let owner = StdioServer::start(&dir).await?;
    measure(bench, &owner, &dir, "serve owning the runtime").await?;
    owner.stop().await?;
    let dir = bench.worlds.with_agent(&format!("{name}-follower"), script, targets)?;
    let mut daemon = start_daemon(&dir).await?;
    let server = StdioServer::start(&dir).await?;
    measure(bench, &server, &dir, "serve through a daemon owning the runtime").await?;
    server.stop().await?;
    stop_child(&mut daemon).await
}

async fn measure(bench: &mut Bench, server: &StdioServer, dir: &Path, setup: &str) -> anyhow::Result<()> {
    let store = Store::open(&Store::path_in(dir))?;
    let store = &store;
    let n = bench.sizes.runs;
    // A warm-up of a tenth as many, as `sample` does: the first runs of a server pay its caches.
    send::sends_with_wait(server, store, n / 10).await?;
    let sends = send::sends_with_wait(server, store, n).await?;
    let what = format!("send with wait (run + announce step), {setup}, {n} sends");
    bench.push(Row::latency(Group::Daemon, what, &sends).with_rate(p90(&sends)));
    let updates = updates(server, store, n).await?;
    let what = format!("subscription update (send → its reply in the subscribed transcript), {setup}, {n} sends");
    bench.push(Row::latency(Group::Daemon, what, &updates).with_rate(p90(&updates)));
    Ok(())
}

fn p90(samples: &Samples) -> String {
    format!("p90 {:.3} ms", samples.pct(0.9))
}

/// Subscribes to `main`, then times `n` fire-and-forget sends from the call to the
/// `notifications/resources/updated` that says their reply reached `main`.
async fn updates(server: &StdioServer, store: &Store, n: usize) -> anyhow::Result<Samples> {
    let main = SessionKey::from_canonical("agent:main:main".to_string());
    let mut notifications = server.notifications();
    server.request("resources/subscribe", json!({"uri": MAIN_URI})).await?;
    let mut samples = Samples::default();
    for i in 0..n {
        let before = store.last_seq_of(&main)?;
        let t = Instant::now();
        let args = json!({"sessionKey": send::ECHO, "message": format!("note {i}"), "timeoutSeconds": 0});
        let r = server.call("sessions_send", args).await?;
        anyhow::ensure!(r["status"] == "accepted", "a fire-and-forget send was not accepted: {r}");
        loop {
            let line = tokio::time::timeout(PATIENCE, notifications.recv())
                .await
                .context("no notifications/resources/updated for main within 10 s")?;
            // A lagging receiver only missed lines; the next one still counts.
            let Ok(line) = line else { continue };
            if is_update_of_main(&line) && store.last_seq_of(&main)? > before {
                break;
            }
        }
        samples.push_since(t);
        send::idle(store).await?;
    }
    server.request("resources/unsubscribe", json!({"uri": MAIN_URI})).await?;
    Ok(samples)
}

fn is_update_of_main(line: &str) -> bool {
    let message: Value = serde_json::from_str(line).unwrap_or_default();
    message["method"] == "notifications/resources/updated" && message["params"]["uri"] == MAIN_URI
}

/// `sessions-mcp daemon` on `dir`, once its run socket is bound.
async fn start_daemon(dir: &Path) -> anyhow::Result<tokio::process::Child> {
    let child = client::command(&dir.join("daemon.log"))?
        .arg("daemon")
        .arg("--state-dir")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .spawn()
        .context("cannot start `sessions-mcp daemon`")?;
    let socket = dir.join("run").join("mcp.sock");
    let deadline = Instant::now() + PATIENCE;
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the daemon's socket did not appear; see {}/daemon.log",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(child)
}
