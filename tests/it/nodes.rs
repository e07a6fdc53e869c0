//! Three nodes on one PostgreSQL database (three state dirs, as three machines would have),
//! each with a `serve` process sending and spawning with idempotency keys, and every node's
//! owner running agents. The owner of a running run is SIGKILLed mid-run (its agents die with
//! it; its driver starts that node's `serve` again). The dead owner's runs are marked
//! `interrupted` (never re-run) by its node's next owner or, once their lease passed, by the
//! node taking the sweeps; the queued runs go to whichever node claims them. Checked on the
//! database afterwards: every acknowledged call stored once (one run, one input, one child), no
//! run left queued or running, runs ran on more than one node, no two runs of a session at once,
//! the spawn cap never exceeded across the nodes, no agent process left.
//!
//! Needs `SESSIONS_MCP_TEST_PG` (CI starts a server); skipped without it, failed under CI.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Client, TestDatabase, TestEnv, agents_config, scripted_agent};
use serde_json::{Value, json};

const NODES: usize = 3;
const WORKERS: [&str; 3] = ["agent:worker:w1", "agent:worker:w2", "agent:worker:w3"];
const CALLS_PER_NODE: usize = 30;
const MAX_CONCURRENT_SPAWNS: i64 = 4;

fn database() -> Option<TestDatabase> {
    if std::env::var("SESSIONS_MCP_TEST_PG").is_ok_and(|v| !v.is_empty()) {
        return Some(TestDatabase::create());
    }
    assert!(std::env::var_os("CI").is_none(), "SESSIONS_MCP_TEST_PG is unset under CI: .ci/run starts the server");
    eprintln!("skipped: SESSIONS_MCP_TEST_PG is unset");
    None
}

/// The config every node runs (its agents' scripts are written once, under the first node).
fn config(first: &TestEnv) -> String {
    let script = |sleep: u64, reply: &str| {
        json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
               "default": {"sleepMs": sleep, "reply": reply}})
    };
    let worker = scripted_agent(first, "worker", &script(80, "done: {input}"), json!({}));
    let main = scripted_agent(first, "main", &script(60, "child done"), json!({}));
    let mut config: Value = serde_json::from_str(&agents_config(vec![main, worker], json!({}))).unwrap();
    config["agents"]["defaults"] = json!({"subagents": {
        "maxChildrenPerAgent": 200, "maxConcurrent": MAX_CONCURRENT_SPAWNS, "maxQueued": 200}});
    config.to_string()
}

