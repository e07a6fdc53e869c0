//! PostgreSQL next to SQLite (issue 22): tool latency over stdio on the same generated store in
//! each backend, and runs per second with 1, 2 and 3 nodes on one database, each node's server
//! and its agents pinned to a core set of its own as far as the machine has cores, each node
//! reaching the database through a proxy of its own ([`super::wire`]): next door with an agent
//! that answers at once (the cores are the limit), then 1.5 ms away with agents that sleep
//! (issue 37's scaling row: the database's locks are the limit, if any), with the machine's idle
//! CPU; then idle nodes.
//!
//! Needs a PostgreSQL server: `SESSIONS_MCP_BENCH_PG` (else the tests' `SESSIONS_MCP_TEST_PG`),
//! an admin URL under which the group creates databases of its own and drops them at the end.
//! Without one, the group says so in its one row.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use super::client::StdioServer;
use super::send::{HOLD, script};
use super::wire::{DelayProxy, WireStats};
use super::worlds::{SCRIPT_FILE, history_key, seed_flat, seed_history, session};
use super::{Bench, Group, Row, Samples, sample};
use crate::keys::SessionKey;
use crate::store::{NewRun, RunMode, SeedRows, SeedSession, Store};

/// Sessions the queued runs of a nodes row are spread over (each session runs one at a time).
const WORKER_SESSIONS: usize = 32;
/// What one node runs at once (`runtime.maxConcurrentRuns`, a node's own): more than its one
/// core can keep busy with the scripted agent, so the core is the limit.
const NODE_RUNS: u32 = 4;
/// The agent's cap, the cluster's: high enough never to be the limit.
const AGENT_RUNS: u32 = 64;

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let Some(admin) = admin_url() else {
        let what = "skipped: no PostgreSQL (set SESSIONS_MCP_BENCH_PG to an admin postgres:// URL)";
        bench.push(Row::rate(Group::Nodes, what, String::new()));
        return Ok(());
    };
    let server = Databases::connect(&admin).await?;
    let result = measure(bench, &server).await;
    server.drop_all().await?;
    result
}

async fn measure(bench: &mut Bench, server: &Databases) -> anyhow::Result<()> {
    let (sessions, history) = if bench.quick { (100, 1_000) } else { (1_000, 10_000) };
    let sqlite = bench.worlds.scratch("latency-sqlite");
    world(&sqlite, None, Some((sessions, history)))?;
    latency(bench, &sqlite, "SQLite", sessions, history).await?;
    let pg = bench.worlds.scratch("latency-postgres");
    world(&pg, Some(&server.create("latency").await?), Some((sessions, history)))?;
    latency(bench, &pg, "PostgreSQL", sessions, history).await?;
    for nodes in 1..=3 {
        runs_per_second(bench, server, nodes, &Load::cores()).await?;
    }
    for nodes in 1..=3 {
        runs_per_second(bench, server, nodes, &Load::distant()).await?;
    }
    exchanges(bench, server).await?;
    for nodes in 1..=3 {
        idle(bench, server, nodes).await?;
    }
    Ok(())
}

/// A caller session of the exchange row: its run sends to worker `i` through its run socket.
fn caller(i: usize) -> String {
    format!("agent:main:bench:caller:{i}")
}

