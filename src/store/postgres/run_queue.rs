//! The run queue in PostgreSQL, for many nodes at once: every node claims queued runs, renews
//! the leases of the runs it is running, and interrupts the runs of a node that stopped renewing
//! (its queued runs stay queued for any node to claim). The rules are SQLite's
//! ([`crate::store::Store::claim_ready`]): oldest first; per session only the oldest queued run,
//! and only while none of the session's runs is running; the per-agent caps, the global cap and
//! the spawn cap. The backend slice calls these functions from [`crate::store::Store`].
//!
//! How the rules hold across nodes, each claiming on its own connection:
//! - A claim runs under one transaction-scoped advisory lock ([`CLAIM_LOCK`]). `FOR UPDATE SKIP
//!   LOCKED` alone keeps two claimers off the same row, but not under a cap together: two nodes
//!   can each count three running runs of an agent capped at four and both start a fourth. Every
//!   claim touches the global count, so per-agent advisory locks or counter rows would serialize
//!   claims on the global one all the same; SERIALIZABLE would make eight claimers abort and
//!   retry each other instead of queueing for the few milliseconds a claim takes. Under the lock
//!   (READ COMMITTED) each statement sees every claim committed before it, and the counts can
//!   only be too high, never too low: nothing but a claim starts a run, and a run that ends
//!   concurrently only frees room. The lock is released by the commit, so a claim that fails
//!   leaves nothing behind.
//! - `SKIP LOCKED` still earns its place: a queued run that another transaction holds (being
//!   cancelled, say) is passed over instead of waited on. Only each session's oldest queued run
//!   is a candidate at all, so skipping a locked one skips its session this round, never lets a
//!   younger run of the session start first.
//! - The per-session rule is also an index (`runs_one_running_per_session`, migration 2): a
//!   claim that would overlap two runs of a session fails instead of committing.
//! - Leases are in the database's clock (`clock_timestamp()`, in milliseconds like every time of
//!   the schema): a node's clock may be off (doctor reports the skew) and a lease compared on
//!   one clock and set on another would expire early or never. `clock_timestamp()`, not `now()`:
//!   `now()` is when the transaction began, before it waited for the claim lock.
//!
//! Not here yet (the backend slice): settling an interrupted run's budget reservation, as
//! SQLite's `interrupt_orphans` does; enqueueing and finishing runs in PostgreSQL.

use std::time::Duration;

use serde_json::Value;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Client, Row, Transaction};

use crate::keys::{AgentId, SessionKey};
use crate::store::run_queue::{AnnounceKind, Caps, RUN_COLUMNS, RUN_WIDTH, RunMode, RunRow, RunStatus};

/// The advisory lock every claim holds until it commits (`"smcq"` in ASCII).
const CLAIM_LOCK: i64 = 0x736d_6371;

/// The database's clock in milliseconds since the epoch, read when the statement runs.
const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// At most this many candidates per claim, as in SQLite.
const CANDIDATES_LIMIT: i64 = 256;

/// A node of a cluster sharing one database: the owner of the runs it claims.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeId(String);

