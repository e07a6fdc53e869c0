//! What the operator's dashboard (`/ui`) reads in one go — spawn trees, runs with their
//! deliveries, the delivery ledger, open asks, usage over time — and the two ledger acts it
//! offers (retry, dismiss). Every read is bounded (pages of roots, runs and deliveries), so the
//! first paint costs the same with 10,000 sessions as with 10.

use super::sql::{Optional, Row, Sql, args};
use serde::Serialize;

use super::sessions::session_columns;
use super::{AskRow, DeliveryStatus, Result, RunMode, RunStatus, SessionRow, Store, now_ms};
use crate::policy::budget::Account;

/// Whose part of the store a read covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The operator: every session.
    All,
    /// One session and its descendants (a client token's own tree).
    Tree(i64),
}

impl Scope {
    /// The `?` bound in [`IN_SCOPE`]: None for all.
    fn root(self) -> Option<i64> {
        match self {
            Scope::All => None,
            Scope::Tree(id) => Some(id),
        }
    }
}

/// `session` (a column of the query) is in scope `?1`.
const IN_SCOPE: &str =
    "(CAST(?1 AS BIGINT) IS NULL OR {s} = ?1 OR {s} IN (SELECT session FROM session_tree WHERE ancestor = ?1))";

fn in_scope(column: &str) -> String {
    IN_SCOPE.replace("{s}", column)
}

/// A session's newest run, as a tree node shows it.
#[derive(Debug, Clone)]
pub struct LatestRun {
    pub run_id: String,
    pub mode: RunMode,
    pub status: RunStatus,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub error: Option<String>,
}

/// One session of a tree.
#[derive(Debug, Clone)]
pub struct TreeNode {
    pub row: SessionRow,
    /// Its newest run (its state), and when its first run started (its runtime runs from there).
    pub run: Option<LatestRun>,
    pub first_started_at: Option<i64>,
    pub open_asks: i64,
    pub budget: Option<Account>,
    /// The task it was spawned with (none for a session nobody spawned).
    pub task: Option<String>,
}

/// A page of trees: its roots (newest activity first) and their descendants.
#[derive(Debug, Clone)]
pub struct TreesPage {
    /// Roots matching the filter, of which the page holds the first `limit`.
    pub roots_total: i64,
    pub roots: Vec<TreeNode>,
    /// Each root's descendants (in the order of `roots`), newest activity first, and how many
    /// it has in all.
    pub descendants: Vec<(Vec<TreeNode>, i64)>,
}

/// One delivery of the ledger.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryLine {
    pub id: i64,
    pub run_id: Option<String>,
    /// The session whose run it carries out, its label and the task it was spawned with.
    pub session_key: Option<String>,
    pub label: Option<String>,
    pub task: Option<String>,
    pub kind: String,
    pub mode: String,
    pub status: String,
    pub target: Option<String>,
    pub channel: Option<String>,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<i64>,
    pub deadline_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// One run of the runs table, with its deliveries kept apart.
#[derive(Debug, Clone)]
pub struct RunLine {
    pub run: LatestRun,
    pub session_key: String,
    pub agent_id: String,
    pub requester: Option<String>,
    /// The session's label and the task it was spawned with, to tell a run apart by more than its
    /// key.
    pub label: Option<String>,
    pub task: Option<String>,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost: Option<f64>,
    pub open_asks: i64,
    pub deliveries: Vec<DeliveryLine>,
}

/// Tokens and cost of the runs that ended in one time bucket.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageBucket {
    pub start: i64,
    pub runs: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub cost_usd: f64,
}

/// What a retry or dismiss did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerAct {
    Done,
    /// The delivery is not in a state the act applies to (its status now).
    NotApplicable(String),
    Missing,
}

const DELIVERY_COLUMNS: &str = "d.id, d.run_id, s.key, d.kind, d.mode, d.status, d.target_key, d.channel, d.attempts,
    d.last_error, d.next_attempt_at, d.deadline_at, d.created_at, d.updated_at, s.label";