/// Issue 37 (f): what a `sessions_send` exchange between two driven sessions costs on the wire,
/// on one node next door: each caller's run sends to its worker (fire-and-forget, through its
/// run socket), the worker's run answers, the reply-back step runs in the caller
/// (`maxPingPongTurns` 1), then the announce step in the worker and its delivery record. Four
/// runs per exchange, the caller's sending run counted in.
async fn exchanges(bench: &mut Bench, dbs: &Databases) -> anyhow::Result<()> {
    let url = dbs.create("exchanges").await?;
    let mut script = script();
    script["rules"] = json!([
        {"match": {"inputRegex": "^exchange (\\d+)$"}, "reply": "sent",
         "call": {"tool": "sessions_send",
                  "arguments": {"sessionKey": "agent:main:bench:worker:{1}", "message": "ping", "timeoutSeconds": 0}}},
        {"match": {"mode": "announce"}, "reply": "announced"},
    ]);
    let handle_dir = bench.worlds.scratch("exchanges-bench");
    world_with(&handle_dir, Some(&url), Some((0, 0)), &script, NODE_RUNS)?;
    let store = Store::open_in(&handle_dir, Some(&url))?;
    let proxy = DelayProxy::start(upstream(&url)?, Duration::ZERO)?;
    // A state directory of its own, near the root: its run socket's path must fit `SUN_LEN`.
    let node = super::worlds::TempDir::new("x")?;
    let dir = node.path().to_path_buf();
    world_with(&dir, Some(&through(&url, proxy.addr)), None, &script, NODE_RUNS)?;
    let config_path = dir.join("config.json5");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path)?)?;
    config["session"] = json!({"agentToAgent": {"maxPingPongTurns": 1}});
    std::fs::write(&config_path, config.to_string())?;
    let exchanges = if bench.quick { 8 } else { 48 };
    let callers = (0..exchanges).map(|i| SeedSession::new(session(SessionKey::from_canonical(caller(i))), []));
    store.seed(callers, &SeedRows::default())?;
    let server = StdioServer::spawn(&dir)?;
    server.initialize().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let proxies = [proxy];
    wire_totals(&proxies); // the node's start is counted out
    store.write(|tx| -> crate::store::Result<()> {
        for i in 0..exchanges {
            let session = tx.session_id(&SessionKey::from_canonical(caller(i)))?;
            let input = json!({"role": "user", "content": format!("exchange {}", i % WORKER_SESSIONS)});
            tx.enqueue(&NewRun::new(uuid::Uuid::new_v4().to_string(), session, RunMode::Send, input))?;
        }
        Ok(())
    })?;
    let started = Instant::now();
    // Four runs per exchange, every one ended with its steps taken (the announce's delivery).
    let over = || -> anyhow::Result<bool> {
        Ok(super::runs_stored(&store)? == 4 * exchanges as i64
            && store.unfinished_runs()? == 0
            && store.runs_with_steps_pending(0)?.is_empty())
    };
    while !over()? {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "the exchanges did not end within 10 min");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wire = wire_totals(&proxies);
    server.stop().await?;
    let what = format!(
        "sessions_send exchange between driven sessions on 1 node next door (caller's run sends, worker's run, \
         reply-back step, announce step, delivery): {exchanges} exchanges"
    );
    let rate = format!("per exchange (4 runs) {}", wire.per_run(exchanges as f64));
    bench.push(Row::rate(Group::Nodes, what, rate));
    Ok(())
}

