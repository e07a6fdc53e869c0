//! The run queue in the store: enqueue (durable before anyone is told `accepted`), claim under
//! the per-session FIFO and the concurrency caps in one `BEGIN IMMEDIATE` transaction, finish
//! (transcript, usage and status together), and recover runs whose owner died.

use std::collections::HashMap;

use super::sql::{AfterPipeline, Dialect, Optional, Row, Sql, Statement, args};
use serde_json::Value;

use super::live_usage::Spend;
use super::text_enum::text_enum;
use super::{NewMessage, Result, Store, now_ms};
use crate::keys::{AgentId, SessionKey};

/// Where a run is: waiting, running, or one of the six ways it ends. Stored as its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Queued,
    Running,
    Ok,
    Error,
    Timeout,
    Cancelled,
    /// The server stopped (or its owner died) before the run finished.
    Interrupted,
    /// Stopped because its budget (or an ancestor's it shares) was spent.
    #[serde(rename = "budget_exceeded")]
    BudgetExceeded,
}

text_enum!(RunStatus {
    Queued => "queued", Running => "running", Ok => "ok", Error => "error", Timeout => "timeout",
    Cancelled => "cancelled", Interrupted => "interrupted", BudgetExceeded => "budget_exceeded",
});

impl RunStatus {
    /// Queued and running runs have not ended.
    pub fn is_finished(self) -> bool {
        !matches!(self, Self::Queued | Self::Running)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long an owner's lease lasts without renewal (it renews every few seconds): on a shared
/// database, a run whose owner's lease passed is its dead node's, and another node interrupts
/// it ([`Store::interrupt_orphans`]).
pub const LEASE_MS: i64 = 15_000;

/// Who runs a run: one runtime owner, a process of a node. `<node>:<pid>:<nonce>`, the node
/// being one state directory (a machine's, with a shared database), so that a node's next owner
/// knows its predecessor's runs from another node's, and an operator reads where a run ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOwner {
    id: String,
    node_len: usize,
}

impl RunOwner {
    /// A new owner on `node` (letters, digits, `.` and `-` only: it is matched with `LIKE`).
    pub fn new(node: &str) -> RunOwner {
        assert!(node.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'), "node id {node:?}");
        let nonce = &uuid::Uuid::new_v4().simple().to_string()[..8];
        RunOwner { id: format!("{node}:{}:{nonce}", std::process::id()), node_len: node.len() }
    }

    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The node this owner is a process of.
    pub fn node(&self) -> &str {
        &self.id[..self.node_len]
    }
}

impl std::fmt::Display for RunOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

/// Whose result an announce run announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnnounceKind {
    /// A spawned child's result, to its requester.
    Subagent,
    /// The end of a send's exchange between two sessions.
    AgentToAgent,
}

text_enum!(AnnounceKind { Subagent => "subagent", AgentToAgent => "agent_to_agent" });

/// Why a run exists (the request's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    Send,
    Reply,
    Announce,
    Spawn,
    Completion,
    Inject,
    /// A steer that the child's running turn could not take: the child's next turn.
    Steer,
    /// A question or approval of a sub-agent, put to its driven parent.
    Ask,
}

text_enum!(RunMode {
    Send => "send", Reply => "reply", Announce => "announce", Spawn => "spawn", Completion => "completion",
    Inject => "inject", Steer => "steer", Ask => "ask",
});

/// A run to enqueue.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_id: String,
    pub session: i64,
    pub mode: RunMode,
    /// The input message (`{role, content}`), appended to the transcript when the run starts.
    pub input: Value,
    pub provenance: Option<Value>,
    pub requester_key: Option<SessionKey>,
    pub chain_id: Option<String>,
    pub hop: i64,
    pub announce_kind: Option<AnnounceKind>,
    pub model: Option<String>,
    pub thinking: Option<String>,
    pub timeout_ms: Option<i64>,
    /// Flow state (e.g. the ping-pong turn), opaque to the store.
    pub extra: Option<Value>,
}

impl NewRun {
    /// A run with this input and nothing else set (no requester, chain, model or flow state).
    pub fn new(run_id: String, session: i64, mode: RunMode, input: Value) -> Self {
        NewRun {
            run_id,
            session,
            mode,
            input,
            provenance: None,
            requester_key: None,
            chain_id: None,
            hop: 0,
            announce_kind: None,
            model: None,
            thinking: None,
            timeout_ms: None,
            extra: None,
        }
    }
}

/// A stored run, as waiters and flows read it.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub run_id: String,
    pub session: i64,
    pub session_key: SessionKey,
    pub agent_id: AgentId,
    pub mode: RunMode,
    pub status: RunStatus,
    pub input: Value,
    pub provenance: Option<Value>,
    pub requester_key: Option<SessionKey>,
    pub chain_id: Option<String>,
    pub hop: i64,
    pub announce_kind: Option<AnnounceKind>,
    pub model: Option<String>,
    pub thinking: Option<String>,
    pub timeout_ms: Option<i64>,
    pub reply: Option<String>,
    pub error: Option<String>,
    pub extra: Option<Value>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    /// The A2A task a run of a remote agent started (docs/A2A.md).
    pub remote_task_id: Option<String>,
}

impl RunRow {
    pub fn is_finished(&self) -> bool {
        self.status.is_finished()
    }

    /// A run of session 1 (`agent:main:main`) that was created at 0 and has not started, for
    /// unit tests that need a row without a store; set other fields by struct update.
    #[cfg(test)]
    pub fn for_test(run_id: &str, mode: RunMode, status: RunStatus) -> RunRow {
        RunRow {
            run_id: run_id.into(),
            session: 1,
            session_key: SessionKey::from_canonical("agent:main:main"),
            agent_id: AgentId::main(),
            mode,
            status,
            input: Value::Null,
            provenance: None,
            requester_key: None,
            chain_id: None,
            hop: 0,
            announce_kind: None,
            model: None,
            thinking: None,
            timeout_ms: None,
            reply: None,
            error: None,
            extra: None,
            created_at: 0,
            started_at: None,
            ended_at: None,
            remote_task_id: None,
        }
    }
}

pub(super) const RUN_COLUMNS: &str = "r.run_id, r.session, s.key, s.agent_id, r.mode, r.status, r.input, r.provenance, \
    r.requester_key, r.chain_id, r.hop, r.announce_kind, r.model, r.thinking, r.timeout_ms, r.reply, r.error, \
    r.extra, r.created_at, r.started_at, r.ended_at, r.remote_task_id";

