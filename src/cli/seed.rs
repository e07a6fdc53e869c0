//! The world loader (`sessions-mcp dev seed`): writes sessions and messages straight through the
//! store, from a JSON spec or generated in bulk. Tests and benchmarks build their worlds with it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::cli::Paths;
use crate::config::key_scope;
use crate::keys::{self, AgentId, ChatType, SessionKey, SessionRef};
use crate::store::{self, NewMessage, NewSession, Store, now_ms};

#[derive(Args)]
pub struct SeedArgs {
    /// A JSON world spec: {"sessions": [{key, messages: [...], ...}]}.
    spec: Option<PathBuf>,
    /// Generate this many sessions (keys agent:<agent>:seed:<i>, or sub-agents with --spawned-by).
    #[arg(long)]
    sessions: Option<u64>,
    /// Generate this many messages, spread over the generated sessions (or all --into one key).
    #[arg(long, default_value_t = 0)]
    messages: u64,
    /// Agent of the generated sessions.
    #[arg(long, default_value = "main")]
    agent: String,
    /// Make every generated session a child of this key.
    #[arg(long)]
    spawned_by: Option<String>,
    /// Put all generated messages into this session (created if missing).
    #[arg(long)]
    into: Option<String>,
    #[command(flatten)]
    paths: Paths,
}

/// One session of a world spec.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionSpec {
    pub key: String,
    /// The agent whose prefix a bare key gets (default main).
    pub agent_id: Option<String>,
    pub session_id: Option<String>,
    #[serde(default)]
    pub driver: Option<String>,
    pub channel: Option<String>,
    pub last_channel: Option<String>,
    pub last_to: Option<String>,
    pub delivery_context: Option<Value>,
    pub chat_type: Option<String>,
    pub label: Option<String>,
    pub display_name: Option<String>,
    pub spawned_by: Option<String>,
    #[serde(default)]
    pub spawn_depth: Option<i64>,
    #[serde(default)]
    pub sandboxed: bool,
    pub send_policy: Option<String>,
    pub model: Option<String>,
    pub archived_at: Option<i64>,
    pub deleted_at: Option<i64>,
    pub updated_at: Option<i64>,
    #[serde(default)]
    pub messages: Vec<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorldSpec {
    pub sessions: Vec<SessionSpec>,
    /// Run tokens to store (as sha256), so tests can act as a driven session.
    #[serde(default)]
    pub run_tokens: Vec<RunTokenSpec>,
    /// Runs to store as they are (e.g. a `running` run a token is bound to).
    #[serde(default)]
    pub runs: Vec<RunSpec>,
}

/// A run row: its id, session, status (queued | running | ok | …) and what it waits on.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunSpec {
    pub run_id: String,
    pub session_key: String,
    #[serde(default = "default_run_status")]
    pub status: String,
    pub waiting_on: Option<String>,
    pub owner: Option<String>,
    #[serde(default)]
    pub input: Option<String>,
}

fn default_run_status() -> String {
    "running".into()
}

/// A run token: the plain token (hashed before storing) and what it is bound to.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunTokenSpec {
    pub token: String,
    pub session_key: String,
    pub run_id: String,
    pub chain_id: Option<String>,
    #[serde(default)]
    pub hop: i64,
    #[serde(default)]
    pub sandboxed: bool,
    /// Expiry in ms since the epoch (None = valid while its run lasts).
    pub expires_at: Option<i64>,
}

pub fn seed(args: &SeedArgs) -> ExitCode {
    let store = match crate::cli::open_store(&args.paths.state_dir()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let result = match (&args.spec, args.sessions) {
        (Some(path), _) => std::fs::read_to_string(path)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|t| serde_json::from_str::<WorldSpec>(&t).map_err(|e| format!("{}: {e}", path.display())))
            .and_then(|w| seed_world(&store, &w).map_err(|e| format!("{e:#}"))),
        (None, Some(n)) => generate(&store, n, args).map_err(|e| format!("{e:#}")),
        (None, None) => Err("give a spec file or --sessions N".to_string()),
    };
    match result {
        Ok(count) => {
            println!("seeded {count} sessions");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sessions-mcp dev seed: {e}");
            ExitCode::from(2)
        }
    }
}

fn canonical(raw: &str) -> Result<SessionKey, String> {
    canonical_for(raw, &AgentId::main())
}

fn canonical_for(raw: &str, agent: &AgentId) -> Result<SessionKey, String> {
    let scope = key_scope(&crate::config::Config::default(), agent);
    match keys::parse_ref(raw, &scope) {
        Ok(SessionRef::Key(k)) => Ok(k),
        _ => Err(format!("{raw:?} is not a session key")),
    }
}

