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
use crate::store::{
    NewMessage, NewSession, RunStatus, SeedKey, SeedRows, SeedRun, SeedSession, SeedToken, SendPolicyOverride, Stated,
    Store, TokenRow, now_ms, sha256_hex,
};

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
    pub send_policy: Option<SendPolicyOverride>,
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
    /// Idempotency keys to store, as calls would have left them.
    #[serde(default)]
    pub idempotency_keys: Vec<IdempotencyKeySpec>,
}

/// A remembered idempotency key: the caller's key, the tool, the hash of its arguments.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdempotencyKeySpec {
    pub caller: String,
    pub key: String,
    pub tool: String,
    pub args_hash: String,
    pub run_id: Option<String>,
}

/// A run row: its id, session, status (queued | running | ok | …) and what it waits on.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunSpec {
    pub run_id: String,
    pub session_key: String,
    #[serde(default = "default_run_status")]
    pub status: RunStatus,
    pub waiting_on: Option<String>,
    pub owner: Option<String>,
    #[serde(default)]
    pub input: Option<String>,
    /// The session that asked for the run.
    pub requester_key: Option<String>,
    /// When it was created and started (default: now).
    pub created_at: Option<i64>,
}

fn default_run_status() -> RunStatus {
    RunStatus::Running
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
    let store = match crate::cli::open_store(&args.paths.state_dir(), crate::cli::env_store_url().as_deref()) {
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

/// Writes a world spec in one transaction; nothing is written when any part of it is invalid.
pub fn seed_world(store: &Store, world: &WorldSpec) -> anyhow::Result<u64> {
    let sessions = world.sessions.iter().map(seed_session).collect::<anyhow::Result<Vec<_>>>()?;
    let tokens = world.run_tokens.iter().map(seed_token).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
    let runs = world.runs.iter().map(seed_run).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
    let keys =
        world.idempotency_keys.iter().map(seed_key).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
    store.seed(sessions, &SeedRows { tokens, runs, keys })?;
    Ok(world.sessions.len() as u64)
}

/// A spec session as the store seeds it: the row the spec states, its messages stamped with its
/// `updatedAt` unless they carry their own.
fn seed_session(s: &SessionSpec) -> anyhow::Result<SeedSession<Vec<NewMessage>>> {
    let prefix = s.agent_id.as_deref().map(AgentId::parse).transpose()?.unwrap_or_else(AgentId::main);
    let key = canonical_for(&s.key, &prefix).map_err(anyhow::Error::msg)?;
    let agent = key.agent_id(&AgentId::main());
    let chat_type = s.chat_type.as_deref().and_then(ChatType::parse);
    let scope = key_scope(&crate::config::Config::default(), &agent);
    let mut n = NewSession::new(
        key.clone(),
        agent,
        keys::kind_of(&key, &scope, chat_type),
        s.driver.as_deref() == Some("external"),
    );
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
    let messages = s.messages.iter().map(|m| spec_message(m, updated)).collect();
    let stated = Stated { send_policy: s.send_policy, deleted_at: s.deleted_at };
    Ok(SeedSession { stated: Some(stated), ..SeedSession::new(n, messages) })
}

fn seed_token(t: &RunTokenSpec) -> Result<SeedToken, String> {
    let key = canonical(&t.session_key)?;
    let row = TokenRow {
        session_key: key.as_str().to_string(),
        run_id: Some(t.run_id.clone()),
        chain_id: t.chain_id.clone(),
        hop: t.hop,
        sandboxed: t.sandboxed,
    };
    Ok(SeedToken { hash: sha256_hex(&t.token), row, expires_at: t.expires_at })
}

fn seed_run(r: &RunSpec) -> Result<SeedRun, String> {
    Ok(SeedRun {
        run_id: r.run_id.clone(),
        session: canonical(&r.session_key)?,
        status: r.status,
        input: json!({"role": "user", "content": r.input.clone().unwrap_or_default()}),
        waiting_on: r.waiting_on.clone(),
        owner: r.owner.clone(),
        requester: r.requester_key.as_deref().map(canonical).transpose()?,
        created_at: r.created_at,
    })
}

fn seed_key(k: &IdempotencyKeySpec) -> Result<SeedKey, String> {
    Ok(SeedKey {
        caller: canonical(&k.caller)?,
        key: k.key.clone(),
        tool: k.tool.clone(),
        args_hash: k.args_hash.clone(),
        run_id: k.run_id.clone(),
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

/// Generates `n` sessions and `args.messages` messages in one transaction. Message `i` goes to
/// generated session `i mod n`, or to `--into`.
fn generate(store: &Store, n: u64, args: &SeedArgs) -> anyhow::Result<u64> {
    let agent = AgentId::parse(&args.agent)?;
    let parent = args.spawned_by.as_deref().map(canonical).transpose().map_err(anyhow::Error::msg)?;
    let into = args.into.as_deref().map(canonical).transpose().map_err(anyhow::Error::msg)?;
    let scope = key_scope(&crate::config::Config::default(), &agent);
    let base = now_ms() - (n as i64) * 1000;
    let message = move |i: u64| NewMessage {
        role: if i.is_multiple_of(2) { "user" } else { "assistant" }.into(),
        content: json!([{"type": "text", "text": format!("message {i}: the quick brown fox jumps over the lazy dog")}]),
        timestamp: Some(base + i as i64),
        ..Default::default()
    };
    let spread = if into.is_some() { 0 } else { args.messages };
    let generated = (0..n).map(|i| {
        let key = match &parent {
            Some(_) => SessionKey::for_agent(&agent, &format!("subagent:{}", uuid::Uuid::new_v4())),
            None => SessionKey::for_agent(&agent, &format!("seed:{i}")),
        };
        let mut s = NewSession::new(key.clone(), agent.clone(), keys::kind_of(&key, &scope, None), false);
        s.spawned_by = parent.clone();
        s.spawn_depth = i64::from(parent.is_some());
        s.created_at = base + i as i64 * 1000;
        s.updated_at = s.created_at;
        SeedSession::new(s, (i..spread).step_by(n as usize).map(message))
    });
    let into = into.map(|key| {
        let s = NewSession::new(key.clone(), key.agent_id(&agent), keys::kind_of(&key, &scope, None), false);
        // Every message, as a transcript of the same type as the generated sessions' (one chain).
        SeedSession::new(s, (0..args.messages).step_by(1).map(message))
    });
    store.seed(generated.chain(into), &SeedRows::default())?;
    Ok(n)
}