impl NodeId {
    pub fn new(id: impl Into<String>) -> NodeId {
        NodeId(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'a> FromSql<'a> for RunStatus {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let text = <&str as FromSql>::from_sql(ty, raw)?;
        RunStatus::parse(text).ok_or_else(|| format!("run status {text:?}").into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

/// The run of a row of [`RUN_COLUMNS`], as SQLite's `run_from_row` reads one.
fn run_from_row(r: &Row) -> Result<RunRow, tokio_postgres::Error> {
    let json = |i: usize| -> Result<Option<Value>, tokio_postgres::Error> {
        Ok(r.try_get::<_, Option<String>>(i)?.and_then(|s| serde_json::from_str(&s).ok()))
    };
    let text = |i: usize| r.try_get::<_, String>(i);
    Ok(RunRow {
        run_id: text(0)?,
        session: r.try_get(1)?,
        session_key: SessionKey::from_canonical(text(2)?),
        agent_id: AgentId::parse(&text(3)?).unwrap_or_else(|_| AgentId::main()),
        mode: RunMode::parse(&text(4)?).unwrap_or(RunMode::Send),
        status: r.try_get(5)?,
        input: json(6)?.unwrap_or(Value::Null),
        provenance: json(7)?,
        requester_key: r.try_get::<_, Option<String>>(8)?.map(SessionKey::from_canonical),
        chain_id: r.try_get(9)?,
        hop: r.try_get(10)?,
        announce_kind: r.try_get::<_, Option<String>>(11)?.as_deref().and_then(AnnounceKind::parse),
        model: r.try_get(12)?,
        thinking: r.try_get(13)?,
        timeout_ms: r.try_get(14)?,
        reply: r.try_get(15)?,
        error: r.try_get(16)?,
        extra: json(17)?,
        created_at: r.try_get(18)?,
        started_at: r.try_get(19)?,
        ended_at: r.try_get(20)?,
    })
}

/// What is running while a claim decides, and the room the caps leave: SQLite's counting,
/// claim by claim.
#[derive(Debug)]
struct Room<'a> {
    caps: &'a Caps,
    per_agent: std::collections::HashMap<String, i64>,
    total: i64,
    spawns: i64,
}

impl<'a> Room<'a> {
    /// The running runs, per agent and spawns among them.
    async fn read(tx: &Transaction<'_>, caps: &'a Caps) -> Result<Room<'a>, tokio_postgres::Error> {
        let rows = tx
            .query(
                "SELECT s.agent_id, count(*), count(*) FILTER (WHERE r.mode = 'spawn')
                 FROM runs r JOIN sessions s ON s.id = r.session WHERE r.status = 'running' GROUP BY s.agent_id",
                &[],
            )
            .await?;
        let mut room = Room { caps, per_agent: Default::default(), total: 0, spawns: 0 };
        for row in rows {
            let (agent, running, spawns): (String, i64, i64) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            room.total += running;
            room.spawns += spawns;
            room.per_agent.insert(agent, running);
        }
        Ok(room)
    }

    fn full(&self) -> bool {
        self.total >= i64::from(self.caps.global)
    }

    /// Takes a place for `run` if every cap it falls under has one.
    fn take(&mut self, run: &RunRow) -> bool {
        let agent = run.agent_id.as_str();
        let cap = self.caps.per_agent.get(agent).copied().unwrap_or(self.caps.default_agent);
        let busy = self.per_agent.get(agent).copied().unwrap_or(0);
        let spawn = run.mode == RunMode::Spawn;
        if self.full() || busy >= i64::from(cap) || (spawn && self.spawns >= i64::from(self.caps.spawns)) {
            return false;
        }
        *self.per_agent.entry(agent.to_string()).or_default() += 1;
        self.total += 1;
        self.spawns += i64::from(spawn);
        true
    }
}

/// Claims for `node`, in one transaction, the queued runs that may start now, oldest first, each
/// leased for `lease` on the database's clock; appends each one's input to its transcript (as
/// SQLite's claim does). Returns the claimed runs, running, with their input's seq. Safe under
/// any number of concurrent claimers (see the module doc).
pub async fn claim_ready(
    client: &mut Client,
    node: &NodeId,
    caps: &Caps,
    lease: Duration,
) -> Result<Vec<(RunRow, i64)>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CLAIM_LOCK]).await?;
    let mut room = Room::read(&tx, caps).await?;
    if room.full() {
        return Ok(Vec::new());
    }
    let mut claimed = Vec::new();
    for run in candidates(&tx).await? {
        if room.full() {
            break;
        }
        if room.take(&run) {
            claimed.push(claim(&tx, &run, node, lease).await?);
        }
    }
    tx.commit().await?;
    Ok(claimed)
}

/// Each session's oldest queued run, when none of the session's runs is running, oldest first,
/// locked; rows another transaction holds are passed over.
async fn candidates(tx: &Transaction<'_>) -> Result<Vec<RunRow>, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session
         WHERE r.status = 'queued'
           AND r.run_id IN (SELECT DISTINCT ON (q.session) q.run_id FROM runs q WHERE q.status = 'queued'
                            ORDER BY q.session, q.created_at, q.enqueued)
           AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.session = r.session AND x.status = 'running')
         ORDER BY r.created_at, r.enqueued LIMIT {CANDIDATES_LIMIT}
         FOR UPDATE OF r SKIP LOCKED"
    );
    tx.query(&sql, &[]).await?.iter().map(run_from_row).collect()
}