/// The task session `s` was spawned with: its spawn run's input (`{role, content: TASK}`).
fn task_of_s(c: &dyn Sql) -> String {
    format!("(SELECT {} FROM runs t WHERE t.run_id = s.spawn_run)", c.dialect().json_text("t.input", "content"))
}

/// The delivery ledger's select: its columns, then the session's task.
fn delivery_select(c: &dyn Sql) -> String {
    format!("SELECT {DELIVERY_COLUMNS}, {}", task_of_s(c))
}

fn delivery_from_row(r: &Row) -> Result<DeliveryLine> {
    Ok(DeliveryLine {
        id: r.get(0)?,
        run_id: r.get(1)?,
        session_key: r.get(2)?,
        kind: r.get(3)?,
        mode: r.get(4)?,
        status: r.get(5)?,
        target: r.get(6)?,
        channel: r.get(7)?,
        attempts: r.get(8)?,
        last_error: r.get(9)?,
        next_attempt_at: r.get(10)?,
        deadline_at: r.get(11)?,
        created_at: r.get(12)?,
        updated_at: r.get(13)?,
        label: r.get(14)?,
        task: r.get(15)?,
    })
}

const RUN_COLUMNS: &str = "r.run_id, r.mode, r.status, r.created_at, r.started_at, r.ended_at, r.error";

fn run_from_row(r: &Row) -> Result<LatestRun> {
    let text = |i: usize| -> Result<String> { r.get(i) };
    Ok(LatestRun {
        run_id: r.get(0)?,
        mode: RunMode::parse(&text(1)?).unwrap_or(RunMode::Send),
        status: RunStatus::parse(&text(2)?).unwrap_or(RunStatus::Error),
        created_at: r.get(3)?,
        started_at: r.get(4)?,
        ended_at: r.get(5)?,
        error: r.get(6)?,
    })
}

fn node(c: &dyn Sql, row: SessionRow, now: i64) -> Result<TreeNode> {
    let run = c.query_opt(
        &format!(
            "SELECT {RUN_COLUMNS} FROM runs r WHERE r.session = ?1 ORDER BY r.created_at DESC, r.{} DESC LIMIT 1",
            c.dialect().runs_order()
        ),
        args![row.id],
        run_from_row,
    )?;
    let first_started_at =
        c.query_row("SELECT min(started_at) FROM runs WHERE session = ?1", args![row.id], |r| r.get(0))?;
    let open_asks = open_asks_of(c, row.id)?;
    let budget = super::budgets::account(c, row.id, now)?;
    let task = match &row.spawn_run {
        Some(run_id) => c.query_opt(
            &format!("SELECT {} FROM runs t WHERE t.run_id = ?1", c.dialect().json_text("t.input", "content")),
            args![run_id],
            |r| r.get(0),
        )?,
        None => None,
    };
    Ok(TreeNode { row, run, first_started_at, open_asks, budget, task })
}

fn open_asks_of(c: &dyn Sql, session: i64) -> Result<i64> {
    c.query_row("SELECT count(*) FROM asks WHERE session = ?1 AND state = 'open'", args![session], |r| r.get(0))
}

fn sessions_by_id(c: &dyn Sql, ids: &[i64], now: i64) -> Result<Vec<TreeNode>> {
    let sql = format!("SELECT {} FROM sessions WHERE id = ?1", session_columns());
    let mut nodes = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(row) = c.query_opt(&sql, args![id], SessionRow::from_row)? {
            nodes.push(node(c, row, now)?);
        }
    }
    Ok(nodes)
}

