//! Load (HARDENING.md): several server processes on one state dir — two over stdio and one over
//! HTTP — while 50 driven agents send to each other and spawn sub-agents. Clients ask an agent to
//! relay a payload to another agent (the agent calls `sessions_send` back through the server) or
//! to spawn a child (`sessions_spawn`). Afterwards: zero errors (every client call and every agent
//! callback accepted, every run `ok`), every payload and every child exactly once, the caps never
//! exceeded, and throughput and p99 printed.
//!
//! `LOAD_SECONDS` (default 60) and `LOAD_RATE` (client calls per second over all clients,
//! default 6).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http_client::Mcp;
use common::{Client, TestEnv, agents_config, max_overlap};
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};

const AGENTS: usize = 50;
const PER_AGENT_RUNS: u64 = 2;
const GLOBAL_RUNS: u64 = 12;
const CHILDREN_RUNNING: u64 = 4;

fn env_var(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn agent_key(i: usize) -> String {
    format!("agent:a{i:02}:main")
}

/// Every agent runs this script: relay a payload, spawn a child, acknowledge a payload, work as
/// a child, and stay silent in announce steps.
fn script() -> Value {
    json!({"rules": [
        {"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"},
        {"match": {"inputRegex": "^relay (\\S+) (\\S+)$"},
         "call": {"tool": "sessions_send", "arguments":
             {"sessionKey": "{1}", "message": "payload {2}", "timeoutSeconds": 0, "idempotencyKey": "relay-{2}"}},
         "reply": "relayed {2}"},
        {"match": {"inputRegex": "^spawn (\\S+)$"},
         "call": {"tool": "sessions_spawn", "arguments":
             {"task": "work {1}", "label": "job-{1}", "idempotencyKey": "spawn-{1}"}},
         "reply": "spawned {1}"},
        {"match": {"inputRegex": "^payload (\\S+)$"}, "sleepMs": 20, "reply": "ack {1}"},
        {"match": {"inputRegex": "work (\\S+)"}, "sleepMs": 40, "reply": "done {1}"}
    ], "default": {"reply": "noted"}})
}

/// On SQLite whichever backend the suite runs on: the checks read the SQLite file.
fn world() -> TestEnv {
    let mut env = TestEnv::sqlite();
    let path = env.write_file("load-agent.json", &script().to_string());
    let runner =
        json!({"command": common::bin(), "args": ["agent", "--script", path], "maxConcurrent": PER_AGENT_RUNS});
    // `main` first: the default agent, whose main session the clients act as
    let agents: Vec<Value> = std::iter::once(json!({"id": "main"}))
        .chain((0..AGENTS).map(|i| json!({"id": format!("a{i:02}"), "runner": runner})))
        .collect();
    let mut config: Value = serde_json::from_str(&agents_config(agents, json!({}))).unwrap();
    config["agents"]["defaults"] =
        json!({"subagents": {"maxChildrenPerAgent": 100, "maxConcurrent": CHILDREN_RUNNING, "maxQueued": 1000}});
    config["runtime"] = json!({"maxConcurrentRuns": GLOBAL_RUNS});
    config["session"] = json!({"agentToAgent": {"maxPingPongTurns": 0}});
    env.set_config(&config.to_string());
    env.seed(json!({"sessions": (0..AGENTS).map(|i| json!({"key": agent_key(i)})).collect::<Vec<_>>()}));
    env
}

/// One client call the load made.
#[derive(Debug, Clone)]
struct Sent {
    uid: String,
    spawn: bool,
    millis: f64,
}

/// A client connection: a stdio `serve` process or an HTTP client of the `serve --http` process.
enum Conn {
    Stdio(Box<Client>),
    Http(Mcp),
}

impl Conn {
    fn send(&mut self, to: &str, message: &str) -> Value {
        let args = json!({"sessionKey": to, "message": message, "timeoutSeconds": 0});
        match self {
            Conn::Stdio(c) => c.call("sessions_send", args),
            Conn::Http(m) => m.call("sessions_send", args),
        }
    }
}

/// Sends at `per_second` until `until`: relays (4 in 5) and spawns, each to a random agent.
fn client(mut conn: Conn, id: usize, per_second: f64, until: Instant, sent: &Mutex<Vec<Sent>>) {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64 + 1);
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut n = 0;
    while Instant::now() < until {
        let uid = format!("c{id}n{n}");
        let from = next() as usize % AGENTS;
        let spawn = next() % 5 == 0;
        let message = if spawn {
            format!("spawn {uid}")
        } else {
            let to = (from + 1 + next() as usize % (AGENTS - 1)) % AGENTS;
            format!("relay {} {uid}", agent_key(to))
        };
        let t0 = Instant::now();
        let out = conn.send(&agent_key(from), &message);
        let millis = t0.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(out["status"], "accepted", "client {id}: {message} → {out}");
        sent.lock().unwrap().push(Sent { uid, spawn, millis });
        n += 1;
        std::thread::sleep(Duration::from_secs_f64(1.0 / per_second));
    }
}