/// Marks `run` running for `node` and appends its input to its transcript (role, content,
/// timestamp, run_id, provenance and chain_id, at the session's next seq), in one statement: the
/// claimed row and the input's seq.
async fn claim(
    tx: &Transaction<'_>,
    run: &RunRow,
    node: &NodeId,
    lease: Duration,
) -> Result<(RunRow, i64), tokio_postgres::Error> {
    let content = run.input.get("content").cloned().unwrap_or(Value::Null).to_string();
    let role = run.input.get("role").and_then(Value::as_str).unwrap_or("user");
    let provenance = run.provenance.as_ref().map(Value::to_string);
    let sql = format!(
        "WITH clock AS (SELECT {DB_NOW_MS} AS ms),
         seq AS (UPDATE sessions SET next_seq = next_seq + 1, updated_at = greatest(updated_at, (SELECT ms FROM clock))
                 WHERE id = $2 RETURNING next_seq - 1 AS seq),
         message AS (INSERT INTO messages (session, seq, role, content, timestamp, run_id, provenance, chain_id)
                     SELECT $2, seq.seq, $3, $4, clock.ms, $1, $5, $6 FROM seq, clock)
         UPDATE runs r SET status = 'running', owner = $7, lease_until = clock.ms + $8, started_at = clock.ms,
                input_seq = seq.seq
         FROM sessions s, clock, seq
         WHERE r.run_id = $1 AND s.id = r.session
         RETURNING {RUN_COLUMNS}, seq.seq"
    );
    let row = tx
        .query_one(
            &sql,
            &[&run.run_id, &run.session, &role, &content, &provenance, &run.chain_id, &node.as_str(), &lease_ms(lease)],
        )
        .await?;
    let seq = row.try_get(RUN_WIDTH)?;
    Ok((run_from_row(&row)?, seq))
}

fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// Extends the lease of every run `node` is running to `lease` from now on the database's clock.
/// Returns how many it renewed: fewer than the node runs means some were interrupted (their lease
/// had passed) and must be stopped.
pub async fn renew_leases(client: &Client, node: &NodeId, lease: Duration) -> Result<u64, tokio_postgres::Error> {
    let sql = format!("UPDATE runs SET lease_until = {DB_NOW_MS} + $2 WHERE owner = $1 AND status = 'running'");
    client.execute(&sql, &[&node.as_str(), &lease_ms(lease)]).await
}