/// How many columns [`RUN_COLUMNS`] has: a row that holds several runs side by side holds the
/// next one this many columns on.
pub(super) const RUN_WIDTH: usize = 22;

/// [`RUN_COLUMNS`] with the run's table as `run` and its session's as `session` (a read that
/// joins several runs).
pub(super) fn run_columns(run: &str, session: &str) -> String {
    let column = |c: &str| match c.split_once('.') {
        Some(("s", name)) => format!("{session}.{name}"),
        Some((_, name)) => format!("{run}.{name}"),
        None => c.to_string(),
    };
    RUN_COLUMNS.split(", ").map(column).collect::<Vec<_>>().join(", ")
}

pub(super) fn run_from_row(r: &Row) -> Result<RunRow> {
    run_at(r, 0)
}

/// The run whose [`RUN_COLUMNS`] start at column `at`.
pub(super) fn run_at(r: &Row, at: usize) -> Result<RunRow> {
    let json = |i: usize| -> Result<Option<Value>> {
        Ok(r.get::<Option<String>>(at + i)?.and_then(|s| serde_json::from_str(&s).ok()))
    };
    let text = |i: usize| r.get::<String>(at + i);
    Ok(RunRow {
        run_id: text(0)?,
        session: r.get(at + 1)?,
        session_key: SessionKey::from_canonical(text(2)?),
        agent_id: AgentId::parse(&text(3)?).unwrap_or_else(|_| AgentId::main()),
        mode: RunMode::parse(&text(4)?).unwrap_or(RunMode::Send),
        status: {
            let raw = text(5)?;
            RunStatus::parse(&raw).ok_or_else(|| {
                rusqlite::Error::FromSqlConversionFailure(
                    at + 5,
                    rusqlite::types::Type::Text,
                    format!("run status {raw:?}").into(),
                )
            })?
        },
        input: json(6)?.unwrap_or(Value::Null),
        provenance: json(7)?,
        requester_key: r.get::<Option<String>>(at + 8)?.map(SessionKey::from_canonical),
        chain_id: r.get(at + 9)?,
        hop: r.get(at + 10)?,
        announce_kind: r.get::<Option<String>>(at + 11)?.as_deref().and_then(AnnounceKind::parse),
        model: r.get(at + 12)?,
        thinking: r.get(at + 13)?,
        timeout_ms: r.get(at + 14)?,
        reply: r.get(at + 15)?,
        error: r.get(at + 16)?,
        extra: json(17)?,
        created_at: r.get(at + 18)?,
        started_at: r.get(at + 19)?,
        ended_at: r.get(at + 20)?,
        remote_task_id: r.get(at + 21)?,
    })
}

/// The caps a claim respects.
#[derive(Debug, Clone)]
pub struct Caps {
    /// Running runs server-wide (runtime.maxConcurrentRuns).
    pub global: u32,
    /// Running runs per agent (runner.maxConcurrent); agents not named use `default_agent`.
    pub per_agent: HashMap<String, u32>,
    pub default_agent: u32,
    /// Running child (spawn) runs server-wide (agents.defaults.subagents.maxConcurrent).
    pub spawns: u32,
}

/// How a run ended, as the runtime records it.
#[derive(Debug, Clone)]
pub struct Finished {
    pub status: RunStatus,
    pub reply: Option<String>,
    pub messages: Vec<NewMessage>,
    pub usage: Option<Value>,
    pub cost: Option<f64>,
    pub model: Option<String>,
    pub error: Option<String>,
    pub exit_status: Option<i32>,
    /// The agent's own session id; kept on the session only when the run succeeded (after a
    /// failed or aborted run the next one replays the transcript).
    pub external_session_id: Option<String>,
    /// The usage totals of that CLI session after this run, for CLIs that report running totals;
    /// kept, like the id, only when the run succeeded.
    pub cli_usage_total: Option<Value>,
}

impl Finished {
    /// A run that ended as `status` before it produced anything, for `error`.
    pub fn without_output(status: RunStatus, error: String) -> Finished {
        Finished {
            status,
            reply: None,
            messages: vec![],
            usage: None,
            cost: None,
            model: None,
            error: Some(error),
            exit_status: None,
            external_session_id: None,
            cli_usage_total: None,
        }
    }
}

/// Queues a run, once: a flow step that is taken again after a crash derives the same run id
/// (`flows::step_id`) and adds nothing. Returns false when the run was already there.
/// Queued runs of messages a channel's bridge posted (`sourceTool` `channel_bridge` in their
/// provenance, as `engine::chain` writes it), over all the channel's sessions.
/// Holds the channel's queue-bound key ([`lock_queue_bound`]) from here to the commit.
pub(super) fn queued_channel_runs(tx: &dyn Sql, channel: &str) -> Result<i64> {
    lock_queue_bound(tx, &format!("channel:{channel}"))?;
    queued_inject_runs(tx, "channel_bridge", "sourceChannel", channel)
}

/// Queued runs of one A2A peer's messages (`sourceTool` `a2a`, `senderId` the peer's key), over
/// all its contexts.
/// Holds the peer's queue-bound key ([`lock_queue_bound`]) from here to the commit.
pub(super) fn queued_peer_runs(tx: &dyn Sql, peer: &str) -> Result<i64> {
    lock_queue_bound(tx, &format!("a2a:{peer}"))?;
    queued_inject_runs(tx, "a2a", "senderId", peer)
}

/// The advisory lock space of the exact queue bounds on PostgreSQL (`"smcq"`): a channel's
/// bridge (`maxQueuedRuns`) and an A2A peer (`server.a2a.maxQueuedRuns`). A message that counts
/// its source's queued runs and queues one holds the source's key (FNV-1a of its name, as the
/// caps' keys) from before it counts to its commit, so two nodes never both queue the last one.
/// Only those messages take these keys, after their message id and before any session row, so
/// no lock cycle forms with the other writers (a claim only lowers the count).
const QUEUE_LOCKS: i32 = 0x736d_6371;

fn lock_queue_bound(tx: &dyn Sql, name: &str) -> Result<()> {
    if tx.dialect() == super::sql::Dialect::Postgres {
        let sql = "SELECT 1 FROM (SELECT pg_advisory_xact_lock(?1, ?2)) AS taken"; // a void column is not read
        tx.query_map(sql, args![QUEUE_LOCKS, cap_key(name)], |_| Ok(()))?;
    }
    Ok(())
}

