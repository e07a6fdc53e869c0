//! Fan-out: N children spawned at once (every spawn call in flight together) whose agent, a shell
//! `jsonl/1` program, reads its request and sleeps before its `final`; the caps are raised to N,
//! so all N run at once. Measured: how fast the spawns are accepted, when the last child has
//! announced (each exactly once), the server's RSS, fds and threads at the peak, what supervising
//! one run costs in memory (the `sessions-mcp-supervise` processes' VmRSS and Pss), and that no
//! process of the runs is left afterwards.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use super::client::{Memory, StdioServer};
use super::{Bench, Group, Row, mib};
use crate::runner::supervise::BINARY as SUPERVISOR;
use crate::store::Store;

/// How long the last announce may take past the agents' sleep before the row fails.
const PATIENCE: Duration = Duration::from_secs(120);

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let (sizes, sleep_s): (&[usize], u64) = if bench.quick { (&[20], 2) } else { (&[100, 300, 1_000], 10) };
    for &n in sizes {
        let dir = world(bench, n, sleep_s)?;
        fan_out(bench, &dir, n, sleep_s).await?;
    }
    Ok(())
}

/// A world whose caps admit and run `n` children at once, with the sleeping shell agent.
fn world(bench: &mut Bench, n: usize, sleep_s: u64) -> anyhow::Result<PathBuf> {
    let agent = format!("read -r line; sleep {sleep_s}; printf '%s\\n' '{{\"type\":\"final\",\"text\":\"done\"}}'");
    let caps = json!({"maxChildrenPerAgent": n, "maxConcurrent": n, "maxQueued": n, "announceStep": false});
    let config = json!({
        "runtime": {"maxConcurrentRuns": n + 8},
        "agents": {
            "defaults": {"subagents": caps, "runner": {"maxConcurrent": n + 8}},
            "list": [{"id": "main", "runner": {"command": "/bin/sh", "args": ["-c", agent]}}],
        },
    });
    bench.worlds.with_config(&format!("fanout-{n}"), &config)
}