fn admin_url() -> Option<String> {
    ["SESSIONS_MCP_BENCH_PG", "SESSIONS_MCP_TEST_PG"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
}

/// The databases this group made on the admin URL's server, dropped at the end.
struct Databases {
    admin: String,
    client: tokio_postgres::Client,
    made: std::sync::Mutex<Vec<String>>,
}

impl Databases {
    async fn connect(admin: &str) -> anyhow::Result<Databases> {
        let target = crate::store::postgres::PgTarget::parse(admin)?;
        let (client, connection) =
            target.connect_one().await.context("cannot connect to the bench's PostgreSQL server")?;
        tokio::spawn(connection);
        // Statement counts where the server loads pg_stat_statements (.ci/postgres.sh does).
        if let Err(e) = client.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await {
            tracing::info!(error = %e, "no pg_stat_statements: the nodes rows count transactions only");
        }
        Ok(Databases { admin: admin.to_string(), client, made: Default::default() })
    }

    /// What the server counted for database `name` so far. Counters of a backend reach the
    /// shared statistics when it goes idle (at most once a second) or exits: read after the
    /// nodes stopped.
    async fn counts(&self, name: &str) -> anyhow::Result<Counts> {
        let c = crate::store::postgres::stats::database_counts(&self.client, name).await?;
        Ok(Counts { commits: c.commits, rollbacks: c.rollbacks, statements: c.statements })
    }

    /// A new empty database; its URL (with the admin URL's parameters, its TLS settings among them).
    /// The name of a database this group made, from its URL.
    fn name_in(url: &str) -> String {
        let path = url.split('?').next().unwrap_or(url);
        path.rsplit('/').next().unwrap_or_default().to_string()
    }

    async fn create(&self, what: &str) -> anyhow::Result<String> {
        let name = format!("smcp_bench_{what}_{}", uuid::Uuid::new_v4().simple());
        let ddl = format!("CREATE DATABASE \"{name}\" ENCODING 'UTF8' TEMPLATE template0");
        self.client.batch_execute(&ddl).await.with_context(|| format!("cannot create database {name}"))?;
        self.made.lock().unwrap().push(name.clone());
        let (base, query) =
            self.admin.split_once('?').map_or((self.admin.as_str(), String::new()), |(b, q)| (b, format!("?{q}")));
        let (server, _) = base.rsplit_once('/').context("the admin URL names no database")?;
        Ok(format!("{server}/{name}{query}"))
    }

    async fn drop_all(&self) -> anyhow::Result<()> {
        let made = std::mem::take(&mut *self.made.lock().unwrap());
        for name in made {
            self.client.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await?;
        }
        Ok(())
    }
}

/// A state directory serving from `url` (SQLite without one) with the send bench's agent and
/// caps that leave the cores the limit; `seed` adds `(sessions, history messages)` and the
/// sessions the rows use (once per database).
fn world(dir: &Path, url: Option<&str>, seed: Option<(u64, u64)>) -> anyhow::Result<()> {
    world_with(dir, url, seed, &script(), NODE_RUNS)
}

/// As [`world`], with the agent's `script` and the node's cap `node_runs`.
fn world_with(
    dir: &Path,
    url: Option<&str>,
    seed: Option<(u64, u64)>,
    script: &Value,
    node_runs: u32,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let script_path = dir.join(SCRIPT_FILE);
    std::fs::write(&script_path, script.to_string())?;
    let runner = json!({"command": std::env::current_exe()?, "args": ["agent", "--script", script_path],
                        "maxConcurrent": AGENT_RUNS});
    let mut config = json!({
        "tools": {"sessions": {"visibility": "agent"}},
        "runtime": {"maxConcurrentRuns": node_runs},
        "agents": {"list": [{"id": "main", "runner": runner}]},
    });
    if let Some(url) = url {
        config["store"] = json!({"url": url});
    }
    std::fs::write(dir.join("config.json5"), config.to_string())?;
    let Some((sessions, history)) = seed else { return Ok(()) };
    let store = Store::open_in(dir, url)?;
    seed_flat(&store, sessions)?;
    seed_history(&store, history)?;
    let targets = std::iter::once(HOLD.to_string()).chain((0..WORKER_SESSIONS).map(worker));
    let targets = targets.map(|k| SeedSession::new(session(SessionKey::from_canonical(k)), []));
    Ok(store.seed(targets, &SeedRows::default())?)
}

fn worker(i: usize) -> String {
    format!("agent:main:bench:worker:{i}")
}

/// The same three calls on either backend: a list page, a history page, a send accepted.
async fn latency(bench: &mut Bench, dir: &Path, backend: &str, sessions: u64, history: u64) -> anyhow::Result<()> {
    let server = StdioServer::start(dir).await?;
    let n = bench.sizes.calls;
    let calls: [(&str, Value, String); 3] = [
        (
            "sessions_list",
            json!({"limit": 50, "messageLimit": 5}),
            format!("list limit 50 messageLimit 5, {sessions} sessions"),
        ),
        (
            "sessions_history",
            json!({"sessionKey": history_key(history), "limit": 200}),
            format!("history limit 200, {history} messages"),
        ),
        (
            "sessions_send",
            json!({"sessionKey": HOLD, "message": "queued", "timeoutSeconds": 0}),
            "send fire-and-forget accepted (durable before the answer)".to_string(),
        ),
    ];
    for (tool, args, what) in calls {
        let server = &server;
        let samples: Samples = sample(n, || {
            let args = args.clone();
            async move { server.call_ok(tool, args).await }
        })
        .await?;
        bench.push(Row::latency(Group::Nodes, format!("{backend}: {what}, {n} calls"), &samples));
    }
    server.stop().await
}

/// A database's counters ([`Databases::counts`]).
#[derive(Debug, Clone, Copy)]
struct Counts {
    /// Committed transactions: every write transaction (reads end in a rollback).
    commits: i64,
    /// Rolled back: the read transactions (a read ends with `ROLLBACK`).
    rollbacks: i64,
    /// (statements, write transactions: those that took the write lock) by pg_stat_statements.
    statements: Option<(i64, i64)>,
}

impl Counts {
    /// What happened between `before` and `self`, less what the bench itself did: its write
    /// transactions, its reads and its statements.
    fn since(self, before: Counts, own: (i64, i64, i64)) -> Counts {
        let (own_commits, own_reads, own_statements) = own;
        Counts {
            commits: self.commits - before.commits - own_commits,
            rollbacks: self.rollbacks - before.rollbacks - own_reads,
            // Each of the bench's write transactions took the write lock too.
            statements: self
                .statements
                .zip(before.statements)
                .map(|(a, b)| (a.0 - b.0 - own_statements, a.1 - b.1 - own_commits)),
        }
    }

    /// Per `n` (runs, or seconds), as the rows print it: commits (write transactions and
    /// single statements such as a notification), of them the write transactions (those that
    /// took the write lock), reads, statements.
    fn per(self, n: f64, unit: &str) -> String {
        let per = |v: i64| v as f64 / n;
        match self.statements {
            Some((statements, locked)) => format!(
                "{:.1} commits ({:.1} write tx), {:.1} reads, {:.1} statements{unit}",
                per(self.commits),
                per(locked),
                per(self.rollbacks),
                per(statements)
            ),
            None => format!("{:.1} commits, {:.1} reads{unit}", per(self.commits), per(self.rollbacks)),
        }
    }
}

/// What a runs-per-second row runs: how far each node is from the database, its agent, its cap.
struct Load {
    /// Each direction's delay between a node and PostgreSQL ([`DelayProxy`]).
    one_way: Duration,
    /// The agent's script: answers at once (the cores are the limit), or sleeps (they are not).
    script: Value,
    node_runs: u32,
    runs: fn(bool) -> usize,
    what: &'static str,
}

/// How long the distant rows' agent sleeps: the run's wall time is the node's cap's to fill,
/// while the machine's cores stay idle enough not to be the limit.
const AGENT_SLEEP_MS: u64 = 2_000;
/// The distant rows' node cap: runs in flight per node, each sleeping [`AGENT_SLEEP_MS`].
const DISTANT_NODE_RUNS: u32 = 8;

impl Load {
    /// The database next door, the scripted agent answering at once: the cores are the limit.
    fn cores() -> Load {
        Load {
            one_way: Duration::ZERO,
            script: script(),
            node_runs: NODE_RUNS,
            runs: |quick| if quick { 20 } else { 300 },
            what: "run (scripted agent)",
        }
    }

    /// Each node 1.5 ms (round trip) from the database through a proxy of its own, agents that
    /// sleep: the database's locks are the limit, if any.
    fn distant() -> Load {
        let mut script = script();
        script["default"]["sleepMs"] = json!(AGENT_SLEEP_MS);
        Load {
            one_way: Duration::from_micros(750),
            script,
            node_runs: DISTANT_NODE_RUNS,
            runs: |quick| if quick { 72 } else { 240 },
            what: "run (agent sleeping 2 s, no CPU), each node 1.5 ms round trip from the database",
        }
    }
}

/// `nodes` state dirs on one new database, each a `serve` owning its node's runtime and pinned
/// to a core of its own (cores are shared once there are more nodes than cores), each reaching
/// the database through a [`DelayProxy`] of its own; a burst of queued runs committed at once,
/// timed until every one has finished on whichever node ran it. The row says what PostgreSQL
/// counted per run, what the nodes' transactions held (read on the wire), and the machine's idle
/// CPU meanwhile.
async fn runs_per_second(bench: &mut Bench, dbs: &Databases, nodes: usize, load: &Load) -> anyhow::Result<()> {
    let url = dbs.create(&format!("nodes{nodes}")).await?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let handle_dir = bench.worlds.scratch(&format!("nodes-{nodes}-bench"));
    world_with(&handle_dir, Some(&url), Some((0, 0)), &load.script, load.node_runs)?;
    let store = Store::open_in(&handle_dir, Some(&url))?;
    let mut servers = Vec::new();
    let mut proxies = Vec::new();
    let mut sets = Vec::new();
    for i in 0..nodes {
        let proxy = DelayProxy::start(upstream(&url)?, load.one_way)?;
        let dir = bench.worlds.scratch(&format!("nodes-{nodes}-node-{i}"));
        world_with(&dir, Some(&through(&url, proxy.addr)), None, &load.script, load.node_runs)?;
        let server = StdioServer::spawn_on(&dir, &[i % cores])?;
        server.initialize().await?;
        servers.push(server);
        proxies.push(proxy);
        sets.push(format!("{{{}}}", i % cores));
    }
    let runs = (load.runs)(bench.quick);
    let name = Databases::name_in(&url);
    tokio::time::sleep(Duration::from_secs(2)).await; // the nodes' start is counted out
    let before = dbs.counts(&name).await?;
    wire_totals(&proxies); // the nodes' start is counted out
    let cpu_before = CpuTimes::now()?;
    let started = Instant::now();
    store.write(|tx| -> crate::store::Result<()> {
        for i in 0..runs {
            let session = tx.session_id(&SessionKey::from_canonical(worker(i % WORKER_SESSIONS)))?;
            let input = json!({"role": "user", "content": format!("run {i}")});
            tx.enqueue(&NewRun::new(uuid::Uuid::new_v4().to_string(), session, RunMode::Send, input))?;
        }
        Ok(())
    })?;
    let mut polls = 0;
    while store.unfinished_runs()? > 0 {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "the runs did not finish within 10 min");
        polls += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let idle = CpuTimes::now()?.idle_since(&cpu_before);
    let wire = wire_totals(&proxies);
    let per_node: Vec<String> = store.runs_per_node()?.iter().map(|(_, n)| n.to_string()).collect();
    let what = format!(
        "{nodes} node(s) on one database, each pinned to core {}: {runs} queued runs claimed, {} and finished",
        sets.join(" "),
        load.what
    );
    for server in servers {
        server.stop().await?;
    }
    drop(proxies);
    drop(store);
    tokio::time::sleep(Duration::from_millis(1500)).await; // the closed backends' counters land
    // The bench's own: the enqueue (1 write, 1 + its statements) and each poll and the
    // per-node count (a read: BEGIN, SELECT, ROLLBACK).
    let own_reads = polls + 2;
    let own = (1, own_reads, 3 * own_reads + 3 + 2 * runs as i64);
    let counted = dbs.counts(&name).await?.since(before, own);
    let rate = format!(
        "{:.1} runs/s (per node {}), CPU {:.0} % idle; per run {}; {}",
        runs as f64 / seconds,
        per_node.join("/"),
        idle * 100.0,
        counted.per(runs as f64, ""),
        wire.per_run(runs as f64)
    );
    bench.push(Row::rate(Group::Nodes, what, rate));
    Ok(())
}

/// The server the admin URL names, as the proxies connect to it.
fn upstream(url: &str) -> anyhow::Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let target = crate::store::postgres::PgTarget::parse(url)?;
    let addr = target.addr();
    addr.to_socket_addrs()?.next().with_context(|| format!("{addr} resolves to no address"))
}