/// Queued `inject` runs whose provenance names `tool` and has `field` = `value`.
fn queued_inject_runs(tx: &dyn Sql, tool: &str, field: &str, value: &str) -> Result<i64> {
    let (source_tool, source) =
        (tx.dialect().json_text("provenance", "sourceTool"), tx.dialect().json_text("provenance", field));
    tx.query_row(
        &format!("SELECT count(*) FROM runs WHERE status = 'queued' AND mode = 'inject' AND {source_tool} = ?1 AND {source} = ?2"),
        args![tool, value],
        |r| r.get(0),
    )
}

pub(super) fn enqueue(tx: &dyn Sql, run: &NewRun) -> Result<bool> {
    let json = |v: &Option<Value>| v.as_ref().map(Value::to_string);
    let added = tx.execute(
        "INSERT INTO runs (run_id, session, mode, status, input, provenance, requester_key, chain_id, hop,
                 announce_kind, model, thinking, timeout_ms, extra, created_at)
             VALUES (?1, ?2, ?3, 'queued', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
             ON CONFLICT (run_id) DO NOTHING",
        args![
            run.run_id,
            run.session,
            run.mode.as_str(),
            run.input.to_string(),
            json(&run.provenance),
            run.requester_key.as_ref().map(SessionKey::as_str),
            run.chain_id,
            run.hop,
            run.announce_kind.map(AnnounceKind::as_str),
            run.model,
            run.thinking,
            run.timeout_ms,
            json(&run.extra),
            now_ms(),
        ],
    )?;
    Ok(added == 1)
}

/// Why `interrupt_orphans` ended a run of `dead` (its owner column), as its error says.
fn interrupted_why(of_node: bool, dead: Option<&str>) -> String {
    match (of_node, dead.and_then(|d| d.split(':').next())) {
        (false, Some(node)) => format!("interrupted: its node {node} stopped renewing its lease; it was not re-run"),
        _ => "interrupted: the process running it died; it was not re-run".into(),
    }
}

/// A run [`Store::interrupt_orphans`] ended, and whether it ran on the caller's node (what is
/// left of its processes, if anything, is on this machine).
#[derive(Debug)]
pub struct Orphan {
    pub run: RunRow,
    pub of_node: bool,
    /// A run of a remote agent whose task was started: not interrupted but taken over by the
    /// caller, still running, to follow its task from this input seq on.
    pub resumed: Option<i64>,
}

/// The transcript message a claimed run's input becomes, dated `now`.
fn claimed_input(run: &RunRow, now: i64) -> NewMessage {
    NewMessage {
        role: run.input.get("role").and_then(Value::as_str).unwrap_or("user").to_string(),
        content: run.input.get("content").cloned().unwrap_or(Value::Null),
        timestamp: Some(now),
        run_id: Some(run.run_id.clone()),
        provenance: run.provenance.clone(),
        chain_id: run.chain_id.clone(),
        ..Default::default()
    }
}

pub(super) fn run_by_id(c: &dyn Sql, run_id: &str) -> Result<Option<RunRow>> {
    let read = run_by_id_statement(run_id);
    c.query_row(read.sql(), &read.args(), run_from_row).optional()
}

/// The read of `run_id`'s row, as [`run_from_row`] maps it.
fn run_by_id_statement(run_id: &str) -> Statement {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session WHERE r.run_id = ?1");
    Statement::new(sql, args![run_id])
}

/// The queued (not started) runs of `session` in `mode`, oldest first.
pub(super) fn queued_runs(c: &dyn Sql, session: i64, mode: RunMode) -> Result<Vec<RunRow>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
         WHERE r.session = ?1 AND r.mode = ?2 AND r.status = 'queued' ORDER BY r.created_at, r.{}",
        c.dialect().runs_order()
    );
    c.query_map(&sql, args![session, mode.as_str()], run_from_row)
}

/// Replaces the input of a run that has not started; false when it has (its input is in its
/// transcript already).
pub(super) fn set_queued_input(tx: &dyn Sql, run_id: &str, input: &Value) -> Result<bool> {
    let changed = tx.execute(
        "UPDATE runs SET input = ?2 WHERE run_id = ?1 AND status = 'queued'",
        args![run_id, input.to_string()],
    )?;
    Ok(changed == 1)
}

/// The queued runs that may start now, oldest first: for each, no other run of its session
/// running, its agent and the server under their caps (counting the ones taken before it here).
fn ready_to_claim(tx: &dyn Sql, owner: &str, caps: &Caps, shared: bool) -> Result<Vec<RunRow>> {
    let mut busy = Busy::read(tx, owner, shared)?;
    if busy.total >= i64::from(caps.global) {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
         WHERE r.status = 'queued'
           AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.session = r.session AND x.status = 'running')
         ORDER BY r.created_at, r.{} LIMIT 256",
        tx.dialect().runs_order()
    );
    let candidates: Vec<RunRow> = tx.query_map(&sql, args![], run_from_row)?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    busy.count_spawns(tx)?;
    Ok(busy.admit(candidates, caps))
}

/// What runs now, as the caps count it.
struct Busy {
    /// Running runs per agent (over every node).
    per_agent: HashMap<String, i64>,
    /// Running runs the global cap counts: the owner's on a shared database, all of them alone.
    total: i64,
    /// Running spawn runs (over every node).
    spawns: i64,
}

