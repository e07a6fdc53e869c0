//! Fault injection (HARDENING.md). The runtime owner is SIGKILLed at random points while several
//! `serve` processes send and spawn; after the restarts every acknowledged message is stored
//! exactly once (idempotent retries included), no run is left queued or running, every delivery
//! reached a final state, and no agent process is left. A full disk (`RLIMIT_FSIZE`) and a
//! read-only store give clear errors and lose nothing.
//!
//! `FAULT_ROUNDS` (default 1) rounds of `FAULT_KILLS` (default 2) kills each; `FAULT_SEED` replays
//! a failing round (every round prints its seed).

use crate::common;

use std::collections::HashMap;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Client, TestEnv, agents_config, scripted_agent};
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};

const WORKERS: [&str; 3] = ["agent:worker:w1", "agent:worker:w2", "agent:worker:w3"];
const DRIVERS: usize = 3;
const CALLS_PER_DRIVER: usize = 40;

fn env_var(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A small xorshift generator: enough to place kills at random points, replayable by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// On SQLite whichever backend the suite runs on: the checks read the SQLite file.
fn world() -> TestEnv {
    let mut env = TestEnv::sqlite();
    let worker = scripted_agent(
        &env,
        "worker",
        &json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
                "default": {"sleepMs": 60, "reply": "done: {input}"}}),
        json!({}),
    );
    let main = scripted_agent(
        &env,
        "main",
        &json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
                "default": {"sleepMs": 40, "reply": "child done"}}),
        json!({}),
    );
    let mut config: Value = serde_json::from_str(&agents_config(vec![main, worker], json!({}))).unwrap();
    config["agents"]["defaults"] =
        json!({"subagents": {"maxChildrenPerAgent": 200, "maxConcurrent": 4, "maxQueued": 200}});
    env.set_config(&config.to_string());
    env.seed(json!({"sessions": WORKERS.iter().map(|k| json!({"key": k})).collect::<Vec<_>>()}));
    env
}

/// What one call acknowledged: its tool, the text that identifies it, and its run.
#[derive(Debug, Clone)]
struct Acked {
    tool: &'static str,
    text: String,
    run_id: String,
}

/// One driver: a `serve` process (restarted when it dies) issuing sends and spawns, each with an
/// idempotency key, retried with the same key until acknowledged.
/// Returns how often it reconnected, and its last server (stdin closed: it drains and exits).
fn drive(env: &TestEnv, driver: usize, acked: &Mutex<Vec<Acked>>) -> (usize, Client) {
    let mut client = env.serve(None);
    let mut restarts = 0;
    for i in 0..CALLS_PER_DRIVER {
        let text = format!("m-{driver}-{i}");
        let (tool, args) = if i % 4 == 3 {
            ("sessions_spawn", json!({"task": text, "label": text, "idempotencyKey": text}))
        } else {
            let target = WORKERS[i % WORKERS.len()];
            (
                "sessions_send",
                json!({"sessionKey": target, "message": text, "timeoutSeconds": 0, "idempotencyKey": text}),
            )
        };
        let answer = loop {
            match client.try_request("tools/call", json!({"name": tool, "arguments": args})) {
                Some(resp) => break resp,
                None => {
                    client = env.serve(None);
                    restarts += 1;
                }
            }
        };
        let out = &answer["result"]["structuredContent"];
        assert_eq!(out["status"], "accepted", "{tool} {args} → {answer}");
        let run_id = out["runId"].as_str().expect("runId").to_string();
        acked.lock().unwrap().push(Acked { tool, text, run_id });
        // a steady stream, so that the kills land in the middle of it
        std::thread::sleep(Duration::from_millis(30));
    }
    client.close_stdin();
    (restarts, client)
}