impl Store {
    /// The trees in `scope`: for the operator the newest `limit` roots (sessions nobody spawned,
    /// not deleted; `filter` matches a key, label or agent), for a tree its one root; each with
    /// up to `per_root` descendants. One read transaction.
    pub fn dashboard_trees(
        &self,
        scope: Scope,
        filter: Option<&str>,
        limit: usize,
        per_root: usize,
    ) -> Result<TreesPage> {
        self.read(|c| {
            let now = now_ms();
            let (root_ids, roots_total): (Vec<i64>, i64) = match scope {
                Scope::Tree(id) => (vec![id], 1),
                Scope::All => {
                    let like = filter.map(|f| format!("%{}%", f.replace(['%', '_'], "")));
                    let cond = format!(
                        "spawned_by IS NULL AND state <> 2
                         AND (CAST(?1 AS TEXT) IS NULL OR key {like} ?1 OR label {like} ?1 OR agent_id {like} ?1)",
                        like = c.dialect().like_nocase()
                    );
                    let ids = c
                        .query_map(&format!(
                            "SELECT id FROM sessions WHERE {cond} ORDER BY updated_at DESC, id DESC LIMIT ?2"
                        ), args![like, limit as i64], |r| r.get(0))?;
                    let total = c
                        .query_row(&format!("SELECT count(*) FROM sessions WHERE {cond}"), args![like], |r| r.get(0))?;
                    (ids, total)
                }
            };
            let roots = sessions_by_id(c, &root_ids, now)?;
            let mut descendants = Vec::with_capacity(roots.len());
            for root in &roots {
                let ids: Vec<i64> = c.query_map(
                    "SELECT session FROM session_tree WHERE ancestor = ?1 ORDER BY updated_at DESC, session DESC LIMIT ?2",
                    args![root.row.id, per_root as i64],
                    |r| r.get(0),
                )?;
                let total: i64 =
                    c.one("SELECT count(*) FROM session_tree WHERE ancestor = ?1", args![root.row.id])?;
                descendants.push((sessions_by_id(c, &ids, now)?, total));
            }
            Ok(TreesPage { roots_total, roots, descendants })
        })
    }

    /// Runs in `scope`: every queued or running one (up to `limit`), then the newest ended ones
    /// (up to `limit`), each with its deliveries.
    pub fn dashboard_runs(&self, scope: Scope, limit: usize) -> Result<Vec<RunLine>> {
        self.read(|c| {
            let select = format!(
                "SELECT {RUN_COLUMNS}, s.key, s.agent_id, r.requester_key, r.usage, r.cost, r.session, s.label, {}
                 FROM runs r JOIN sessions s ON s.id = r.session WHERE {} AND r.status {{}}
                 ORDER BY r.created_at DESC, r.{} DESC LIMIT ?2",
                task_of_s(c),
                in_scope("r.session"),
                c.dialect().runs_order()
            );
            let mut lines = Vec::new();
            for statuses in ["IN ('queued', 'running')", "NOT IN ('queued', 'running')"] {
                let rows = c.query_map(&select.replace("{}", statuses), args![scope.root(), limit as i64], |r| {
                    let usage: Option<String> = r.get(10)?;
                    let usage: Option<serde_json::Value> = usage.and_then(|u| serde_json::from_str(&u).ok());
                    let tokens = |k: &str| usage.as_ref().and_then(|u| u.get(k)).and_then(|v| v.as_i64()).unwrap_or(0);
                    Ok((
                        RunLine {
                            run: run_from_row(r)?,
                            session_key: r.get(7)?,
                            agent_id: r.get(8)?,
                            requester: r.get(9)?,
                            label: r.get(13)?,
                            task: r.get(14)?,
                            tokens_in: tokens("inputTokens"),
                            tokens_out: tokens("outputTokens"),
                            cost: r.get(11)?,
                            open_asks: 0,
                            deliveries: Vec::new(),
                        },
                        r.get::<i64>(12)?,
                    ))
                })?;
                for (mut line, session) in rows {
                    if line.run.status == RunStatus::Running {
                        line.open_asks = open_asks_of(c, session)?;
                    }
                    line.deliveries = c.query_map(
                        &format!(
                            "{} FROM deliveries d LEFT JOIN runs r ON r.run_id = d.run_id
                             LEFT JOIN sessions s ON s.id = r.session WHERE d.run_id = ?1 ORDER BY d.id",
                            delivery_select(c)
                        ),
                        args![&line.run.run_id],
                        delivery_from_row,
                    )?;
                    lines.push(line);
                }
            }
            Ok(lines)
        })
    }