impl Busy {
    /// The running counts but the spawns' (read only when there is a candidate to admit).
    fn read(tx: &dyn Sql, owner: &str, shared: bool) -> Result<Busy> {
        let per_agent: HashMap<String, i64> = tx
            .query_map(
                "SELECT s.agent_id, count(*) FROM runs r JOIN sessions s ON s.id = r.session
                 WHERE r.status = 'running' GROUP BY s.agent_id",
                args![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .into_iter()
            .collect();
        let total = match shared {
            true => {
                tx.query_row("SELECT count(*) FROM runs WHERE status = 'running' AND owner = ?1", args![owner], |r| {
                    r.get(0)
                })?
            }
            false => per_agent.values().sum(),
        };
        Ok(Busy { per_agent, total, spawns: 0 })
    }

    /// Counts the running spawn runs (over every node).
    fn count_spawns(&mut self, tx: &dyn Sql) -> Result<()> {
        self.spawns =
            tx.query_row("SELECT count(*) FROM runs WHERE status = 'running' AND mode = 'spawn'", args![], |r| {
                r.get(0)
            })?;
        Ok(())
    }

    /// The `candidates` (oldest first) that fit under the caps, each counted as it is taken;
    /// only the oldest of a session.
    fn admit(mut self, candidates: Vec<RunRow>, caps: &Caps) -> Vec<RunRow> {
        let mut seen_sessions = std::collections::HashSet::new();
        let mut ready = Vec::new();
        for run in candidates {
            if self.total >= i64::from(caps.global) {
                break;
            }
            // FIFO per session: only the oldest queued run of a session is a candidate.
            if !seen_sessions.insert(run.session) {
                continue;
            }
            let agent = run.agent_id.as_str();
            let cap = caps.per_agent.get(agent).copied().unwrap_or(caps.default_agent);
            let busy = self.per_agent.get(agent).copied().unwrap_or(0);
            let spawn = run.mode == RunMode::Spawn;
            if busy >= i64::from(cap) || (spawn && self.spawns >= i64::from(caps.spawns)) {
                continue;
            }
            *self.per_agent.entry(agent.to_string()).or_default() += 1;
            self.total += 1;
            self.spawns += i64::from(spawn);
            ready.push(run);
        }
        ready
    }
}

/// The advisory lock space of the caps' counts on PostgreSQL (`"smcc"`): a claim holds the key
/// of each cap it may take a slot of (an agent's, the spawns') while it counts and claims, so
/// that two nodes never both take a cap's last slot. Keys are taken in ascending order (no two
/// claims wait on each other in a cycle); a hash collision only makes two caps share a key.
const CAP_LOCKS: i32 = 0x736d_6363;

/// Locks, on a shared database, what a spawn's admission decides on: its requester's session
/// row (its unfinished children, what `maxChildrenPerAgent` counts), then the spawns' cap key
/// (every spawn run queued or running, what `maxQueued` counts: a claim of a spawn run holds it
/// too). Its order against the claim's: the claim never waits on a session row (`SKIP LOCKED`)
/// and takes the cap key last, so no cycle forms. SQLite has one writer: nothing to do.
pub(super) fn lock_spawn_admission(tx: &dyn Sql, requester: &str) -> Result<()> {
    if tx.dialect() == super::sql::Dialect::Postgres {
        tx.query_map("SELECT id FROM sessions WHERE key = ?1 FOR UPDATE", args![requester], |_| Ok(()))?;
        let sql = "SELECT 1 FROM (SELECT pg_advisory_xact_lock(?1, ?2)) AS taken"; // a void column is not read
        tx.query_map(sql, args![CAP_LOCKS, cap_key("spawns")], |_| Ok(()))?;
    }
    Ok(())
}

/// The key of a cap in [`CAP_LOCKS`]: FNV-1a of its name, as PostgreSQL's `int4`.
fn cap_key(name: &str) -> i32 {
    let hash = name.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    hash as i32
}

/// The claim on a shared database, without the global write lock ([`Store::claim_ready`]):
/// `sessions` are those the caller's read found a run to start in.
///
/// Per-session FIFO with one running run rests on the session row: the claim locks the rows of
/// `sessions` it can (`FOR UPDATE SKIP LOCKED`: a session another writer holds is left for the
/// next claim) and only then reads, in a new statement (`READ COMMITTED`: a fresh snapshot,
/// after any claim that held the row committed), the oldest queued run of each with none
/// running. Every other writer that decides on a session's queued or running runs locks its
/// session row first ([`lock_session`]); every writer of its transcript does too (`next_seq`).
/// The caps rest on [`CAP_LOCKS`], taken before they are counted. The claim never waits on a
/// row lock (it skips) and the locked writers never wait on a cap lock: no cycle with them.
fn claim_locking_rows(tx: &dyn Sql, owner: &str, caps: &Caps, sessions: &[i64]) -> Result<Vec<(RunRow, i64)>> {
    let ids = |ids: &[i64]| ids.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    let locked: Vec<i64> = tx.query_map(
        &format!("SELECT id FROM sessions WHERE id IN ({}) ORDER BY id FOR UPDATE SKIP LOCKED", ids(sessions)),
        args![],
        |r| r.get(0),
    )?;
    if locked.is_empty() {
        return Ok(Vec::new());
    }
    let order = tx.dialect().runs_order();
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
         WHERE r.run_id IN (SELECT DISTINCT ON (q.session) q.run_id FROM runs q
                            WHERE q.session IN ({}) AND q.status = 'queued'
                              AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.session = q.session AND x.status = 'running')
                            ORDER BY q.session, q.created_at, q.{order})
         ORDER BY r.created_at, r.{order}",
        ids(&locked)
    );
    let candidates: Vec<RunRow> = tx.query_map(&sql, args![], run_from_row)?;
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let mut keys: Vec<i32> = candidates.iter().map(|r| cap_key(&format!("agent:{}", r.agent_id.as_str()))).collect();
    if candidates.iter().any(|r| r.mode == RunMode::Spawn) {
        keys.push(cap_key("spawns"));
    }
    keys.sort_unstable();
    keys.dedup();
    // One statement: its target list is evaluated left to right, so the keys are taken in order.
    let take = keys.iter().map(|k| format!("pg_advisory_xact_lock({CAP_LOCKS}, {k})")).collect::<Vec<_>>();
    tx.execute(&format!("SELECT {}", take.join(", ")), args![])?;
    let mut busy = Busy::read(tx, owner, true)?;
    busy.count_spawns(tx)?;
    claim_in_two_flights(tx, &busy.admit(candidates, caps), owner, true)
}

/// Claims every run of `ready` (each in a session of its own, its row locked) for `owner`, in
/// two round trips on PostgreSQL whatever their number: the owner's lease renewed when `renew`
/// (on a shared database a claimed run always has its owner's lease behind it) and each input's
/// seq taken, then every input appended to its transcript, run moved to `running` and read
/// back. Answers each claimed row with its input's seq. The claim's cap keys are held to its commit, so on a database at a
/// network distance this is what keeps them short (one round trip per statement made a claim
/// of eight runs hold them for ≈ 40 round trips).
fn claim_in_two_flights(tx: &dyn Sql, ready: &[RunRow], owner: &str, renew: bool) -> Result<Vec<(RunRow, i64)>> {
    if ready.is_empty() {
        return Ok(Vec::new());
    }
    let now = now_ms();
    let mut first: Vec<Statement> = renew.then(|| lease_statement(tx.dialect(), owner)).into_iter().collect();
    let leased = first.len();
    for run in ready {
        let take = super::messages::take_seqs(tx.dialect(), run.session, 1, now);
        first.push(Statement::new(format!("{} RETURNING next_seq - 1", take.sql()), &take.args()));
    }
    let answers = tx.pipeline(&first, AfterPipeline::Open)?;
    let seqs: Vec<i64> = answers[leased..]
        .iter()
        .map(|a| a.rows.first().ok_or(super::StoreError::NoRow)?.get(0))
        .collect::<Result<_>>()?;
    let mut second = Vec::with_capacity(ready.len() * 3);
    for (run, seq) in ready.iter().zip(&seqs) {
        second.push(super::messages::insert_message(run.session, *seq, &claimed_input(run, now), now));
        second.push(Statement::new(
            "UPDATE runs SET status = 'running', owner = ?2, started_at = ?3, input_seq = ?4 WHERE run_id = ?1",
            args![run.run_id, owner, now, seq],
        ));
        second.push(run_by_id_statement(&run.run_id));
    }
    let answers = tx.pipeline(&second, AfterPipeline::Open)?;
    answers
        .chunks(3)
        .zip(seqs)
        .map(|(answered, seq)| {
            let row = answered[2].rows.first().ok_or(super::StoreError::NoRow)?;
            Ok((run_from_row(row)?, seq))
        })
        .collect()
}

