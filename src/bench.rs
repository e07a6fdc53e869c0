//! `sessions-mcp bench [--quick]`: tool latency on generated stores, measured in-process through
//! the same path a `tools/call` takes (access, store, sanitising, JSON). Whole-process figures
//! (start-up, stdio) belong to the benchmark issue's harness.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};

use crate::access::Access;
use crate::caller::Caller;
use crate::config::{Config, Visibility};
use crate::keys::{AgentId, SessionKey};
use crate::policy::CallerRole;
use crate::store::{NewMessage, NewSession, Store, append_message, insert_session};
use crate::tools::{self, Ctx};

struct Row {
    what: String,
    p50_us: f64,
    p99_us: f64,
}

pub async fn run(quick: bool) -> ExitCode {
    match run_all(quick).await {
        Ok(rows) => {
            println!("{:<62} {:>10} {:>10}", "measurement (in-process tools/call)", "p50 ms", "p99 ms");
            for r in &rows {
                println!("{:<62} {:>10.3} {:>10.3}", r.what, r.p50_us / 1000.0, r.p99_us / 1000.0);
            }
            println!(
                "machine: {} cores; iterations per row: {}",
                std::thread::available_parallelism().map_or(0, |n| n.get()),
                iterations(quick)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sessions-mcp bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn iterations(quick: bool) -> usize {
    if quick { 200 } else { 1000 }
}

async fn run_all(quick: bool) -> anyhow::Result<Vec<Row>> {
    let n = iterations(quick);
    let big = if quick { 10_000 } else { 100_000 };
    let mut rows = Vec::new();
    for sessions in [100u64, 10_000] {
        let (access, caller, _dir) = world(Visibility::Agent, |store| seed_flat(store, sessions, 6))?;
        let args = json!({"limit": 50, "messageLimit": 5});
        rows.push(
            measure(
                &access,
                &caller,
                "sessions_list",
                &args,
                n,
                format!("list limit 50 messageLimit 5, agent, {sessions} sessions"),
            )
            .await?,
        );
    }
    let (access, caller, _dir) = world(Visibility::Tree, |store| seed_tree(store, 10_000))?;
    rows.push(
        measure(
            &access,
            &caller,
            "sessions_list",
            &json!({"limit": 50}),
            n,
            "list limit 50, tree, caller with 10000 descendants".into(),
        )
        .await?,
    );
    for messages in [1_000u64, big] {
        let (access, caller, _dir) = world(Visibility::Agent, |store| seed_history(store, messages))?;
        let args = json!({"sessionKey": "agent:main:bench:history", "limit": 200});
        rows.push(
            measure(&access, &caller, "sessions_history", &args, n, format!("history limit 200, {messages} messages"))
                .await?,
        );
    }
    Ok(rows)
}

fn world(
    visibility: Visibility,
    seed: impl FnOnce(&Store) -> anyhow::Result<()>,
) -> anyhow::Result<(Access, Caller, tempfile_dir::TempDir)> {
    let dir = tempfile_dir::TempDir::new()?;
    let store = Store::open(&Store::path_in(dir.path()))?;
    seed(&store)?;
    let mut config = Config::default();
    config.tools.sessions.visibility = visibility;
    let caller = Caller {
        key: SessionKey::from_canonical("agent:main:main"),
        agent: AgentId::main(),
        sandboxed: false,
        external: true,
        role: CallerRole::TopLevel,
        run: None,
        read_only: false,
    };
    Ok((Access::new(store, Arc::new(config)), caller, dir))
}

async fn measure(
    access: &Access,
    caller: &Caller,
    tool: &str,
    args: &Value,
    n: usize,
    what: String,
) -> anyhow::Result<Row> {
    let ctx = Ctx::plain(access, caller);
    let args: Map<String, Value> = args.as_object().cloned().unwrap_or_default();
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        let r = tools::call(&ctx, tool, Some(args.clone())).await.ok_or_else(|| anyhow::anyhow!("no tool {tool}"))?;
        let elapsed = t.elapsed().as_secs_f64() * 1e6;
        anyhow::ensure!(r.is_error != Some(true), "{tool} failed: {:?}", r.structured_content);
        if i >= n / 10 {
            samples.push(elapsed); // the first tenth warms caches
        }
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    Ok(Row { what, p50_us: pct(0.5), p99_us: pct(0.99) })
}

fn text_message(i: u64) -> NewMessage {
    NewMessage {
        role: if i.is_multiple_of(2) { "user" } else { "assistant" }.into(),
        content: json!([{"type": "text", "text": format!("message {i}: a short line of transcript text for the benchmark")}]),
        ..Default::default()
    }
}

fn seed_flat(store: &Store, sessions: u64, per_session: u64) -> anyhow::Result<()> {
    store.write(|tx| -> anyhow::Result<()> {
        let main = AgentId::main();
        for i in 0..sessions {
            let key = SessionKey::for_agent(&main, &format!("bench:{i}"));
            let s = NewSession::new(key.clone(), main.clone(), crate::keys::SessionKind::Other, false);
            insert_session(tx, &s)?;
            let id: i64 = tx.query_row("SELECT id FROM sessions WHERE key = ?1", [key.as_str()], |r| r.get(0))?;
            for m in 0..per_session {
                append_message(tx, id, &text_message(m))?;
            }
        }
        Ok(())
    })
}

fn seed_tree(store: &Store, children: u64) -> anyhow::Result<()> {
    store.write(|tx| -> anyhow::Result<()> {
        let main = AgentId::main();
        let parent = SessionKey::from_canonical("agent:main:main");
        insert_session(tx, &NewSession::new(parent.clone(), main.clone(), crate::keys::SessionKind::Main, true))?;
        for _ in 0..children {
            let key = SessionKey::for_agent(&main, &format!("subagent:{}", uuid::Uuid::new_v4()));
            let mut s = NewSession::new(key, main.clone(), crate::keys::SessionKind::Other, false);
            s.spawned_by = Some(parent.clone());
            s.spawn_depth = 1;
            insert_session(tx, &s)?;
        }
        Ok(())
    })
}

fn seed_history(store: &Store, messages: u64) -> anyhow::Result<()> {
    store.write(|tx| -> anyhow::Result<()> {
        let key = SessionKey::from_canonical("agent:main:bench:history");
        insert_session(tx, &NewSession::new(key.clone(), AgentId::main(), crate::keys::SessionKind::Other, false))?;
        let id: i64 = tx.query_row("SELECT id FROM sessions WHERE key = ?1", [key.as_str()], |r| r.get(0))?;
        for m in 0..messages {
            append_message(tx, id, &text_message(m))?;
        }
        Ok(())
    })
}

/// A temporary state directory removed on drop (no test-only crates in the binary).
mod tempfile_dir {
    use std::path::{Path, PathBuf};

    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new() -> std::io::Result<Self> {
            let p = std::env::temp_dir().join(format!("sessions-mcp-bench-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&p)?;
            Ok(TempDir(p))
        }
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