/// `url` with its host and port those of `proxy`, in clear (the proxy reads the protocol).
fn through(url: &str, proxy: std::net::SocketAddr) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let (scheme_user, rest) =
        base.split_once('@').map_or(("postgres://", base.trim_start_matches("postgres://")), |(u, r)| (u, r));
    let database = rest.split_once('/').map_or("", |(_, d)| d);
    let at = if base.contains('@') { "@" } else { "" };
    let mut params: Vec<&str> = query.split('&').filter(|p| !p.is_empty() && !p.starts_with("sslmode=")).collect();
    params.push("sslmode=disable");
    format!("{scheme_user}{at}{proxy}/{database}?{}", params.join("&"))
}

/// What the nodes' transactions held since the last call, over every proxy.
fn wire_totals(proxies: &[DelayProxy]) -> WireStats {
    let mut total = WireStats::default();
    for p in proxies {
        total.merge(&p.take());
    }
    total
}

/// The machine's CPU time, idle and in all (`/proc/stat`'s first line), in clock ticks.
struct CpuTimes {
    idle: u64,
    total: u64,
}

impl CpuTimes {
    fn now() -> anyhow::Result<CpuTimes> {
        let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
        let line = stat.lines().next().context("/proc/stat is empty")?;
        let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|t| t.parse().ok()).collect();
        anyhow::ensure!(ticks.len() >= 5, "/proc/stat's cpu line has {} fields", ticks.len());
        // idle and iowait
        Ok(CpuTimes { idle: ticks[3] + ticks[4], total: ticks.iter().sum() })
    }

    /// The share of the machine's CPU time idle since `before`.
    fn idle_since(&self, before: &CpuTimes) -> f64 {
        let total = self.total.saturating_sub(before.total).max(1);
        self.idle.saturating_sub(before.idle) as f64 / total as f64
    }
}

/// `nodes` idle nodes on one new database (no run at all), for a while: the transactions and
/// statements per second they make together.
async fn idle(bench: &mut Bench, dbs: &Databases, nodes: usize) -> anyhow::Result<()> {
    let url = dbs.create(&format!("idle{nodes}")).await?;
    let name = Databases::name_in(&url);
    let mut servers = Vec::new();
    for i in 0..nodes {
        let dir = bench.worlds.scratch(&format!("idle-{nodes}-node-{i}"));
        world(&dir, Some(&url), None)?;
        let server = StdioServer::spawn_on(&dir, &[])?;
        server.initialize().await?;
        servers.push(server);
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // started: migrations, first claims, sweeps
    let before = dbs.counts(&name).await?;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(if bench.quick { 5 } else { 30 })).await;
    for server in servers {
        server.stop().await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let counted = dbs.counts(&name).await?.since(before, (0, 0, 0));
    let what = format!("{nodes} idle node(s) on one database, no runs, {seconds:.0} s");
    bench.push(Row::rate(Group::Nodes, what, counted.per(seconds, "/s")));
    Ok(())
}