/// Locks `session`'s row for the rest of a write transaction, on a shared database: the claim
/// ([`claim_locking_rows`]) holds no global lock, so a writer that decides on the session's
/// queued or running runs (what runs, what is queued, a queued run's input) holds the row
/// first, and then reads what it decides on. Alone on SQLite's one writer, nothing to do.
pub(super) fn lock_session(tx: &dyn Sql, session: i64) -> Result<()> {
    if tx.dialect() == super::sql::Dialect::Postgres {
        tx.query_map("SELECT id FROM sessions WHERE id = ?1 FOR UPDATE", args![session], |_| Ok(()))?;
    }
    Ok(())
}

/// Locks the rows of `sessions`, as [`lock_session`] does, in one statement and in the one order
/// every writer of several sessions takes them: root to leaf (`spawn_depth`, then id), as the
/// budget accounts are (`budgets::lock_chains`). Two such writers (a subtree cancel, an ask
/// closed in its child and its answering ancestor) then never wait on each other in a cycle.
pub(super) fn lock_sessions(tx: &dyn Sql, sessions: &[i64]) -> Result<()> {
    if tx.dialect() == super::sql::Dialect::Postgres && !sessions.is_empty() {
        let ids = sessions.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        tx.query_map(
            &format!("SELECT id FROM sessions WHERE id IN ({ids}) ORDER BY spawn_depth, id FOR UPDATE"),
            args![],
            |_| Ok(()),
        )?;
    }
    Ok(())
}

/// Locks the row of `run_id`'s session, as [`lock_session`] does, for a writer that knows the
/// run but not its session (a run's end, its live reports): one statement.
pub(super) fn lock_session_of_run(tx: &dyn Sql, run_id: &str) -> Result<()> {
    if tx.dialect() == super::sql::Dialect::Postgres {
        tx.query_map(
            "SELECT id FROM sessions WHERE id = (SELECT session FROM runs WHERE run_id = ?1) FOR UPDATE",
            args![run_id],
            |_| Ok(()),
        )?;
    }
    Ok(())
}

/// Extends `owner`'s lease to [`LEASE_MS`] from now (the database's clock: every node's leases
/// are read against it).
fn renew_lease(tx: &dyn Sql, owner: &str) -> Result<()> {
    let lease = lease_statement(tx.dialect(), owner);
    tx.execute(lease.sql(), &lease.args())?;
    Ok(())
}

/// The renewal of `owner`'s lease ([`LEASE_MS`] from now, on the database's clock).
fn lease_statement(d: Dialect, owner: &str) -> Statement {
    let sql = format!(
        "INSERT INTO node_leases (owner, lease_until) VALUES (?1, {} + ?2)
         ON CONFLICT (owner) DO UPDATE SET lease_until = excluded.lease_until",
        d.clock_ms()
    );
    Statement::new(sql, args![owner, LEASE_MS])
}

/// What a run's end reads before it writes (`Store::finish_run`): read in one flight, its rows
/// locked in the one order of every row-locked writer (session row, run row, the budget
/// accounts root to leaf), so that the writes can follow in one more.
struct RunEnding {
    session: i64,
    /// The session's next seq: the run's messages take the ones from it up (its row is locked).
    next_seq: i64,
    status: String,
    owner: Option<String>,
    /// The usage recorded live on the run's row, and what of it its session was credited.
    live_usage: Option<Value>,
    live: Spend,
    /// What it draws on budget accounts, if anything.
    draw: Option<super::budgets::LiveDraw>,
}

impl RunEnding {
    fn read(tx: &dyn Sql, run_id: &str, now: i64) -> Result<RunEnding> {
        let d = tx.dialect();
        let mut reads = vec![
            Statement::new(
                format!(
                    "SELECT id, next_seq FROM sessions WHERE id = (SELECT session FROM runs WHERE run_id = ?1){}",
                    d.for_update("")
                ),
                args![run_id],
            ),
            Statement::new(
                format!("SELECT status, owner, usage, cost FROM runs WHERE run_id = ?1{}", d.for_update("")),
                args![run_id],
            ),
        ];
        reads.extend(super::budgets::lock_accounts_of_run_statement(d, run_id));
        reads.push(super::budgets::LiveDraw::read(run_id, now));
        let answers = tx.pipeline(&reads, AfterPipeline::Open)?;
        let (session, run) = match (answers[0].rows.first(), answers[1].rows.first()) {
            (Some(session), Some(run)) => (session, run),
            _ => return Err(super::StoreError::NoRow),
        };
        let (live_usage, live) = super::live_usage::of_run_row(run.get(2)?, run.get(3)?);
        Ok(RunEnding {
            session: session.get(0)?,
            next_seq: session.get(1)?,
            status: run.get(0)?,
            owner: run.get(1)?,
            live_usage,
            live,
            draw: super::budgets::LiveDraw::of(answers.last())?,
        })
    }