fn open_store(env: &TestEnv) -> Connection {
    let path = env.state_dir().join("sessions.db");
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

fn count(db: &Connection, sql: &str, arg: &str) -> i64 {
    db.query_row(sql, [arg], |r| r.get(0)).unwrap()
}

/// Every acknowledged call left exactly one run, one stored input and (for a spawn) one child.
fn check_exactly_once(db: &Connection, acked: &[Acked]) {
    for a in acked {
        let runs_of_text = match a.tool {
            "sessions_send" => {
                count(db, "SELECT count(*) FROM runs WHERE json_extract(input, '$.content') = ?1", &a.text)
            }
            _ => count(db, "SELECT count(*) FROM sessions WHERE label = ?1", &a.text),
        };
        assert_eq!(runs_of_text, 1, "{a:?}: stored {runs_of_text} times");
        assert_eq!(count(db, "SELECT count(*) FROM runs WHERE run_id = ?1", &a.run_id), 1, "{a:?}");
        // the input in the run's own session (a reply into the requester's inbox carries the run id too)
        let inputs = count(
            db,
            "SELECT count(*) FROM messages m JOIN runs r ON r.run_id = m.run_id AND r.session = m.session
             WHERE m.run_id = ?1 AND m.role = 'user'",
            &a.run_id,
        );
        assert_eq!(inputs, 1, "{a:?}: its input is in the transcript {inputs} times");
        check_handed_back_once(db, a);
    }
}

/// A send's reply (when its run ended ok) and a spawn's announce reach `main`'s inbox exactly
/// once, through exactly one delivery row in a final state.
fn check_handed_back_once(db: &Connection, a: &Acked) {
    let status: String = db.query_row("SELECT status FROM runs WHERE run_id = ?1", [&a.run_id], |r| r.get(0)).unwrap();
    let kind = if a.tool == "sessions_send" { "reply" } else { "announce" };
    let deliveries: Vec<String> = db
        .prepare("SELECT status FROM deliveries WHERE run_id = ?1 AND kind = ?2")
        .unwrap()
        .query_map([&a.run_id, kind], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(deliveries.len(), 1, "{a:?} ({status}): {kind} deliveries {deliveries:?}");
    let in_inbox = count(
        db,
        "SELECT count(*) FROM messages m JOIN sessions s ON s.id = m.session
         WHERE s.key = 'agent:main:main' AND m.run_id = ?1",
        &a.run_id,
    );
    // every child announces, interrupted or not; a send's reply comes only from a run that ended ok
    let expected = i64::from(a.tool == "sessions_spawn" || status == "ok");
    assert_eq!(in_inbox, expected, "{a:?} ({status}): in main's inbox {in_inbox} times, delivery {deliveries:?}");
}

/// The unfinished runs and deliveries, for the failure message.
fn stuck(db: &Connection) -> String {
    let rows = |sql: &str| -> Vec<String> {
        db.prepare(sql).unwrap().query_map([], |r| r.get::<_, String>(0)).unwrap().flatten().collect()
    };
    let runs = rows(
        "SELECT r.run_id || ' ' || r.mode || ' ' || r.status || ' owner=' || coalesce(r.owner, '-') || ' in ' || s.key
         FROM runs r JOIN sessions s ON s.id = r.session WHERE r.status IN ('queued', 'running')",
    );
    let deliveries = rows(
        "SELECT run_id || ' ' || kind || ' ' || status || ' attempts=' || attempts || ' ' || coalesce(last_error, '')
         FROM deliveries WHERE status IN ('queued', 'running')",
    );
    format!("runs {runs:#?}, deliveries {deliveries:#?}")
}

fn fault_round(seed: u64) {
    eprintln!("fault round: FAULT_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let env = Arc::new(world());
    let acked = Arc::new(Mutex::new(Vec::new()));
    let drivers: Vec<_> = (0..DRIVERS)
        .map(|d| {
            let (env, acked) = (env.clone(), acked.clone());
            std::thread::spawn(move || drive(&env, d, &acked))
        })
        .collect();
    let mut kills = 0;
    for _ in 0..env_var("FAULT_KILLS", 2) {
        std::thread::sleep(Duration::from_millis(rng.between(200, 900)));
        if let Some(pid) = common::runtime_lock_holder(&env.state_dir()) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            kills += 1;
        }
    }
    let (restarts, clients): (Vec<usize>, Vec<Client>) = drivers.into_iter().map(|d| d.join().expect("driver")).unzip();
    let restarts: usize = restarts.iter().sum();
    // A last server finishes what the killed owners left queued, then everything is checked.
    let finisher = env.serve(None);
    let db = open_store(&env);
    let unfinished = "SELECT (SELECT count(*) FROM runs WHERE status IN ('queued', 'running'))
                          + (SELECT count(*) FROM deliveries WHERE status IN ('queued', 'running'))";
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.query_row(unfinished, [], |r| r.get::<_, i64>(0)).unwrap() > 0 {
        assert!(Instant::now() < deadline, "runs or deliveries never ended: {}", stuck(&db));
        std::thread::sleep(Duration::from_millis(100));
    }
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), DRIVERS * CALLS_PER_DRIVER);
    check_exactly_once(&db, &acked);
    let statuses: HashMap<String, i64> = db
        .prepare("SELECT status, count(*) FROM runs GROUP BY status")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let run_ids: Vec<String> =
        db.prepare("SELECT run_id FROM runs").unwrap().query_map([], |r| r.get(0)).unwrap().flatten().collect();
    common::assert_no_process_carries(&run_ids, Duration::from_secs(10));
    drop(finisher);
    for mut c in clients {
        // a driver's last server exits cleanly after draining, unless it was a kill victim itself
        let exited = c.wait_exit(Duration::from_secs(20));
        let clean = exited.is_some_and(|s| s.success() || s.signal() == Some(libc::SIGKILL));
        assert!(clean, "a draining server exits cleanly: {exited:?}");
    }
    eprintln!(
        "fault round {seed}: {kills} owner kills, {restarts} client reconnects, {} acknowledged calls checked, runs by status {statuses:?}, 0 processes left",
        acked.len()
    );
}