    /// The delivery ledger in `scope`: the ones that need an operator (failed, expired,
    /// undeliverable) first, then the newest, up to `limit`.
    pub fn dashboard_deliveries(&self, scope: Scope, limit: usize) -> Result<Vec<DeliveryLine>> {
        self.read(|c| {
            c.query_map(
                &format!(
                    "{} FROM deliveries d LEFT JOIN runs r ON r.run_id = d.run_id
                 LEFT JOIN sessions s ON s.id = r.session WHERE {}
                 ORDER BY d.status IN ('failed', 'expired', 'undeliverable') DESC, d.id DESC LIMIT ?2",
                    delivery_select(c),
                    in_scope("r.session")
                ),
                args![scope.root(), limit as i64],
                delivery_from_row,
            )
        })
    }

    /// One delivery, and the session whose run it carries out.
    pub fn delivery_line(&self, id: i64) -> Result<Option<(DeliveryLine, Option<i64>)>> {
        self.read(|c| {
            c.query_row(
                &format!(
                    "{}, r.session FROM deliveries d LEFT JOIN runs r ON r.run_id = d.run_id
                 LEFT JOIN sessions s ON s.id = r.session WHERE d.id = ?1",
                    delivery_select(c)
                ),
                args![id],
                |r| Ok((delivery_from_row(r)?, r.get(16)?)),
            )
            .optional()
        })
    }

    /// Tokens and cost of the runs in `scope` that ended since `since`, per `bucket_ms`, oldest
    /// first (empty buckets left out).
    pub fn usage_over_time(&self, scope: Scope, since: i64, bucket_ms: i64) -> Result<Vec<UsageBucket>> {
        self.read(|c| {
            c.query_map(
                &format!(
                    "SELECT (r.ended_at / ?3) * ?3 AS start, count(*),
                     {}, {}, coalesce(sum(r.cost), 0)
                 FROM runs r WHERE r.ended_at >= ?2 AND {} GROUP BY start ORDER BY start",
                    c.dialect().sum_int(&c.dialect().json_int("r.usage", "inputTokens")),
                    c.dialect().sum_int(&c.dialect().json_int("r.usage", "outputTokens")),
                    in_scope("r.session")
                ),
                args![scope.root(), since, bucket_ms],
                |r| {
                    Ok(UsageBucket {
                        start: r.get(0)?,
                        runs: r.get(1)?,
                        tokens_in: r.get(2)?,
                        tokens_out: r.get(3)?,
                        cost_usd: r.get(4)?,
                    })
                },
            )
        })
    }

    /// The open asks of the sessions in `scope`, oldest first.
    pub fn open_asks_in(&self, scope: Scope, limit: usize) -> Result<Vec<AskRow>> {
        self.read(|c| super::asks::open_asks_in(c, &in_scope("a.session"), scope.root(), limit))
    }

    /// A cheap mark that changes when anything the dashboard shows does: messages, runs starting
    /// or ending, the ledger, asks, the usage running runs reported. The live view polls it for writers that announce nothing.
    pub fn dashboard_mark(&self) -> Result<String> {
        self.read(|c| {
            c.query_row(
                &format!(
                    "SELECT (SELECT coalesce(max(id), 0) FROM messages),
                        (SELECT count(*) FROM runs WHERE status = 'queued'),
                        (SELECT count(*) FROM runs WHERE status = 'running'),
                        (SELECT coalesce(max({}), 0) FROM runs),
                        (SELECT coalesce(max(updated_at), 0) FROM deliveries),
                        (SELECT count(*) FROM asks WHERE state = 'open'),
                        (SELECT {} FROM runs WHERE status = 'running')",
                    c.dialect().runs_order(),
                    c.dialect().sum_int(&format!(
                        "coalesce({}, 0) + coalesce({}, 0)",
                        c.dialect().json_int("usage", "inputTokens"),
                        c.dialect().json_int("usage", "outputTokens")
                    )),
                ),
                args![],
                |r| {
                    let n = |i: usize| -> Result<i64> { r.get(i) };
                    Ok(format!("{}.{}.{}.{}.{}.{}.{}", n(0)?, n(1)?, n(2)?, n(3)?, n(4)?, n(5)?, n(6)?))
                },
            )
        })
    }