    /// Every write of the run's end `f`, in the order they run: its messages, its row, its
    /// budget settle, its session's totals and state, its token's end.
    fn writes(&self, d: Dialect, run_id: &str, f: &Finished, now: i64) -> Vec<Statement> {
        let session = self.session;
        let mut writes = Vec::with_capacity(f.messages.len() + 8);
        if !f.messages.is_empty() {
            let dated: Vec<i64> = f.messages.iter().map(|m| m.timestamp.unwrap_or(now)).collect();
            let latest = dated.iter().copied().max().unwrap_or(now);
            writes.push(super::messages::take_seqs(d, session, f.messages.len(), latest));
            for (i, (m, at)) in f.messages.iter().zip(dated).enumerate() {
                writes.push(super::messages::insert_message(session, self.next_seq + i as i64, m, at));
            }
        }
        // What the run reported live is already on its row and its session: the run settles
        // at the larger of that and its last report, and the session gets what is left.
        let reported = f.usage.as_ref().map(|u| Spend::of(Some(u), f.cost));
        let settled = reported.map(|r| r.max(self.live));
        let usage = match (settled, &f.usage) {
            (Some(s), final_usage) => Some(s.written_into(final_usage.as_ref())),
            (None, _) => self.live_usage.clone(),
        };
        let cost = settled.map_or(self.live.cost, |s| s.cost);
        writes.push(Statement::new(
            "UPDATE runs SET status = ?2, reply = ?3, usage = ?4, cost = ?5, model = coalesce(?6, model),
                 error = ?7, exit_status = ?8, ended_at = ?9
             WHERE run_id = ?1",
            args![
                run_id,
                f.status.as_str(),
                f.reply,
                usage.as_ref().map(Value::to_string),
                cost,
                f.model,
                f.error,
                f.exit_status,
                now
            ],
        ));
        if let Some(draw) = &self.draw {
            let final_usage = settled.map(|s| (s.tokens(), s.cost.map_or(0, crate::policy::budget::micros)));
            writes.extend(draw.settling(d, run_id, final_usage));
        }
        writes.push(super::live_usage::credit_statement(d, session, self.live, settled.unwrap_or(self.live)));
        writes.push(Statement::new(
            format!(
                "UPDATE sessions SET model = coalesce(?2, model), aborted_last_run = ?3, updated_at = {}(updated_at, ?4),
                 external_session_id = ?5, cli_usage_total = ?6
             WHERE id = ?1",
                d.greatest()
            ),
            args![
                session,
                f.model,
                f.status != RunStatus::Ok,
                now,
                f.external_session_id.as_deref().filter(|_| f.status == RunStatus::Ok),
                f.cli_usage_total.as_ref().filter(|_| f.status == RunStatus::Ok).map(Value::to_string)
            ],
        ));
        // The run's token ends with the run: by now every process of the run is gone (the
        // supervisor, or the server when the supervisor died, ended the tree), so nothing
        // legitimate can present it again; an escaper that copied it gets no grace.
        writes.push(Statement::new(
            "UPDATE tokens SET expires_at = ?2 WHERE run_id = ?1 AND kind = 'run'",
            args![run_id, now],
        ));
        writes
    }
}

impl Store {
    pub fn run(&self, run_id: &str) -> Result<Option<RunRow>> {
        self.read(|c| run_by_id(c, run_id))
    }

    /// Claims, in one transaction, the queued runs that may start now, oldest first: for each,
    /// no other run of its session running, its agent and the server under their caps (counting
    /// the ones claimed before it here). Each input is appended to its transcript now. One
    /// commit for a burst of runs, not one each (BENCHMARKS.md, fan-out).
    ///
    /// On a shared database the global cap is the node's (`runtime.maxConcurrentRuns` bounds what
    /// one machine runs: counted over this owner's runs), while the per-agent and spawn caps are
    /// the cluster's (counted over every node's): an agent's limit is about the agent, not about
    /// where it runs.
    ///
    /// On a shared database the claim is looked for in a read first: a claim that would find
    /// nothing (a wake with no work, or the caps full) is a read, not a write transaction.
    pub fn claim_ready(&self, owner: &str, caps: &Caps) -> Result<Vec<(RunRow, i64)>> {
        if self.is_shared() {
            let mut sessions: Vec<i64> =
                self.read(|c| ready_to_claim(c, owner, caps, true))?.iter().map(|r| r.session).collect();
            if sessions.is_empty() {
                return Ok(Vec::new());
            }
            sessions.sort_unstable();
            sessions.dedup();
            let claim = |tx: &dyn Sql| claim_locking_rows(tx, owner, caps, &sessions);
            return self.write_sql_row_locked(super::Survives::PowerLoss, true, claim);
        }
        self.write_sql(|tx| -> Result<Vec<(RunRow, i64)>> {
            let ready = ready_to_claim(tx, owner, caps, false)?;
            // Alone on its store, the owner renews no lease.
            claim_in_two_flights(tx, &ready, owner, false)
        })
    }