/// A node with a run running and its owner's pid, from the run's owner (`<node>:<pid>:<nonce>`,
/// the node being the id in `<stateDir>/node-id`). Waits for one.
fn node_running_a_run(db: &TestDatabase, nodes: &[TestEnv]) -> (usize, i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let owners = db.query("SELECT owner FROM runs WHERE status = 'running' ORDER BY started_at", &[]);
        if let Some(row) = owners.first() {
            let owner: String = row.get(0);
            let parts: Vec<&str> = owner.split(':').collect();
            let node = nodes
                .iter()
                .position(|n| std::fs::read_to_string(n.state_dir().join("node-id")).unwrap().trim() == parts[0])
                .unwrap_or_else(|| panic!("owner {owner} is none of the nodes"));
            return (node, parts[1].parse().unwrap());
        }
        assert!(Instant::now() < deadline, "no run started within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug, Clone)]
struct Acked {
    tool: &'static str,
    text: String,
    run_id: String,
}

/// One node's driver: a `serve` process of that node (started again when it dies), sending to
/// the workers and spawning, each call with an idempotency key, retried until acknowledged.
fn drive(node: &TestEnv, n: usize, acked: &Mutex<Vec<Acked>>) -> Client {
    let mut client = node.serve_until_up();
    for i in 0..CALLS_PER_NODE {
        let text = format!("m-{n}-{i}");
        let (tool, args) = if i % 3 == 2 {
            ("sessions_spawn", json!({"task": text, "label": text, "idempotencyKey": text}))
        } else {
            let target = WORKERS[(n + i) % WORKERS.len()];
            (
                "sessions_send",
                json!({"sessionKey": target, "message": text, "timeoutSeconds": 0, "idempotencyKey": text}),
            )
        };
        let answer = loop {
            match client.try_request("tools/call", json!({"name": tool, "arguments": args})) {
                // A store error stored nothing (one transaction): a client retries it with the
                // same key, as it does after losing its server.
                Some(resp) if resp["result"]["structuredContent"]["status"] == "error" => {
                    eprintln!("nodes: retrying {tool} {text}: {}", resp["result"]["structuredContent"]["error"]);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Some(resp) => break resp,
                None => client = node.serve_until_up(),
            }
        };
        let out = &answer["result"]["structuredContent"];
        assert_eq!(out["status"], "accepted", "{tool} {args} → {answer}");
        acked.lock().unwrap().push(Acked { tool, text, run_id: out["runId"].as_str().unwrap().to_string() });
        std::thread::sleep(Duration::from_millis(40));
    }
    client.close_stdin();
    client
}

fn count(db: &TestDatabase, sql: &str, arg: &str) -> i64 {
    db.query(sql, &[&arg])[0].get(0)
}

fn check_stored_once(db: &TestDatabase, acked: &[Acked]) {
    for a in acked {
        let stored = match a.tool {
            "sessions_send" => count(db, "SELECT count(*) FROM runs WHERE input::jsonb ->> 'content' = $1", &a.text),
            _ => count(db, "SELECT count(*) FROM sessions WHERE label = $1", &a.text),
        };
        assert_eq!(stored, 1, "{a:?}: stored {stored} times");
        let inputs = count(
            db,
            "SELECT count(*) FROM messages m JOIN runs r ON r.run_id = m.run_id AND r.session = m.session
             WHERE m.run_id = $1 AND m.role = 'user'",
            &a.run_id,
        );
        assert_eq!(inputs, 1, "{a:?}: its input is in the transcript {inputs} times (a run started twice?)");
    }
}

/// The most runs of `mode` running at one instant, from their start and end times.
fn most_at_once(db: &TestDatabase, mode: &str) -> i64 {
    let rows = db.query("SELECT started_at, ended_at FROM runs WHERE mode = $1 AND started_at IS NOT NULL", &[&mode]);
    let mut edges: Vec<(i64, i64)> = Vec::new();
    for r in rows {
        edges.push((r.get::<_, i64>(0), 1));
        edges.push((r.get::<_, Option<i64>>(1).expect("every run ended"), -1));
    }
    edges.sort(); // an end at the same instant as a start comes first (-1 < 1)
    edges
        .iter()
        .scan(0, |n, (_, d)| {
            *n += d;
            Some(*n)
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn three_nodes_on_one_database_all_run_agents_and_lose_nothing_when_one_is_sigkilled() {
    let Some(db) = database() else { return };
    let mut nodes: Vec<TestEnv> = (0..NODES).map(|_| TestEnv::node_of(&db.url)).collect();
    let config = config(&nodes[0]);
    for node in &mut nodes {
        node.set_config(&config);
    }
    nodes[0].seed(json!({"sessions": WORKERS.iter().map(|k| json!({"key": k})).collect::<Vec<_>>()}));
    let nodes = Arc::new(nodes);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let drivers: Vec<_> = (0..NODES)
        .map(|n| {
            let (nodes, acked) = (nodes.clone(), acked.clone());
            std::thread::spawn(move || drive(&nodes[n], n, &acked))
        })
        .collect();
    // Mid-run: the process killed is the owner of a run that is running.
    let (victim, pid) = node_running_a_run(&db, &nodes);
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let clients: Vec<Client> = drivers.into_iter().map(|d| d.join().expect("driver")).collect();
    let unfinished = "SELECT (SELECT count(*) FROM runs WHERE status IN ('queued', 'running'))
                          + (SELECT count(*) FROM deliveries WHERE status IN ('queued', 'running'))";
    let deadline = Instant::now() + Duration::from_secs(90);
    while db.query(unfinished, &[])[0].get::<_, i64>(0) > 0 {
        assert!(Instant::now() < deadline, "runs or deliveries never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), NODES * CALLS_PER_NODE);
    check_stored_once(&db, &acked);
    let overlaps: i64 = db.query(
        "SELECT count(*) FROM runs a JOIN runs b ON a.session = b.session AND a.run_id < b.run_id
         WHERE a.started_at < b.ended_at AND b.started_at < a.ended_at",
        &[],
    )[0]
    .get(0);
    assert_eq!(overlaps, 0, "no two runs of one session ran at once");
    let spawns = most_at_once(&db, "spawn");
    assert!(spawns <= MAX_CONCURRENT_SPAWNS, "{spawns} spawn runs at once, over the cap of {MAX_CONCURRENT_SPAWNS}");
    let statuses: Vec<(String, i64)> = db
        .query("SELECT status, count(*) FROM runs GROUP BY status ORDER BY 1", &[])
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let running_nodes: i64 =
        db.query("SELECT count(DISTINCT split_part(owner, ':', 1)) FROM runs WHERE owner IS NOT NULL", &[])[0].get(0);
    assert!(running_nodes >= 2, "runs ran on {running_nodes} node(s): every node runs agents");
    let run_ids: Vec<String> = db.query("SELECT run_id FROM runs", &[]).iter().map(|r| r.get(0)).collect();
    common::assert_no_process_carries(&run_ids, Duration::from_secs(10));
    for mut c in clients {
        let _ = c.wait_exit(Duration::from_secs(20));
    }
    eprintln!(
        "nodes: {} calls through {NODES} nodes, runs on {running_nodes} of them, node {victim}'s owner SIGKILLed mid-run; runs {statuses:?}; at most {spawns} spawn runs at once",
        acked.len()
    );
}

/// A node that dies and does not come back: its running run stays `running` until its lease
/// passes, then the node taking the sweeps marks it `interrupted` (never re-run) and the
/// session's next run starts on the node that is left.
#[test]
fn a_dead_nodes_run_is_interrupted_once_its_lease_passes_and_the_session_goes_on_elsewhere() {
    let Some(db) = database() else { return };
    let mut nodes: Vec<TestEnv> = (0..2).map(|_| TestEnv::node_of(&db.url)).collect();
    // The first turn outlives the test; the second answers at once.
    let fast = json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"},
                                {"match": {"input": "second"}, "reply": "second done"}],
                      "default": {"sleepMs": 60_000, "reply": "late"}});
    let worker = scripted_agent(&nodes[0], "worker", &fast, json!({}));
    let main = scripted_agent(&nodes[0], "main", &json!({"default": {"reply": "ok"}}), json!({}));
    let config = agents_config(vec![main, worker], json!({}));
    for node in &mut nodes {
        node.set_config(&config);
    }
    nodes[0].seed(json!({"sessions": [{"key": WORKERS[0]}]}));
    let mut first = nodes[0].serve(None);
    let sent = first.call("sessions_send", json!({"sessionKey": WORKERS[0], "message": "first", "timeoutSeconds": 0}));
    let first_run = sent["runId"].as_str().unwrap().to_string();
    let (victim, pid) = node_running_a_run(&db, &nodes);
    assert_eq!(victim, 0, "only node 0 runs");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = first.wait_exit(Duration::from_secs(10));
    let mut second = nodes[1].serve(None);
    let sent =
        second.call("sessions_send", json!({"sessionKey": WORKERS[0], "message": "second", "timeoutSeconds": 60}));
    assert_eq!(sent["status"], "ok", "{sent}");
    assert_eq!(sent["reply"], "second done");
    let row = db.query("SELECT status, error, owner FROM runs WHERE run_id = $1", &[&first_run]);
    let (status, error): (String, String) = (row[0].get(0), row[0].get(1));
    assert_eq!(status, "interrupted");
    let node0 = std::fs::read_to_string(nodes[0].state_dir().join("node-id")).unwrap();
    assert_eq!(error, format!("interrupted: its node {} stopped renewing its lease; it was not re-run", node0.trim()));
    let second_owner: String =
        db.query("SELECT owner FROM runs WHERE run_id = $1", &[&sent["runId"].as_str().unwrap()])[0].get(0);
    let node1 = std::fs::read_to_string(nodes[1].state_dir().join("node-id")).unwrap();
    assert!(second_owner.starts_with(&format!("{}:", node1.trim())), "{second_owner} is node 1's");
    common::assert_no_process_carries(&[first_run], Duration::from_secs(10));
    second.close();
}

/// A child spawned through one node and run by another finds its attachments in that node's
/// copy of its workdir, byte for byte where the spawn's receipt says: the spawn's node is full
/// (`runtime.maxConcurrentRuns` 1, a long run holding it), so the other node claims the child.
#[test]
fn a_child_run_by_another_node_finds_its_attachments_there() {
    let Some(db) = database() else { return };
    let mut nodes: Vec<TestEnv> = (0..2).map(|_| TestEnv::node_of(&db.url)).collect();
    let busy = json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
                      "default": {"sleepMs": 60_000, "reply": "late"}});
    let worker = scripted_agent(&nodes[0], "worker", &busy, json!({}));
    let mut main = scripted_agent(&nodes[0], "main", &json!({"default": {"reply": "ANNOUNCE_SKIP"}}), json!({}));
    main["subagents"] = json!({"allowAgents": ["reader"]});
    // Its reply is the file, read from its working directory.
    let body = "cat > /dev/null; cat .openclaw/attachments/*/notes.txt\n";
    let reader = common::shell_agent(&nodes[0], "reader", body, &[], json!({"kind": "text"}));
    let base: Value = serde_json::from_str(&agents_config(vec![main, worker, reader], json!({}))).unwrap();
    for (node, cap) in nodes.iter_mut().zip([Some(1), None]) {
        let mut config = base.clone();
        config["tools"]["sessions_spawn"] = json!({"attachments": {"enabled": true}});
        if let Some(cap) = cap {
            config["runtime"] = json!({"maxConcurrentRuns": cap});
        }
        node.set_config(&config.to_string());
    }
    nodes[0].seed(json!({"sessions": [{"key": WORKERS[0]}]}));
    let mut first = nodes[0].serve(None);
    first.call("sessions_send", json!({"sessionKey": WORKERS[0], "message": "hold the node", "timeoutSeconds": 0}));
    let (busy_node, busy_pid) = node_running_a_run(&db, &nodes);
    assert_eq!(busy_node, 0);
    let content = "for the other node, ünïcode ✓";
    let spawned = first.call(
        "sessions_spawn",
        json!({"agentId": "reader", "task": "read it", "attachments": [{"name": "notes.txt", "content": content}]}),
    );
    assert_eq!(spawned["status"], "accepted", "{spawned}");
    let run_id = spawned["runId"].as_str().expect("a run id").to_string();
    let rel_dir = spawned["attachments"]["relDir"].as_str().unwrap().to_string();
    let second = nodes[1].serve(None);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let status: String = db.query("SELECT status FROM runs WHERE run_id = $1", &[&run_id])[0].get(0);
        if !matches!(status.as_str(), "queued" | "running") || Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status, "ok", "the child's run ended");
    let owner: String = db.query("SELECT owner FROM runs WHERE run_id = $1", &[&run_id])[0].get(0);
    let node1 = std::fs::read_to_string(nodes[1].state_dir().join("node-id")).unwrap();
    assert!(owner.starts_with(&format!("{}:", node1.trim())), "{owner} is node 1's");
    let replies = db.query(
        "SELECT m.content FROM messages m JOIN sessions s ON s.id = m.session WHERE s.key = $1 AND m.role = 'assistant'",
        &[&spawned["childSessionKey"].as_str().unwrap()],
    );
    let reply: String = replies[0].get(0);
    assert!(reply.contains(content), "the agent on node 1 read the file: {reply}");
    for node in &nodes {
        let file = node.state_dir().join("workspaces/reader").join(&rel_dir).join("notes.txt");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), content, "{}", file.display());
    }
    // The run holding node 0 would take a minute: its node goes the way a crash does.
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(busy_pid, libc::SIGKILL) };
    let _ = first.wait_exit(Duration::from_secs(10));
    second.close();
}