/// Marks `interrupted` every running run whose lease has passed on the database's clock (its
/// node stopped renewing: it died or lost the database), and ends it and its tokens now. They
/// are never re-run; queued runs are left for any node to claim. Returns the interrupted run ids.
/// Any node may call this at any time: each run is interrupted once, and a run its node finishes
/// or renews first is not.
pub async fn interrupt_expired(client: &mut Client) -> Result<Vec<String>, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let sql = format!(
        "WITH clock AS (SELECT {DB_NOW_MS} AS ms)
         UPDATE runs SET status = 'interrupted', ended_at = clock.ms, lease_until = NULL,
                error = 'interrupted: its node ' || coalesce(owner, '(none)')
                        || ' stopped renewing its lease; it was not re-run'
         FROM clock WHERE status = 'running' AND lease_until < clock.ms
         RETURNING run_id"
    );
    let ids: Vec<String> = tx.query(&sql, &[]).await?.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?;
    let tokens = format!("UPDATE tokens SET expires_at = {DB_NOW_MS} WHERE run_id = ANY($1)");
    tx.execute(&tokens, &[&ids]).await?;
    tx.commit().await?;
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::store::postgres::{PgTarget, open, with_test_database};
    use crate::store::run_queue::claim_case;
    use RunMode::{Send, Spawn};

    const LEASE: Duration = Duration::from_secs(15);

    /// Sessions `agent:<agent>:s<i>`, and the runs `run-<n>` queued in them in this order, all at
    /// one instant (the order they were queued in breaks the tie, as SQLite's rowid does).
    async fn enqueue(client: &Client, runs: &[(&str, usize, RunMode)]) {
        for (n, (agent, i, mode)) in runs.iter().enumerate() {
            let key = format!("agent:{agent}:s{i}");
            let session: i64 = client
                .query_one(
                    "INSERT INTO sessions (key, session_id, agent_id, kind, driver, created_at, updated_at)
                     VALUES ($1, $1, $2, 'other', 'driven', 0, 0)
                     ON CONFLICT (key) DO UPDATE SET updated_at = sessions.updated_at RETURNING id",
                    &[&key, agent],
                )
                .await
                .unwrap()
                .get(0);
            let input = serde_json::json!({"role": "user", "content": format!("t{n}")}).to_string();
            client
                .execute(
                    "INSERT INTO runs (run_id, session, mode, status, input, created_at) VALUES ($1, $2, $3, 'queued', $4, 0)",
                    &[&format!("run-{n}"), &session, &mode.as_str(), &input],
                )
                .await
                .unwrap();
        }
    }

    /// A fresh database with these runs queued, and `f` on a connection to it.
    async fn with_queue(runs: &[(&str, usize, RunMode)], f: impl AsyncFnOnce(&PgTarget, &mut Client)) {
        with_test_database(async |target| {
            let pool = open(&target).await.unwrap();
            let mut client = target.client(&pool).await.unwrap();
            enqueue(&client, runs).await;
            f(&target, &mut client).await;
        })
        .await;
    }

    fn caps(global: u32, per_agent: &[(&str, u32)], default_agent: u32, spawns: u32) -> Caps {
        Caps { global, per_agent: per_agent.iter().map(|(a, c)| (a.to_string(), *c)).collect(), default_agent, spawns }
    }

    #[tokio::test]
    async fn postgres_one_claim_takes_every_run_that_may_start_and_no_more() {
        with_queue(claim_case::QUEUE, async |_, client| {
            let caps = claim_case::caps();
            let node = NodeId::new("node-a");
            let claimed = claim_ready(client, &node, &caps, LEASE).await.unwrap();
            assert_eq!(claim_case::ids(&claimed), claim_case::CLAIMED);
            assert!(claimed.iter().all(|(r, _)| r.status == RunStatus::Running && r.started_at.is_some()));
            assert!(claim_ready(client, &node, &caps, LEASE).await.unwrap().is_empty(), "the caps are full");

            // The input is the session's first message, as SQLite's claim writes it.
            let (run, seq) = &claimed[0];
            let m = client
                .query_one(
                    "SELECT seq, role, content, timestamp, run_id, owner, input_seq, lease_until FROM messages
                            JOIN runs USING (run_id) WHERE run_id = 'run-0'",
                    &[],
                )
                .await
                .unwrap();
            assert_eq!((m.get::<_, i64>(0), *seq), (1, 1));
            assert_eq!((m.get::<_, String>(1), m.get::<_, String>(2)), ("user".into(), "\"t0\"".into()));
            assert_eq!(Some(m.get::<_, i64>(3)), run.started_at, "one clock, the database's");
            assert_eq!((m.get::<_, String>(5), m.get::<_, Option<i64>>(6)), ("node-a".into(), Some(1)));
            assert_eq!(m.get::<_, i64>(7), run.started_at.unwrap() + 15_000);
            let next: i64 =
                client.query_one("SELECT next_seq FROM sessions WHERE key = 'agent:a:s0'", &[]).await.unwrap().get(0);
            assert_eq!(next, 2);
        })
        .await;

        with_queue(&[("a", 0, Send), ("a", 1, Send), ("a", 2, Send)], async |_, client| {
            let global = caps(2, &[], 4, 4);
            let claimed = claim_ready(client, &NodeId::new("n"), &global, LEASE).await.unwrap();
            assert_eq!(claim_case::ids(&claimed), ["run-0", "run-1"], "global cap");
        })
        .await;
    }

    /// What the claimers of the race saw, checked as they go.
    #[derive(Default)]
    struct Seen {
        claimed: HashSet<String>,
        running_sessions: HashSet<i64>,
        per_agent: HashMap<String, u32>,
        total: u32,
        spawns: u32,
        /// Per session, its runs in the order they were claimed.
        order: HashMap<i64, Vec<String>>,
        /// Claims that took at least one run, per node.
        claims: HashMap<String, usize>,
    }

    impl Seen {
        fn claimed(&mut self, node: &NodeId, runs: &[(RunRow, i64)], caps: &Caps) {
            if !runs.is_empty() {
                *self.claims.entry(node.as_str().to_string()).or_default() += 1;
            }
            for (run, _) in runs {
                assert!(self.claimed.insert(run.run_id.clone()), "{} claimed twice", run.run_id);
                assert!(self.running_sessions.insert(run.session), "two runs of session {} running", run.session);
                let agent = self.per_agent.entry(run.agent_id.as_str().to_string()).or_default();
                *agent += 1;
                let cap = caps.per_agent.get(run.agent_id.as_str()).copied().unwrap_or(caps.default_agent);
                assert!(*agent <= cap, "agent {} over its cap {cap}", run.agent_id.as_str());
                self.total += 1;
                assert!(self.total <= caps.global, "over the global cap");
                self.spawns += u32::from(run.mode == Spawn);
                assert!(self.spawns <= caps.spawns, "over the spawn cap");
                self.order.entry(run.session).or_default().push(run.run_id.clone());
            }
        }

        /// Before the run's end is committed: no claim can see its room before this.
        fn ending(&mut self, run: &RunRow) {
            self.running_sessions.remove(&run.session);
            *self.per_agent.get_mut(run.agent_id.as_str()).unwrap() -= 1;
            self.total -= 1;
            self.spawns -= u32::from(run.mode == Spawn);
        }
    }

    /// The caps hold in what the database says is running now.
    async fn assert_caps_hold(client: &Client, caps: &Caps) {
        let rows = client
            .query(
                "SELECT s.agent_id, r.session, r.mode FROM runs r JOIN sessions s ON s.id = r.session
                 WHERE r.status = 'running'",
                &[],
            )
            .await
            .unwrap();
        let mut per_agent: HashMap<String, u32> = HashMap::new();
        let mut sessions = HashSet::new();
        for r in &rows {
            *per_agent.entry(r.get(0)).or_default() += 1;
            assert!(sessions.insert(r.get::<_, i64>(1)), "two running in a session");
        }
        assert!(rows.len() <= caps.global as usize, "{} running, global cap {}", rows.len(), caps.global);
        let spawns = rows.iter().filter(|r| r.get::<_, &str>(2) == "spawn").count();
        assert!(spawns <= caps.spawns as usize, "{spawns} spawns running");
        for (agent, n) in per_agent {
            assert!(n <= caps.per_agent.get(&agent).copied().unwrap_or(caps.default_agent), "agent {agent}: {n}");
        }
    }

    /// One node: claims on its own connection, checks, works a little, finishes each run, until
    /// nothing is queued or running.
    async fn claimer(target: PgTarget, node: NodeId, caps: Caps, seen: Arc<Mutex<Seen>>) {
        let pool = target.connect().await.unwrap();
        let mut client = target.client(&pool).await.unwrap();
        loop {
            let claimed = claim_ready(&mut client, &node, &caps, LEASE).await.unwrap();
            seen.lock().unwrap().claimed(&node, &claimed, &caps);
            assert_caps_hold(&client, &caps).await;
            if claimed.is_empty() {
                let open: i64 = client
                    .query_one("SELECT count(*) FROM runs WHERE status IN ('queued', 'running')", &[])
                    .await
                    .unwrap()
                    .get(0);
                if open == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            for (run, _) in claimed {
                tokio::time::sleep(Duration::from_millis(1)).await;
                seen.lock().unwrap().ending(&run);
                let done = client
                    .execute(
                        "UPDATE runs SET status = 'ok', ended_at = 0, lease_until = NULL
                         WHERE run_id = $1 AND owner = $2 AND status = 'running'",
                        &[&run.run_id, &node.as_str()],
                    )
                    .await
                    .unwrap();
                assert_eq!(done, 1, "{} was still ours", run.run_id);
            }
        }
    }

    const CLAIMERS: usize = 8;
    const RUNS: usize = 300;
    const SESSIONS: usize = 40;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_racing_claimers_never_share_a_run_overlap_a_session_or_exceed_a_cap() {
        // Session i belongs to agent i % 4; every fifth run is a spawn. The caps add up to more
        // than the global one, so each of them binds at some point.
        let agents = ["a", "b", "c", "d"];
        let plan: Vec<(&str, usize, RunMode)> =
            (0..RUNS).map(|n| (agents[n % 4], n % SESSIONS, if n % 5 == 0 { Spawn } else { Send })).collect();
        with_queue(&plan, async |target, client| {
            let caps = caps(6, &[("a", 1), ("b", 2)], 3, 2);
            let seen = Arc::new(Mutex::new(Seen::default()));
            let started = std::time::Instant::now();
            let tasks: Vec<_> = (0..CLAIMERS)
                .map(|i| {
                    tokio::spawn(claimer(target.clone(), NodeId::new(format!("node-{i}")), caps.clone(), seen.clone()))
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            let elapsed = started.elapsed();
            let seen = std::mem::take(&mut *seen.lock().unwrap());
            assert_eq!(seen.claimed.len(), RUNS, "every run ran");
            assert_eq!(seen.total, 0);
            let ok: i64 = client.query_one("SELECT count(*) FROM runs WHERE status = 'ok'", &[]).await.unwrap().get(0);
            assert_eq!(ok, RUNS as i64);
            // Each run's input once, at the seq its run names; each transcript 1..n without gaps.
            let inputs: i64 = client
                .query_one(
                    "SELECT count(DISTINCT m.run_id) FILTER (WHERE m.seq = r.input_seq), count(*) FROM messages m
                     JOIN runs r ON r.run_id = m.run_id AND r.session = m.session",
                    &[],
                )
                .await
                .map(|r| {
                    assert_eq!(r.get::<_, i64>(0), r.get::<_, i64>(1), "one input message per run");
                    r.get(1)
                })
                .unwrap();
            assert_eq!(inputs, RUNS as i64);
            let gaps: i64 = client
                .query_one(
                    "SELECT count(*) FROM (SELECT session FROM messages GROUP BY session
                     HAVING min(seq) <> 1 OR max(seq) <> count(*)) g",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(gaps, 0);
            // FIFO: each session's runs were claimed in the order they were queued.
            for (session, order) in &seen.order {
                let queued: Vec<String> = client
                    .query("SELECT run_id FROM runs WHERE session = $1 ORDER BY enqueued", &[session])
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                assert_eq!(order, &queued, "session {session}");
            }
            let claims: usize = seen.claims.values().sum();
            assert!(seen.claims.len() >= 2, "the claimers raced: {:?}", seen.claims);
            eprintln!(
                "{RUNS} runs in {SESSIONS} sessions, {CLAIMERS} claimers: {claims} claims by {} nodes in {elapsed:?}",
                seen.claims.len()
            );
        })
        .await;
    }

    #[tokio::test]
    async fn postgres_a_node_that_stops_renewing_loses_its_running_runs_and_another_claims_its_queued_ones() {
        with_queue(&[("a", 0, Send), ("a", 0, Send), ("b", 0, Send)], async |_, client| {
            let caps = caps(10, &[], 4, 4);
            let (a, b) = (NodeId::new("node-a"), NodeId::new("node-b"));
            // A lease that has passed by the time anyone looks: node a stops renewing at once.
            let taken = claim_ready(client, &a, &caps, Duration::ZERO).await.unwrap();
            assert_eq!(claim_case::ids(&taken), ["run-0", "run-2"]);
            assert!(claim_ready(client, &b, &caps, LEASE).await.unwrap().is_empty(), "run-1 waits for run-0");
            tokio::time::sleep(Duration::from_millis(20)).await;

            let mut gone = interrupt_expired(client).await.unwrap();
            gone.sort();
            assert_eq!(gone, ["run-0", "run-2"]);
            for row in client
                .query("SELECT status, error, ended_at, lease_until FROM runs WHERE run_id IN ('run-0', 'run-2')", &[])
                .await
                .unwrap()
            {
                assert_eq!(row.get::<_, RunStatus>(0), RunStatus::Interrupted);
                assert_eq!(
                    row.get::<_, String>(1),
                    "interrupted: its node node-a stopped renewing its lease; it was not re-run"
                );
                assert!(row.get::<_, Option<i64>>(2).is_some() && row.get::<_, Option<i64>>(3).is_none());
            }
            assert_eq!(renew_leases(client, &a, LEASE).await.unwrap(), 0, "node a comes back to nothing");
            assert!(interrupt_expired(client).await.unwrap().is_empty(), "each run is interrupted once");

            // The queued run of node a's session goes to node b; renewing keeps its lease alive.
            let next = claim_ready(client, &b, &caps, Duration::ZERO).await.unwrap();
            assert_eq!(claim_case::ids(&next), ["run-1"]);
            assert_eq!(next[0].1, 2, "after run-0's input");
            assert_eq!(renew_leases(client, &b, LEASE).await.unwrap(), 1);
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(interrupt_expired(client).await.unwrap().is_empty(), "a renewed lease holds");
            assert!(claim_ready(client, &a, &caps, LEASE).await.unwrap().is_empty(), "nothing is re-run");
        })
        .await;
    }
}