    /// Records the end of a run: its messages, status, usage and the session's totals, at once;
    /// only while it is `running` under `owner`, the process (node and epoch) that claimed it.
    ///
    /// On a shared database it holds no global lock: it locks the run's session row, then the
    /// run's row (an interrupting sweep locks the run's row before it ends it, so one of the two
    /// ends stands, never both), then the budget accounts it settles, root to leaf. On
    /// PostgreSQL that is two round trips in all ([`RunEnding`]): the reads with the `BEGIN`,
    /// then the writes with the `COMMIT` (a run drawing on budgets checks for a crossing before
    /// its commit).
    pub fn finish_run(&self, run_id: &str, owner: &str, f: &Finished) -> Result<()> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            let now = now_ms();
            let ending = RunEnding::read(tx, run_id, now)?;
            // Another node interrupted it (its lease passed while this one ran it), or this
            // node's next owner did: that end stands and its steps are theirs to take.
            if ending.status != RunStatus::Running.as_str() || ending.owner.as_deref() != Some(owner) {
                return Err(super::StoreError::NotRunning { run_id: run_id.to_string(), status: ending.status });
            }
            let writes = ending.writes(tx.dialect(), run_id, f, now);
            match ending.draw {
                // One flight: the writes and the commit, which lets the row locks go.
                None => tx.pipeline(&writes, AfterPipeline::Commit).map(drop),
                Some(draw) => {
                    tx.pipeline(&writes, AfterPipeline::Open)?;
                    draw.mark_crossings(tx, now)
                }
            }
        })
    }

    /// The usage totals of the CLI session that `session` last resumed (see [`Finished`]).
    pub fn cli_usage_total(&self, session: i64) -> Result<Option<Value>> {
        let text: Option<String> = self.read(|c| {
            c.query_row("SELECT cli_usage_total FROM sessions WHERE id = ?1", args![session], |r| r.get(0))
                .optional()
                .map(Option::flatten)
        })?;
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
    }

    /// Renews this owner's lease on a shared database: one row per owner, whatever it runs (no
    /// other node is woken for it). Alone on its store (SQLite) an owner needs no lease.
    pub fn renew_leases(&self, owner: &RunOwner) -> Result<()> {
        if !self.is_shared() {
            return Ok(());
        }
        self.write_sql_untold(|tx| renew_lease(tx, owner.as_str()))
    }

    /// Marks `interrupted` the running runs whose owner died, and returns them (they are never
    /// re-run). `owner` holds its node's runtime lock, so every other owner of its node is dead.
    /// Alone on its store (SQLite) that is every run not its own; on a shared database, another
    /// node's runs only once their lease passed (that node stopped renewing: it died or lost
    /// the database).
    pub fn interrupt_orphans(&self, owner: &RunOwner) -> Result<Vec<Orphan>> {
        let shared = self.is_shared();
        self.write_sql(|tx| -> Result<Vec<Orphan>> {
            let others_expired = match shared {
                true => format!(
                    "AND (r.owner LIKE ?2 || ':%' OR NOT EXISTS
                         (SELECT 1 FROM node_leases l WHERE l.owner = r.owner AND l.lease_until >= {}))",
                    tx.dialect().clock_ms()
                ),
                false => String::new(),
            };
            let sql = format!(
                "SELECT {RUN_COLUMNS}, r.owner, r.input_seq FROM runs r JOIN sessions s ON s.id = r.session
                 WHERE r.status = 'running' AND (r.owner IS NULL OR r.owner <> ?1) {others_expired}{}",
                // The run rows before the accounts their ends settle: a run's end takes them in
                // that order too, holding no global lock (`finish_run`).
                tx.dialect().for_update("r")
            );
            let args = match shared {
                true => args![owner.as_str(), owner.node()],
                false => args![owner.as_str()],
            };
            let found: Vec<(RunRow, Option<String>, Option<i64>)> =
                tx.query_map(&sql, args, |r| Ok((run_from_row(r)?, r.get(RUN_WIDTH)?, r.get(RUN_WIDTH + 1)?)))?;
            let now = now_ms();
            let mut runs = Vec::with_capacity(found.len());
            for (mut r, dead, input_seq) in found {
                let of_node = dead.as_deref().and_then(|d| d.split(':').next()) == Some(owner.node());
                if let (Some(_), Some(seq)) = (&r.remote_task_id, input_seq) {
                    // Its work goes on at the peer: the new owner follows the task.
                    tx.execute("UPDATE runs SET owner = ?2 WHERE run_id = ?1", args![r.run_id, owner.as_str()])?;
                    runs.push(Orphan { run: r, of_node, resumed: Some(seq) });
                    continue;
                }
                super::budgets::settle_run(tx, &r.run_id, None, now)?;
                let error = interrupted_why(of_node, dead.as_deref());
                tx.execute(
                    "UPDATE runs SET status = 'interrupted', ended_at = ?2, error = ?3
                     WHERE run_id = ?1",
                    args![r.run_id, now, error],
                )?;
                tx.execute("UPDATE tokens SET expires_at = ?2 WHERE run_id = ?1", args![r.run_id, now])?;
                (r.status, r.ended_at, r.error) = (RunStatus::Interrupted, Some(now), Some(error));
                runs.push(Orphan { run: r, of_node, resumed: None });
            }
            if shared {
                // The leases of owners gone, whose runs have just ended if they had any left.
                let sql = format!("DELETE FROM node_leases WHERE lease_until < {}", tx.dialect().clock_ms());
                tx.execute(&sql, args![])?;
            }
            Ok(runs)
        })
    }

    /// Records the run's supervisor (it leads the run's process group) and its start time, so
    /// that recovery can kill a leftover group without ever hitting a recycled pid.
    pub fn set_supervisor(&self, run_id: &str, pid: i64, start_time: Option<i64>) -> Result<()> {
        self.write_sql_for_this_boot(|tx| -> Result<()> {
            tx.execute(
                "UPDATE runs SET supervisor_pid = ?2, supervisor_pgid = ?2, supervisor_start = ?3 WHERE run_id = ?1",
                args![run_id, pid, start_time],
            )?;
            Ok(())
        })
    }

    /// Records the A2A task a run of a remote agent started, so that a restart follows it. One
    /// keyed statement that decides by itself: no global lock on a shared database.
    pub fn set_remote_task(&self, run_id: &str, task_id: &str) -> Result<()> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            tx.execute(
                "UPDATE runs SET remote_task_id = ?2 WHERE run_id = ?1 AND status = 'running'",
                args![run_id, task_id],
            )?;
            Ok(())
        })
    }

    /// Supervisor (pid, start time) of the given runs.
    pub fn supervisors(&self, run_ids: &[String]) -> Result<Vec<(i64, Option<i64>)>> {
        self.read(|c| {
            let sql = "SELECT supervisor_pid, supervisor_start FROM runs WHERE run_id = ?1";
            let mut out = Vec::new();
            for id in run_ids {
                if let Some((Some(pid), start)) =
                    c.query_opt(sql, args![id], |r| Ok((r.get::<Option<i64>>(0)?, r.get(1)?)))?
                {
                    out.push((pid, start));
                }
            }
            Ok(out)
        })
    }

    /// Records that the steps after `run_id`'s end (reply-back, announce, deliveries) were taken.
    pub fn steps_taken(&self, run_id: &str) -> Result<()> {
        self.write_sql_for_this_boot(|tx| -> Result<()> {
            tx.execute("UPDATE runs SET steps_done_at = ?2 WHERE run_id = ?1", args![run_id, now_ms()])?;
            Ok(())
        })
    }

    /// Ended runs whose steps were never taken: their owner died between recording the end and
    /// taking the steps. The next owner takes them (every step is idempotent).
    /// Only runs that ended at least `min_age_ms` ago (a younger one may be taking its steps now).
    pub fn runs_with_steps_pending(&self, min_age_ms: i64) -> Result<Vec<RunRow>> {
        self.read(|c| {
            let sql = format!(
                "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
                 WHERE r.steps_done_at IS NULL AND r.status NOT IN ('queued', 'running') AND r.ended_at <= ?1
                 ORDER BY r.ended_at"
            );
            c.query_map(&sql, args![now_ms() - min_age_ms], run_from_row)
        })
    }

    /// The runs `running` under `owner` (its process claimed them).
    pub fn running_under(&self, owner: &str) -> Result<Vec<String>> {
        self.read(|c| {
            c.query_map("SELECT run_id FROM runs WHERE status = 'running' AND owner = ?1", args![owner], |r| r.get(0))
        })
    }

    /// How many runs are queued or running (the drain condition).
    pub fn unfinished_runs(&self) -> Result<i64> {
        self.read(|c| {
            c.query_row("SELECT count(*) FROM runs WHERE status IN ('queued', 'running')", args![], |r| r.get(0))
        })
    }

    /// How many runs each node claimed, by node id (the first part of a [`RunOwner`]), most first.
    pub fn runs_per_node(&self) -> Result<Vec<(String, i64)>> {
        let owners: Vec<(String, i64)> = self.read(|c| {
            c.query_map("SELECT owner, count(*) FROM runs WHERE owner IS NOT NULL GROUP BY owner", args![], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
        })?;
        let mut nodes: HashMap<String, i64> = HashMap::new();
        for (owner, n) in owners {
            *nodes.entry(owner.split(':').next().unwrap_or_default().to_string()).or_default() += n;
        }
        let mut nodes: Vec<(String, i64)> = nodes.into_iter().collect();
        nodes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(nodes)
    }
}