fn rows<T: rusqlite::types::FromSql>(db: &Connection, sql: &str) -> Vec<T> {
    db.prepare(sql).unwrap().query_map([], |r| r.get(0)).unwrap().collect::<rusqlite::Result<_>>().unwrap()
}

fn count(db: &Connection, sql: &str, arg: &str) -> i64 {
    db.query_row(sql, [arg], |r| r.get(0)).unwrap()
}

/// Runs as `{startedAt, endedAt}` for `max_overlap`, optionally only those matching `filter`.
fn intervals(db: &Connection, filter: &str) -> Vec<Value> {
    let sql = format!(
        "SELECT json_object('startedAt', r.started_at, 'endedAt', r.ended_at) FROM runs r
         JOIN sessions s ON s.id = r.session WHERE r.started_at IS NOT NULL AND {filter}"
    );
    rows::<String>(db, &sql).into_iter().map(|j| serde_json::from_str(&j).unwrap()).collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[test]
fn fifty_agents_sending_and_spawning_through_three_servers_lose_nothing_and_respect_the_caps() {
    let env = world();
    let seconds = env_var("LOAD_SECONDS", 60);
    let per_client = env_var("LOAD_RATE", 6) as f64 / 4.0;
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let http = env.serve_http(&["--as", "main"]);
    let conns = vec![
        Conn::Stdio(Box::new(env.serve(None))),
        Conn::Stdio(Box::new(env.serve(None))),
        Conn::Http(Mcp::legacy(http.port, "")),
        Conn::Http(Mcp::modern(http.port, "")),
    ];
    let sent = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(id, conn)| {
            let sent = sent.clone();
            std::thread::spawn(move || client(conn, id, per_client, until, &sent))
        })
        .collect();
    for c in clients {
        c.join().expect("a client failed");
    }
    let db =
        Connection::open_with_flags(env.state_dir().join("sessions.db"), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let unfinished = "SELECT (SELECT count(*) FROM runs WHERE status IN ('queued', 'running'))
                          + (SELECT count(*) FROM deliveries WHERE status IN ('queued', 'running'))";
    // what was queued at a high rate may take as long again to run
    let drain_deadline = Instant::now() + Duration::from_secs(120 + seconds);
    while db.query_row(unfinished, [], |r| r.get::<_, i64>(0)).unwrap() > 0 {
        assert!(Instant::now() < drain_deadline, "the load never drained");
        std::thread::sleep(Duration::from_millis(200));
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(http);

    // zero errors: every run ok, every agent callback accepted
    let statuses: Vec<String> =
        rows(&db, "SELECT status || ' ' || mode || ' ' || coalesce(error, '') FROM runs WHERE status <> 'ok'");
    assert!(statuses.is_empty(), "runs that did not end ok: {statuses:?}");
    let callbacks: Vec<String> = rows(&db, "SELECT content FROM messages WHERE role = 'toolResult'");
    let refused: Vec<&String> = callbacks.iter().filter(|c| !c.contains(r#"\"status\":\"accepted\""#)).collect();
    assert!(refused.is_empty(), "agent callbacks not accepted: {refused:?}");

    // exactly once
    let sent = sent.lock().unwrap().clone();
    for s in &sent {
        let (text, sql) = if s.spawn {
            (format!("job-{}", s.uid), "SELECT count(*) FROM sessions WHERE label = ?1")
        } else {
            (format!("payload {}", s.uid), "SELECT count(*) FROM runs WHERE json_extract(input, '$.content') = ?1")
        };
        assert_eq!(count(&db, sql, &text), 1, "{s:?}: {text} stored once");
    }
    assert_eq!(callbacks.len(), sent.len(), "one callback per client call");

    // the caps
    let global = max_overlap(&intervals(&db, "1"));
    assert!(global as u64 <= GLOBAL_RUNS, "{global} runs at once (runtime.maxConcurrentRuns {GLOBAL_RUNS})");
    let children = max_overlap(&intervals(&db, "r.mode = 'spawn'"));
    assert!(children as u64 <= CHILDREN_RUNNING, "{children} children at once");
    for i in 0..AGENTS {
        let per_agent = max_overlap(&intervals(&db, &format!("s.agent_id = 'a{i:02}'")));
        assert!(per_agent as u64 <= PER_AGENT_RUNS, "agent a{i:02}: {per_agent} runs at once");
    }

    let runs: i64 = db.query_row("SELECT count(*) FROM runs", [], |r| r.get(0)).unwrap();
    let mut ms: Vec<f64> = sent.iter().map(|s| s.millis).collect();
    ms.sort_by(f64::total_cmp);
    eprintln!(
        "load: {seconds} s of load, {elapsed:.0} s with the drain; {} client calls ({} spawns), {runs} runs ({:.1} runs/s); \
         client call p50 {:.1} ms, p99 {:.1} ms; max concurrent runs {global} (cap {GLOBAL_RUNS}), children {children} \
         (cap {CHILDREN_RUNNING}); 0 errors, 0 lost, 0 duplicated",
        sent.len(),
        sent.iter().filter(|s| s.spawn).count(),
        runs as f64 / elapsed,
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
    );
}