/// Writes a world spec in one transaction.
pub fn seed_world(store: &Store, world: &WorldSpec) -> anyhow::Result<u64> {
    store.write(|tx| -> anyhow::Result<u64> {
        for s in &world.sessions {
            let prefix = s.agent_id.as_deref().map(AgentId::parse).transpose()?.unwrap_or_else(AgentId::main);
            let key = canonical_for(&s.key, &prefix).map_err(anyhow::Error::msg)?;
            let agent = key.agent_id(&AgentId::main());
            let chat_type = s.chat_type.as_deref().and_then(ChatType::parse);
            let scope = key_scope(&crate::config::Config::default(), &agent);
            let mut n = NewSession::new(key.clone(), agent, keys::kind_of(&key, &scope, chat_type), s.driver.as_deref() == Some("external"));
            if let Some(id) = &s.session_id {
                n.session_id = id.clone();
            }
            n.chat_type = chat_type;
            n.channel = s.channel.clone();
            n.last_channel = s.last_channel.clone();
            n.last_to = s.last_to.clone();
            n.delivery_context = s.delivery_context.clone();
            n.label = s.label.clone();
            n.display_name = s.display_name.clone();
            n.spawned_by = s.spawned_by.as_deref().map(canonical).transpose().map_err(anyhow::Error::msg)?;
            n.spawn_depth = s.spawn_depth.unwrap_or(i64::from(n.spawned_by.is_some()));
            n.sandboxed = s.sandboxed;
            n.model = s.model.clone();
            n.archived_at = s.archived_at;
            let updated = s.updated_at.unwrap_or_else(now_ms);
            n.created_at = updated;
            n.updated_at = updated;
            store::insert_session(tx, &n)?;
            let id: i64 = crate::store::session_id(tx, &key)?;
            tx.execute(
                "UPDATE sessions SET send_policy = ?2, deleted_at = ?3, state = CASE WHEN ?3 IS NOT NULL THEN 2 ELSE state END WHERE id = ?1",
                rusqlite::params![id, s.send_policy, s.deleted_at],
            )?;
            for m in &s.messages {
                store::append_message(tx, id, &spec_message(m, updated))?;
            }
            // Appending moves updated_at; a spec that names it wins.
            tx.execute("UPDATE sessions SET updated_at = ?2 WHERE id = ?1", rusqlite::params![id, updated])?;
        }
        for t in &world.run_tokens {
            let key = canonical(&t.session_key).map_err(anyhow::Error::msg)?;
            tx.execute(
                "INSERT INTO tokens (hash, kind, session_key, run_id, chain_id, hop, sandboxed, expires_at, created_at)
                 VALUES (?1, 'run', ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                rusqlite::params![
                    crate::store::sha256_hex(&t.token),
                    key.as_str(),
                    t.run_id,
                    t.chain_id,
                    t.hop,
                    t.sandboxed,
                    t.expires_at,
                    now_ms()
                ],
            )?;
        }
        for r in &world.runs {
            let key = canonical(&r.session_key).map_err(anyhow::Error::msg)?;
            let session: i64 = crate::store::session_id(tx, &key)?;
            tx.execute(
                "INSERT INTO runs (run_id, session, mode, status, input, waiting_on, owner, created_at, started_at)
                 VALUES (?1, ?2, 'send', ?3, ?4, ?5, ?6, ?7, ?7)",
                rusqlite::params![
                    r.run_id,
                    session,
                    r.status,
                    json!({"role": "user", "content": r.input.clone().unwrap_or_default()}).to_string(),
                    r.waiting_on,
                    r.owner,
                    now_ms()
                ],
            )?;
        }
        Ok(world.sessions.len() as u64)
    })
}

fn spec_message(m: &Map<String, Value>, default_ts: i64) -> NewMessage {
    let s = |k: &str| m.get(k).and_then(Value::as_str).map(String::from);
    let known = ["role", "content", "timestamp", "runId", "provenance", "usage", "model", "stopReason", "silent"];
    let extra: Map<String, Value> =
        m.iter().filter(|(k, _)| !known.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    NewMessage {
        role: s("role").unwrap_or_else(|| "user".into()),
        content: m.get("content").cloned().unwrap_or(Value::String(String::new())),
        timestamp: Some(m.get("timestamp").and_then(Value::as_i64).unwrap_or(default_ts)),
        run_id: s("runId"),
        provenance: m.get("provenance").cloned(),
        usage: m.get("usage").cloned(),
        model: s("model"),
        stop_reason: s("stopReason"),
        silent: m.get("silent").and_then(Value::as_bool).unwrap_or(false),
        chain_id: None,
        extra: (!extra.is_empty()).then_some(extra),
    }
}

/// Generates `n` sessions and `args.messages` messages in one transaction.
fn generate(store: &Store, n: u64, args: &SeedArgs) -> anyhow::Result<u64> {
    let agent = AgentId::parse(&args.agent)?;
    let parent = args.spawned_by.as_deref().map(canonical).transpose().map_err(anyhow::Error::msg)?;
    let into = args.into.as_deref().map(canonical).transpose().map_err(anyhow::Error::msg)?;
    let scope = key_scope(&crate::config::Config::default(), &agent);
    let base = now_ms() - (n as i64) * 1000;
    store.write(|tx| -> anyhow::Result<u64> {
        let mut ids = Vec::with_capacity(n as usize);
        for i in 0..n {
            let key = match &parent {
                Some(_) => SessionKey::for_agent(&agent, &format!("subagent:{}", uuid::Uuid::new_v4())),
                None => SessionKey::for_agent(&agent, &format!("seed:{i}")),
            };
            let mut s = NewSession::new(key.clone(), agent.clone(), keys::kind_of(&key, &scope, None), false);
            s.spawned_by = parent.clone();
            s.spawn_depth = i64::from(parent.is_some());
            s.created_at = base + i as i64 * 1000;
            s.updated_at = s.created_at;
            store::insert_session(tx, &s)?;
            ids.push(crate::store::session_id(tx, &key)?);
        }
        if let Some(key) = &into {
            let s = NewSession::new(key.clone(), key.agent_id(&agent), keys::kind_of(key, &scope, None), false);
            store::insert_session(tx, &s)?;
            ids = vec![crate::store::session_id(tx, key)?];
        }
        for i in 0..args.messages {
            let Some(session) = ids.get((i as usize) % ids.len().max(1)) else { break };
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            let m = NewMessage {
                role: role.into(),
                content: json!([{"type": "text", "text": format!("message {i}: the quick brown fox jumps over the lazy dog")}]),
                timestamp: Some(base + i as i64),
                ..Default::default()
            };
            store::append_message(tx, *session, &m)?;
        }
        Ok(n)
    })
}