/// A TCP relay between the nodes and the database that can cut every connection and refuse new
/// ones (the database out of reach for a node), then let them through again.
struct Relay {
    port: u16,
    cut: Arc<std::sync::atomic::AtomicBool>,
    live: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    fn to(server_port: u16) -> Relay {
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, live) = (Arc::new(std::sync::atomic::AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let (cut_in, live_in) = (cut.clone(), live.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if cut_in.load(std::sync::atomic::Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", server_port)) else { continue };
                let mut live = live_in.lock().unwrap();
                live.extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { port, cut, live }
    }

    /// `url` (a test database's) through this relay.
    fn url(&self, url: &str, server_port: u16) -> String {
        url.replacen(&format!(":{server_port}/"), &format!(":{}/", self.port), 1)
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            for stream in self.live.lock().unwrap().drain(..) {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// A node that loses the database stops its own agents before its lease could pass (nobody
/// else ended the run meanwhile: it is still `running` in the database when its agent is gone),
/// claims nothing while it cannot renew, and once the database is back records the run's end
/// itself: `interrupted`, saying its node could not renew its lease, never re-run.
#[test]
fn a_node_that_cannot_renew_its_lease_stops_its_own_agents_first() {
    let Some(db) = database() else { return };
    let server_port: u16 = {
        let after_at = db.url.rsplit_once('@').unwrap().1;
        after_at.split('/').next().unwrap().rsplit_once(':').unwrap().1.parse().unwrap()
    };
    let relay = Relay::to(server_port);
    let mut node = TestEnv::node_of(&relay.url(&db.url, server_port));
    let slow = json!({"rules": [{"match": {"mode": "announce"}, "reply": "ANNOUNCE_SKIP"}],
                      "default": {"sleepMs": 120_000, "reply": "late"}});
    let worker = scripted_agent(&node, "worker", &slow, json!({}));
    node.set_config(&agents_config(vec![json!({"id": "main"}), worker], json!({})));
    node.seed(json!({"sessions": [{"key": WORKERS[0]}]}));
    let mut client = node.serve(None);
    let sent = client.call("sessions_send", json!({"sessionKey": WORKERS[0], "message": "go", "timeoutSeconds": 0}));
    let run_id = sent["runId"].as_str().unwrap().to_string();
    let status = |db: &TestDatabase| -> (String, Option<String>) {
        let row = db.query("SELECT status, error FROM runs WHERE run_id = $1", &[&run_id]);
        (row[0].get(0), row[0].get(1))
    };
    common::wait_until(Duration::from_secs(30), "the agent to start", || {
        let started = db.query("SELECT 1 FROM runs WHERE run_id = $1 AND supervisor_pid IS NOT NULL", &[&run_id]);
        (!started.is_empty()).then_some(())
    });
    relay.set_cut(true);
    common::assert_no_process_carries(std::slice::from_ref(&run_id), Duration::from_secs(60));
    assert_eq!(status(&db).0, "running", "the node stopped its agent before anyone ended the run");
    relay.set_cut(false);
    let (status, error) = common::wait_until(Duration::from_secs(60), "the run's end to be recorded", || {
        let now = status(&db);
        (now.0 != "running").then_some(now)
    });
    assert_eq!(status, "interrupted");
    let node_id = std::fs::read_to_string(node.state_dir().join("node-id")).unwrap();
    let error = error.unwrap_or_default();
    assert!(
        error.starts_with(&format!("interrupted: its node {} could not renew its lease", node_id.trim())),
        "{error}"
    );
    let runs: i64 = db
        .query("SELECT count(*) FROM runs WHERE session = (SELECT session FROM runs WHERE run_id = $1)", &[&run_id])[0]
        .get(0);
    assert_eq!(runs, 1, "never re-run");
    client.close();
}