#[test]
fn sigkilling_the_owner_during_sends_and_spawns_loses_and_duplicates_nothing() {
    let first = env_var("FAULT_SEED", 0).max(1);
    let first = if first == 1 { std::process::id() as u64 * 2_654_435_761 } else { first };
    for round in 0..env_var("FAULT_ROUNDS", 1) {
        fault_round(first.wrapping_add(round));
    }
}

/// `serve` with file writes capped at `limit` bytes (EFBIG instead of SIGXFSZ).
fn serve_with_file_limit(env: &TestEnv, limit: u64) -> Client {
    let mut cmd = env.command(&["serve"]);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let rl = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &rl) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Client::start(cmd)
}

#[test]
fn a_full_disk_gives_a_clear_error_keeps_serving_and_loses_nothing() {
    // The disk under SQLite's file (PostgreSQL's server keeps its own).
    let env = TestEnv::with_config(&agents_config(vec![], json!({}))).on_sqlite();
    env.seed(json!({"sessions": [{"key": "agent:main:desk", "driver": "external"}]}));
    let db_size = std::fs::metadata(env.state_dir().join("sessions.db")).unwrap().len();
    let mut c = serve_with_file_limit(&env, db_size + 256 * 1024);
    let big = "x".repeat(60 * 1024);
    let mut acknowledged = Vec::new();
    let refusal = loop {
        let text = format!("{}-{big}", acknowledged.len());
        let r = c.call("sessions_send", json!({"sessionKey": "agent:main:desk", "message": text}));
        if r["status"] != "accepted" {
            break r;
        }
        acknowledged.push(text);
        assert!(acknowledged.len() < 100, "the file limit never bit");
    };
    assert_eq!(refusal["status"], "error", "{refusal}");
    let why = refusal["error"].as_str().unwrap();
    assert!(why.contains("disk is full"), "the error says what is wrong: {why}");
    // reads still work, and the refused message is not half-stored
    let h = c.call("sessions_history", json!({"sessionKey": "agent:main:desk", "limit": 200}));
    assert_eq!(h["status"], "ok", "{h}");
    drop(c);

    let db = open_store(&env);
    let stored: Vec<String> = db
        .prepare(
            "SELECT json_extract(m.content, '$[0].text') FROM messages m JOIN sessions s ON s.id = m.session
             WHERE s.key = 'agent:main:desk'",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert!(!acknowledged.is_empty());
    for text in &acknowledged {
        assert_eq!(stored.iter().filter(|s| *s == text).count(), 1, "an acknowledged message is stored exactly once");
    }
    assert_eq!(stored.len(), acknowledged.len(), "nothing unacknowledged was stored");
    // and the store takes writes again once there is room
    let mut c = env.serve(None);
    let r = c.call("sessions_send", json!({"sessionKey": "agent:main:desk", "message": "room again"}));
    assert_eq!(r["status"], "accepted", "{r}");
    c.close();
}

#[test]
fn a_read_only_store_is_refused_with_a_clear_error_and_left_untouched() {
    if !Path::new("/usr/bin/bwrap").exists() {
        assert!(std::env::var_os("CI").is_none(), "bubblewrap is required under CI");
        eprintln!("skipped: bubblewrap (bwrap) is not installed");
        return;
    }
    let env = TestEnv::new();
    env.seed(json!({"sessions": [{"key": "agent:main:desk", "messages": [{"role": "user", "content": "kept"}]}]}));
    let before = env.fingerprint();
    let state = env.state_dir();
    let state = state.to_str().unwrap();
    let started = Instant::now();
    let out = std::process::Command::new("/usr/bin/bwrap")
        .args(["--bind", "/", "/", "--ro-bind", state, state, "--dev", "/dev", "--proc", "/proc", "--"])
        .args([common::bin(), "serve", "--state-dir", state])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "serve refuses a read-only store: {stderr}");
    assert!(stderr.contains("read-only"), "the error says what is wrong: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(env.fingerprint(), before, "nothing changed");
}