async fn fan_out(bench: &mut Bench, dir: &Path, n: usize, sleep_s: u64) -> anyhow::Result<()> {
    let store = Store::open(&Store::path_in(dir))?;
    let server = StdioServer::start(dir).await?;
    let started = Instant::now();
    let spawns = (0..n).map(|i| server.call("sessions_spawn", json!({"task": format!("child {i}")})));
    let answers = futures::future::join_all(spawns).await;
    let accepted_in = started.elapsed();
    let (mut runs, mut children) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for answer in answers {
        let answer = answer?;
        anyhow::ensure!(answer["status"] == "accepted", "a spawn was not accepted: {answer}");
        runs.push(answer["runId"].as_str().context("sessions_spawn gave no runId")?.to_string());
        children
            .push(answer["childSessionKey"].as_str().context("sessions_spawn gave no childSessionKey")?.to_string());
    }
    let mut peak = Peak::default();
    let mut announced = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(sleep_s) + PATIENCE;
    while announced.len() < n {
        anyhow::ensure!(Instant::now() < deadline, "{} of {n} children announced in time", announced.len());
        peak.sample(server.pid());
        for run in &runs {
            if !announced.contains(run) && store.announce_of(run)?.is_some() {
                announced.insert(run.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last_announce = started.elapsed();
    let once = announces_in_main(&server, &children).await?;
    let left = processes_left(&runs).await;
    let rate = n as f64 / accepted_in.as_secs_f64();
    let server_mem = server.memory();
    server.stop().await?;

    let what = format!("fan-out: {n} sessions_spawn at once (sleeping shell agent), all accepted");
    let value = format!("{:.2} s, {rate:.0} spawns/s", accepted_in.as_secs_f64());
    bench.push(Row::rate(Group::Fanout, what, value));
    let what = format!("fan-out: {n} children, last announce after (agent sleeps {sleep_s} s)");
    let value = format!("{:.1} s; {once}/{n} announced once; {left} processes left", last_announce.as_secs_f64());
    bench.push(Row::rate(Group::Fanout, what, value).with_rss(Memory { rss_kb: peak.server_rss_kb, ..server_mem }));
    let what = format!("fan-out: {n} children, server at the peak (fds, threads)");
    bench.push(Row::rate(Group::Fanout, what, format!("{} fds, {} threads", peak.fds, peak.threads)));
    let what = format!("fan-out: {n} children, supervision per run (of {} supervisors seen at once)", peak.supervisors);
    let value = format!("VmRSS {}, Pss {}", mib(peak.supervisor_rss_kb), mib(peak.supervisor_pss_kb));
    bench.push(Row::rate(Group::Fanout, what, value));
    anyhow::ensure!(once == n, "{once} of {n} children announced exactly once");
    anyhow::ensure!(left == 0, "{left} processes of the runs were left");
    Ok(())
}

/// The largest figures seen while the children ran; the supervisors' are per process, averaged
/// over the sample that saw the most of them.
#[derive(Default)]
struct Peak {
    server_rss_kb: u64,
    fds: usize,
    threads: u64,
    supervisors: usize,
    supervisor_rss_kb: u64,
    supervisor_pss_kb: u64,
}

impl Peak {
    fn sample(&mut self, server: u32) {
        let m = Memory::of(server);
        self.server_rss_kb = self.server_rss_kb.max(m.rss_kb);
        self.threads = self.threads.max(m.threads);
        self.fds = self.fds.max(std::fs::read_dir(format!("/proc/{server}/fd")).map_or(0, |d| d.count()));
        let supervisors: Vec<u32> = children(server).into_iter().filter(|p| is_supervisor(*p)).collect();
        if supervisors.len() > self.supervisors {
            let (mut rss, mut pss) = (0, 0);
            for &pid in &supervisors {
                rss += Memory::of(pid).rss_kb;
                pss += pss_kb(pid);
            }
            self.supervisors = supervisors.len();
            self.supervisor_rss_kb = rss / supervisors.len() as u64;
            self.supervisor_pss_kb = pss / supervisors.len() as u64;
        }
    }
}

/// The children of every thread of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|l| l.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// Whether `pid` runs the supervisor (the kernel keeps 15 bytes of a command's name).
fn is_supervisor(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| SUPERVISOR.starts_with(c.trim_end()))
}

fn pss_kb(pid: u32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let line = rollup.lines().find(|l| l.starts_with("Pss:"));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// How many children's announces reached main's transcript exactly once (each names its child's
/// session key), read page by page with afterSeq.
async fn announces_in_main(server: &StdioServer, children: &[String]) -> anyhow::Result<usize> {
    let mut counts: HashMap<&str, usize> = children.iter().map(|c| (c.as_str(), 0)).collect();
    let mut after = 0i64;
    loop {
        let args = json!({"sessionKey": "main", "limit": 100, "afterSeq": after});
        let page = server.call("sessions_history", args).await?;
        for m in page["messages"].as_array().into_iter().flatten() {
            let text = m.to_string();
            let Some(at) = text.find("sessionKey ") else { continue };
            let key: String =
                text[at + "sessionKey ".len()..].chars().take_while(|c| !c.is_whitespace() && *c != '\\').collect();
            if let Some(n) = counts.get_mut(key.as_str()) {
                *n += 1;
            }
        }
        match page["nextAfterSeq"].as_i64() {
            Some(next) if page["hasMore"] == true => after = next,
            _ => break,
        }
    }
    Ok(counts.values().filter(|n| **n == 1).count())
}

/// Processes that still carry one of the runs' ids, after a short grace for the last exits.
async fn processes_left(runs: &[String]) -> usize {
    let needles: Vec<String> = runs.iter().map(|r| format!("SESSIONS_MCP_RUN_ID={r}")).collect();
    let count = || {
        let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
        entries
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            .filter(|e| {
                let Ok(environ) = std::fs::read(e.path().join("environ")) else { return false };
                environ.split(|b| *b == 0).any(|v| needles.iter().any(|n| v == n.as_bytes()))
            })
            .count()
    };
    for _ in 0..50 {
        if count() == 0 {
            return 0;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    count()
}