    /// Queues a failed or expired channel delivery again, to be attempted now with a fresh
    /// deadline; its last error is kept, prefixed.
    pub fn retry_delivery(&self, id: i64, by: &str) -> Result<LedgerAct> {
        self.ledger_act(id, |tx, now| {
            tx.execute(
                "UPDATE deliveries SET status = 'queued', next_attempt_at = ?2, deadline_at = CAST(?2 AS BIGINT) + 1800000,
                     last_error = 'retried by ' || ?3 || coalesce('; before: ' || last_error, ''), updated_at = ?2
                 WHERE id = ?1 AND mode = 'channel' AND status IN ('failed', 'expired') AND payload IS NOT NULL",
                args![id, now, by],
            )
        })
    }

    /// Closes a failed, expired or undeliverable delivery as `dismissed`: nobody will try it again.
    pub fn dismiss_delivery(&self, id: i64, by: &str) -> Result<LedgerAct> {
        self.ledger_act(id, |tx, now| {
            tx.execute(
                "UPDATE deliveries SET status = ?4, updated_at = ?2,
                     last_error = 'dismissed by ' || ?3 || coalesce('; before: ' || last_error, '')
                 WHERE id = ?1 AND status IN ('failed', 'expired', 'undeliverable')",
                args![id, now, by, DeliveryStatus::Dismissed.as_str()],
            )
        })
    }

    /// Applies an operator's act, a conditional update that decides by itself (no global lock on
    /// a shared database); when it changed nothing, the status read after it says why.
    fn ledger_act(&self, id: i64, update: impl Fn(&dyn Sql, i64) -> Result<usize>) -> Result<LedgerAct> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<LedgerAct> {
            if update(tx, now_ms())? == 1 {
                return Ok(LedgerAct::Done);
            }
            let status: Option<String> =
                tx.query_row("SELECT status FROM deliveries WHERE id = ?1", args![id], |r| r.get(0)).optional()?;
            Ok(status.map_or(LedgerAct::Missing, LedgerAct::NotApplicable))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DeliveryKind;
    use serde_json::json;

    fn store_with_channel_delivery(status: DeliveryStatus) -> (tempfile::TempDir, Store, i64) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        store
            .queue_channel_delivery("r1", DeliveryKind::Reply, "agent:main:main", "slack", &json!({"text": "hi"}))
            .unwrap();
        let id = store.claim_due_deliveries(1).unwrap()[0].id;
        store.delivery_attempted(id, status, Some("HTTP 502"), None).unwrap();
        (dir, store, id)
    }

    #[test]
    fn a_failed_channel_delivery_is_queued_again_once_and_keeps_its_error() {
        let (_dir, store, id) = store_with_channel_delivery(DeliveryStatus::Failed);
        assert_eq!(store.retry_delivery(id, "operator").unwrap(), LedgerAct::Done);
        let (line, _) = store.delivery_line(id).unwrap().unwrap();
        assert_eq!(line.status, "queued");
        assert_eq!(line.last_error.as_deref(), Some("retried by operator; before: HTTP 502"));
        assert!(line.deadline_at.unwrap() > now_ms());
        assert_eq!(store.retry_delivery(id, "operator").unwrap(), LedgerAct::NotApplicable("queued".into()));
        assert_eq!(store.dismiss_delivery(id, "operator").unwrap(), LedgerAct::NotApplicable("queued".into()));
        assert_eq!(store.retry_delivery(id + 100, "operator").unwrap(), LedgerAct::Missing);
    }

    #[test]
    fn an_expired_delivery_is_dismissed_and_then_neither_act_applies() {
        let (_dir, store, id) = store_with_channel_delivery(DeliveryStatus::Expired);
        assert_eq!(store.dismiss_delivery(id, "operator").unwrap(), LedgerAct::Done);
        let (line, _) = store.delivery_line(id).unwrap().unwrap();
        assert_eq!(line.status, "dismissed");
        assert_eq!(store.retry_delivery(id, "operator").unwrap(), LedgerAct::NotApplicable("dismissed".into()));
    }
}