impl Store {
    /// Records that `run_id` (a run inside which a caller waits) waits on `on` (None clears it).
    /// One keyed statement: no global lock on a shared database.
    pub fn set_waiting(&self, run_id: &str, on: Option<&str>) -> Result<()> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            tx.execute("UPDATE runs SET waiting_on = ?2 WHERE run_id = ?1", args![run_id, on])?;
            Ok(())
        })
    }

    /// Would a wait by a caller in session `caller` on a new run in session `target` close a
    /// cycle? Follows the target's running run through `waiting_on` (bounded).
    pub fn wait_would_deadlock(&self, caller: i64, target: i64) -> Result<bool> {
        self.read(|c| {
            let mut session = target;
            for _ in 0..32 {
                let running = "SELECT waiting_on FROM runs WHERE session = ?1 AND status = 'running'";
                let Some(Some(waits_on)) = c.query_opt(running, args![session], |r| r.get::<Option<String>>(0))? else {
                    return Ok(false);
                };
                let session_of = "SELECT session FROM runs WHERE run_id = ?1";
                let Some(next) = c.query_opt(session_of, args![waits_on], |r| r.get::<i64>(0))? else {
                    return Ok(false);
                };
                if next == caller {
                    return Ok(true);
                }
                session = next;
            }
            Ok(false)
        })
    }
}

/// The queue both backends' claim tests start from, and what one claim of it must take.
#[cfg(test)]
pub(in crate::store) mod claim_case {
    use super::{Caps, RunMode, RunRow};
    use RunMode::{Send, Spawn};

    /// `(agent, session index, mode)`, queued in this order as `run-<position>`.
    pub const QUEUE: &[(&str, usize, RunMode)] = &[
        ("a", 0, Send),
        ("a", 0, Send), // same session: waits for run-0 (FIFO, never overlapping)
        ("a", 1, Send),
        ("a", 2, Send), // agent a's cap is 2
        ("b", 0, Spawn),
        ("b", 1, Spawn), // the spawn cap is 1
        ("c", 0, Send),
    ];
    pub const CLAIMED: [&str; 4] = ["run-0", "run-2", "run-4", "run-6"];

    pub fn caps() -> Caps {
        Caps { global: 10, per_agent: [("a".to_string(), 2)].into(), default_agent: 4, spawns: 1 }
    }

    pub fn ids(claimed: &[(RunRow, i64)]) -> Vec<&str> {
        claimed.iter().map(|(r, _)| r.run_id.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_and_announce_kind_reads_back_as_it_is_stored() {
        let statuses = [
            RunStatus::Queued,
            RunStatus::Running,
            RunStatus::Ok,
            RunStatus::Error,
            RunStatus::Timeout,
            RunStatus::Cancelled,
            RunStatus::Interrupted,
        ];
        for s in statuses {
            assert_eq!(RunStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str(), "what show and tasks print");
        }
        let finished: Vec<RunStatus> = statuses.into_iter().filter(|s| s.is_finished()).collect();
        assert_eq!(finished.len(), 5);
        assert_eq!(RunStatus::parse("done"), None);
        for k in [AnnounceKind::Subagent, AnnounceKind::AgentToAgent] {
            assert_eq!(AnnounceKind::parse(k.as_str()), Some(k));
        }
    }

    /// Sessions `agent:<agent>:s<i>`, and the runs queued in them, in this order.
    fn queued(runs: &[(&str, usize, RunMode)]) -> (tempfile::TempDir, Store) {
        use crate::keys::SessionKind;
        use crate::store::{NewRun, NewSession};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        store
            .write(|tx| -> Result<()> {
                for (n, (agent, i, mode)) in runs.iter().enumerate() {
                    let key = SessionKey::from_canonical(format!("agent:{agent}:s{i}"));
                    let agent = AgentId::parse(agent).unwrap();
                    tx.insert_session(&NewSession::new(key.clone(), agent, SessionKind::Other, false))?;
                    let input = serde_json::json!({"role": "user", "content": format!("t{n}")});
                    tx.enqueue(&NewRun::new(format!("run-{n}"), tx.session_id(&key)?, *mode, input))?;
                }
                Ok(())
            })
            .unwrap();
        (dir, store)
    }

    #[test]
    fn one_claim_takes_every_run_that_may_start_and_no_more() {
        let (_dir, store) = queued(claim_case::QUEUE);
        let caps = claim_case::caps();
        let claimed = store.claim_ready("owner", &caps).unwrap();
        assert_eq!(claim_case::ids(&claimed), claim_case::CLAIMED);
        assert!(claimed.iter().all(|(r, _)| r.status == RunStatus::Running && r.started_at.is_some()));
        assert!(store.claim_ready("owner", &caps).unwrap().is_empty(), "the caps are full");

        let (_dir, store) = queued(&[("a", 0, RunMode::Send), ("a", 1, RunMode::Send), ("a", 2, RunMode::Send)]);
        let global = Caps { global: 2, per_agent: Default::default(), default_agent: 4, spawns: 4 };
        assert_eq!(claim_case::ids(&store.claim_ready("owner", &global).unwrap()), ["run-0", "run-1"], "global cap");
    }

    #[test]
    fn the_run_columns_are_run_width_wide_under_any_alias() {
        assert_eq!(RUN_COLUMNS.split(", ").count(), RUN_WIDTH);
        let aliased = run_columns("x", "xs");
        assert!(aliased.starts_with("x.run_id, x.session, xs.key, xs.agent_id, x.mode"), "{aliased}");
        assert_eq!(aliased.split(", ").filter(|c| c.starts_with("x.")).count(), RUN_WIDTH - 2);
    }
}
