//! Budgets (schema v7): the accounts of sessions with a budget, the reservation a spawn makes from
//! its requester's, the live usage of the runs that draw on them, and the settling of a run's
//! spend at its end and of a child's at its close. What is allowed is `policy::budget`'s to say;
//! this file reads and writes the amounts, each change in the transaction that needs it.

use super::sql::{AfterPipeline, Answer, Dialect, Optional, Row, Sql, Statement, args};

use super::{Result, Store, now_ms};
use crate::policy::budget::{self, Account, Amounts, Dim, Limits};

const ACCOUNT_COLUMNS: &str = "b.session, b.limit_tokens, b.limit_cost_micros, b.limit_runtime_ms,
    b.reserved_tokens, b.reserved_cost_micros, b.reserved_runtime_ms,
    b.spent_tokens, b.spent_cost_micros, b.spent_runtime_ms, b.exceeded, b.unmetered";

/// The columns of `budgets` holding `dim`'s reserved and spent amounts.
fn amount_columns(dim: Dim) -> (&'static str, &'static str) {
    match dim {
        Dim::Tokens => ("reserved_tokens", "spent_tokens"),
        Dim::CostUsd => ("reserved_cost_micros", "spent_cost_micros"),
        Dim::RuntimeSeconds => ("reserved_runtime_ms", "spent_runtime_ms"),
    }
}

fn account_from_row(r: &Row) -> Result<Account> {
    let exceeded: Option<String> = r.get(10)?;
    Ok(Account {
        session: r.get(0)?,
        limits: Limits { tokens: r.get(1)?, cost_micros: r.get(2)?, runtime_ms: r.get(3)? },
        reserved: Amounts { tokens: r.get(4)?, cost_micros: r.get(5)?, runtime_ms: r.get(6)? },
        spent: Amounts { tokens: r.get(7)?, cost_micros: r.get(8)?, runtime_ms: r.get(9)? },
        live: Amounts::default(),
        exceeded: exceeded.as_deref().and_then(Dim::parse),
        unmetered: r.get(11)?,
    })
}

/// What the runs drawing on `account` have used so far (their runtime up to `now`).
fn live_of(c: &dyn Sql, account: i64, now: i64) -> Result<Amounts> {
    let d = c.dialect();
    let sql = format!(
        "SELECT (SELECT {} FROM budget_live WHERE tokens_account = ?1),
                (SELECT {} FROM budget_live WHERE cost_account = ?1),
                (SELECT {} FROM budget_live WHERE runtime_account = ?1)",
        d.sum_int("tokens"),
        d.sum_int("cost_micros"),
        // A run waiting for an answer uses no runtime meanwhile: its time stops at `waiting_since`.
        d.sum_int(&format!("{}(coalesce(waiting_since, ?2) - started_at, 0)", d.greatest()))
    );
    c.query_row(&sql, args![account, now], |r| {
        Ok(Amounts { tokens: r.get(0)?, cost_micros: r.get(1)?, runtime_ms: r.get(2)? })
    })
}

pub(super) fn account(c: &dyn Sql, session: i64, now: i64) -> Result<Option<Account>> {
    let sql = format!("SELECT {ACCOUNT_COLUMNS} FROM budgets b WHERE b.session = ?1");
    let Some(mut a) = c.query_row(&sql, args![session], account_from_row).optional()? else {
        return Ok(None);
    };
    a.live = live_of(c, session, now)?;
    Ok(Some(a))
}

/// The session's own account and its ancestors', nearest first.
pub(super) fn chain(c: &dyn Sql, session: i64, now: i64) -> Result<Vec<Account>> {
    let sql = format!(
        "SELECT {ACCOUNT_COLUMNS} FROM budgets b JOIN sessions s ON s.id = b.session
         WHERE b.session = ?1 OR b.session IN (SELECT ancestor FROM session_tree WHERE session = ?1)
         ORDER BY b.session = ?1 DESC, s.spawn_depth DESC"
    );
    let mut accounts: Vec<Account> = c.query_map(&sql, args![session], account_from_row)?;
    for a in &mut accounts {
        a.live = live_of(c, a.session, now)?;
    }
    Ok(accounts)
}

/// Locks, on a shared database, the budget accounts on the chains of the sessions `sessions`
/// selects (a subquery of one column, over `args`): each one's own account and its ancestors',
/// in one statement, root to leaf (`spawn_depth`, then id: one order for every writer), for
/// the rest of the write transaction. Every writer that changes an account's amounts, or
/// decides on them (a run's start, live reports and end, a spawn's reservation, a child's
/// close, the runtime check), holds its accounts first: such writers in one tree take turns,
/// and trees apart never wait on each other. SQLite has one writer: nothing to do.
fn lock_chains(c: &dyn Sql, sessions: &str, args: &[&dyn super::sql::Arg]) -> Result<()> {
    if let Some(lock) = lock_chains_statement(c.dialect(), sessions, args) {
        c.query_map(lock.sql(), &lock.args(), |_| Ok(()))?;
    }
    Ok(())
}

/// The statement of [`lock_chains`], for a pipeline; None on SQLite.
fn lock_chains_statement(d: Dialect, sessions: &str, args: &[&dyn super::sql::Arg]) -> Option<Statement> {
    let sql = format!(
        "SELECT b.session FROM budgets b JOIN sessions s ON s.id = b.session
         WHERE b.session IN ({sessions})
            OR b.session IN (SELECT t.ancestor FROM session_tree t WHERE t.session IN ({sessions}))
         ORDER BY s.spawn_depth, b.session FOR UPDATE OF b"
    );
    (d == Dialect::Postgres).then(|| Statement::new(sql, args))
}

/// Locks the accounts of `session`'s chain ([`lock_chains`]).
pub(super) fn lock_accounts(c: &dyn Sql, session: i64) -> Result<()> {
    lock_chains(c, "SELECT CAST(?1 AS BIGINT)", args![session])
}

/// Locks the accounts a live run draws on, and the rest of its chain ([`lock_chains`]).
fn lock_accounts_of_run(c: &dyn Sql, run_id: &str) -> Result<()> {
    lock_chains(c, LIVE_RUN_SESSION, args![run_id])
}

/// The session of live run `?1`, whose chain [`lock_accounts_of_run`] locks.
const LIVE_RUN_SESSION: &str = "SELECT session FROM budget_live WHERE run_id = ?1";

/// The statement of [`lock_accounts_of_run`], for a pipeline (None on SQLite).
pub(super) fn lock_accounts_of_run_statement(d: Dialect, run_id: &str) -> Option<Statement> {
    lock_chains_statement(d, LIVE_RUN_SESSION, args![run_id])
}

/// Opens a child's account at its spawn.
pub(super) fn open_account(c: &dyn Sql, session: i64, limits: &Limits, clamped: &[Dim]) -> Result<()> {
    let clamped = (!clamped.is_empty()).then(|| clamped.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(","));
    c.execute(
        "INSERT INTO budgets (session, limit_tokens, limit_cost_micros, limit_runtime_ms, clamped, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        args![session, limits.tokens, limits.cost_micros, limits.runtime_ms, clamped, now_ms()],
    )?;
    Ok(())
}

/// Opens a root's account with the configured limits, or brings an open one to them: a changed
/// `session.budget` applies at the root's next spawn, and clears an exceeded mark (the operator
/// gave it more, or less, on purpose).
pub(super) fn set_root_account(c: &dyn Sql, session: i64, limits: &Limits) -> Result<()> {
    c.execute(
        "INSERT INTO budgets (session, limit_tokens, limit_cost_micros, limit_runtime_ms, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (session) DO UPDATE SET limit_tokens = excluded.limit_tokens,
             limit_cost_micros = excluded.limit_cost_micros, limit_runtime_ms = excluded.limit_runtime_ms,
             exceeded = NULL, exceeded_at = NULL
         WHERE budgets.limit_tokens IS DISTINCT FROM excluded.limit_tokens
             OR budgets.limit_cost_micros IS DISTINCT FROM excluded.limit_cost_micros
             OR budgets.limit_runtime_ms IS DISTINCT FROM excluded.limit_runtime_ms",
        args![session, limits.tokens, limits.cost_micros, limits.runtime_ms, now_ms()],
    )?;
    Ok(())
}

/// Adds `amount` of `dim` to what `account` holds reserved for its children.
pub(super) fn reserve(c: &dyn Sql, account: i64, dim: Dim, amount: i64) -> Result<()> {
    let (reserved, _) = amount_columns(dim);
    c.execute(&format!("UPDATE budgets SET {reserved} = {reserved} + ?2 WHERE session = ?1"), args![account, amount])?;
    Ok(())
}

/// A limit crossed: which account, by how much, and the runs drawing on it then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossing {
    pub dim: Dim,
    pub account_key: String,
    pub used: i64,
    pub limit: i64,
    pub runs: Vec<String>,
}

impl Crossing {
    /// `budget exceeded: 10,480 tokens of 10,000 tokens (the budget of KEY)`.
    pub fn text(&self) -> String {
        format!(
            "budget exceeded: {} of {} (the budget of {})",
            self.dim.show(self.used),
            self.dim.show(self.limit),
            self.account_key
        )
    }
}

/// What a recorded usage report leaves a run before it may take an account it draws on over its
/// limit: the token count and cost (micro-USD) a later report of the run would have to reach.
/// The engine records a report at once when it reaches this, and otherwise may hold it to the end
/// of its window (`engine::budget`, one write per 250 ms): another run drawing on the account may
/// have used some of the room since, which is found by that run's report or this run's next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Room {
    tokens_at: Option<i64>,
    cost_micros_at: Option<i64>,
}

impl Room {
    /// Whether `report` (the run's usage so far) may take an account over its limit.
    pub fn reached_by(&self, report: &serde_json::Value) -> bool {
        let spend = super::live_usage::Spend::of(Some(report), None);
        let micros = spend.cost.map_or(0, budget::micros);
        self.tokens_at.is_some_and(|at| spend.tokens() >= at) || self.cost_micros_at.is_some_and(|at| micros >= at)
    }
}

/// What recording a usage report found ([`Store::record_usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// An account crossed its limit: the runs to stop.
    Crossed(Crossing),
    /// None did; what is left before one may.
    Within(Room),
}

/// How a run may start, for its budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Meter {
    /// No account limits it.
    Unlimited,
    /// It draws on accounts; its usage counts live.
    Drawing,
    /// An account it would draw on has nothing left: it does not start.
    Exhausted(Crossing),
}

/// For each dimension, the account (session row id) a run draws it from, if any.
type Draws = [(Dim, Option<i64>); 3];

/// For each dimension, the account `chain` draws it from.
fn draws(chain: &[Account]) -> Draws {
    Dim::ALL.map(|d| (d, budget::drawn_from(chain, d).map(|a| a.session)))
}

fn key_of(c: &dyn Sql, session: i64) -> Result<String> {
    c.query_row("SELECT key FROM sessions WHERE id = ?1", args![session], |r| r.get(0))
}

/// If `a` is over its limit in `dim` (or, with `at_limit`, has nothing left), the crossing, with
/// the live runs of its subtree: any of them spending on would add to its excess (a child within
/// its reservation included, once it overshoots that), so all stop.
fn crossing(c: &dyn Sql, a: &Account, dim: Dim, at_limit: bool) -> Result<Option<Crossing>> {
    let (Some(limit), used) = (a.limits.get(dim), a.used().get(dim)) else { return Ok(None) };
    if used < limit || (used == limit && !at_limit) {
        return Ok(None);
    }
    Ok(Some(Crossing { dim, account_key: key_of(c, a.session)?, used, limit, runs: subtree_runs(c, a.session)? }))
}

/// The nearest account of `chain` marked exceeded, as a crossing.
pub(super) fn exceeded_in(c: &dyn Sql, chain: &[Account]) -> Result<Option<Crossing>> {
    let Some((a, dim)) = chain.iter().find_map(|a| a.exceeded.map(|d| (a, d))) else { return Ok(None) };
    let (used, limit) = (a.used().get(dim), a.limits.get(dim).unwrap_or(0));
    Ok(Some(Crossing { dim, account_key: key_of(c, a.session)?, used, limit, runs: vec![] }))
}

/// Records the first dimension an account crossed.
fn mark_exceeded(c: &dyn Sql, account: i64, dim: Dim, now: i64) -> Result<()> {
    c.execute(
        "UPDATE budgets SET exceeded = ?2, exceeded_at = ?3 WHERE session = ?1 AND exceeded IS NULL",
        args![account, dim.as_str(), now],
    )?;
    Ok(())
}

/// The first crossing among the accounts a run draws on. An account over its limit is over its
/// reservation in the account above it, which answers for the excess: an ancestor the excess
/// pushes over its own limit is crossed too, and the highest such one stops its whole subtree, so
/// that no part of a tree keeps spending once its root is spent: the tree then overspends its
/// root by at most the one report that crossed (and what runs report before their cancel lands).
///
/// With none, the room left: for tokens and cost, what the run has recorded (`recorded`) plus
/// what its account has left (an account's limit is crossed only above it; the excess of one
/// below its limit reaches no ancestor).
fn first_crossing(c: &dyn Sql, draws: &[(Dim, Option<i64>)], recorded: Amounts, now: i64) -> Result<Recorded> {
    let mut room = Room::default();
    for (dim, account_id) in draws {
        let Some(a) = account_id.map(|id| account(c, id, now)).transpose()?.flatten() else { continue };
        let Some(mut x) = crossing(c, &a, *dim, false)? else {
            let at = a.limits.get(*dim).map(|limit| recorded.get(*dim).saturating_add(limit - a.used().get(*dim)));
            match dim {
                Dim::Tokens => room.tokens_at = at,
                Dim::CostUsd => room.cost_micros_at = at,
                Dim::RuntimeSeconds => {} // checked at every tick, not by reports
            }
            continue;
        };
        mark_exceeded(c, a.session, *dim, now)?;
        if let Some(top) = over_ancestor(c, &a, *dim, now)? {
            x = Crossing {
                account_key: key_of(c, top.session)?,
                used: top.used.get(*dim) + top.excess,
                limit: top.limits.get(*dim).unwrap_or(0),
                runs: subtree_runs(c, top.session)?,
                dim: *dim,
            };
        }
        return Ok(Recorded::Crossed(x));
    }
    Ok(Recorded::Within(room))
}

/// An ancestor account pushed over its limit by the excess of one below it.
struct Over {
    session: i64,
    limits: Limits,
    used: Amounts,
    /// The excess it answers for, from below (not yet in its own amounts).
    excess: i64,
}

/// Walks up from `a` (over its limit in `dim`) while the excess pushes each account that limits
/// `dim` over its own; marks them exceeded and returns the highest.
fn over_ancestor(c: &dyn Sql, a: &Account, dim: Dim, now: i64) -> Result<Option<Over>> {
    let Some(limit) = a.limits.get(dim) else { return Ok(None) };
    let mut excess = a.used().get(dim) - limit;
    let mut top = None;
    for p in chain(c, a.session, now)?.into_iter().skip(1) {
        let Some(p_limit) = p.limits.get(dim) else { continue };
        let over = p.used().get(dim) + excess - p_limit;
        if over <= 0 {
            break;
        }
        mark_exceeded(c, p.session, dim, now)?;
        top = Some(Over { session: p.session, limits: p.limits, used: p.used(), excess });
        excess = over;
    }
    Ok(top)
}

/// The live runs of a session and of its descendants.
fn subtree_runs(c: &dyn Sql, session: i64) -> Result<Vec<String>> {
    c.query_map(
        "SELECT run_id FROM budget_live WHERE session = ?1
            OR session IN (SELECT session FROM session_tree WHERE ancestor = ?1) ORDER BY run_id",
        args![session],
        |r| r.get(0),
    )
}

/// Settles a run's spend into the accounts it drew on and drops its live row, in the transaction
/// that records its end: `usage` is its final (tokens, micro-dollars), else what it reported live.
pub(super) fn settle_run(c: &dyn Sql, run_id: &str, usage: Option<(i64, i64)>, now: i64) -> Result<()> {
    let mut reads: Vec<Statement> = lock_accounts_of_run_statement(c.dialect(), run_id).into_iter().collect();
    reads.push(LiveDraw::read(run_id, now));
    let answers = c.pipeline(&reads, AfterPipeline::Open)?;
    let Some(draw) = LiveDraw::of(answers.last())? else { return Ok(()) };
    c.pipeline(&draw.settling(c.dialect(), run_id, usage), AfterPipeline::Open)?;
    draw.mark_crossings(c, now)
}

/// What a live run drew on and has used, as its end settles it ([`settle_run`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct LiveDraw {
    /// The accounts it draws tokens, cost and runtime from.
    accounts: [Option<i64>; 3],
    tokens: i64,
    cost_micros: i64,
    /// Whether its agent reported usage while it ran.
    reported: bool,
    /// How long it ran up to the settle, its waits for answers left out.
    ran_ms: i64,
}

impl LiveDraw {
    /// The read of a run's live row at `now`: after its accounts are locked
    /// ([`lock_accounts_of_run_statement`]), which every writer of that row holds.
    pub fn read(run_id: &str, now: i64) -> Statement {
        Statement::new(
            "SELECT tokens_account, cost_account, runtime_account, tokens, cost_micros, reported,
                 coalesce(waiting_since, ?2) - started_at
             FROM budget_live WHERE run_id = ?1",
            args![run_id, now],
        )
    }

    /// The draw [`LiveDraw::read`] answered; None for a run that draws on no account.
    pub fn of(answer: Option<&Answer>) -> Result<Option<LiveDraw>> {
        let Some(r) = answer.and_then(|a| a.rows.first()) else { return Ok(None) };
        Ok(Some(LiveDraw {
            accounts: [r.get(0)?, r.get(1)?, r.get(2)?],
            tokens: r.get(3)?,
            cost_micros: r.get(4)?,
            reported: r.get(5)?,
            ran_ms: r.get(6)?,
        }))
    }

    /// The writes that settle it: its live row dropped, its spend added to the accounts it drew
    /// on, the ones it never reported to marked unmetered.
    pub fn settling(&self, d: Dialect, run_id: &str, usage: Option<(i64, i64)>) -> Vec<Statement> {
        let [tokens_acct, cost_acct, runtime_acct] = self.accounts;
        let mut writes = vec![Statement::new("DELETE FROM budget_live WHERE run_id = ?1", args![run_id])];
        // A run's final count never settles below what it reported live: usage is a running
        // total, and the budget already saw (and may have stopped runs on) the higher figure.
        let (tokens, cost) =
            usage.map_or((self.tokens, self.cost_micros), |(t, c)| (t.max(self.tokens), c.max(self.cost_micros)));
        let spend = [(Dim::Tokens, tokens_acct, tokens), (Dim::CostUsd, cost_acct, cost)];
        for (dim, account, amount) in spend.into_iter().chain([(Dim::RuntimeSeconds, runtime_acct, self.ran_ms.max(0))])
        {
            let Some(account) = account else { continue };
            let (_, spent) = amount_columns(dim);
            let add = d.saturating_add(spent, "?2");
            writes.push(Statement::new(
                format!("UPDATE budgets SET {spent} = {add} WHERE session = ?1"),
                args![account, amount.max(0)],
            ));
        }
        if usage.is_none() && !self.reported {
            for account in [tokens_acct, cost_acct].into_iter().flatten() {
                writes.push(Statement::new("UPDATE budgets SET unmetered = 1 WHERE session = ?1", args![account]));
            }
        }
        writes
    }

    /// Once [`LiveDraw::settling`] ran: a final count above the last live one crosses a limit
    /// as a live report would, and is recorded as such.
    pub fn mark_crossings(&self, c: &dyn Sql, now: i64) -> Result<()> {
        let [tokens_acct, cost_acct, runtime_acct] = self.accounts;
        let draws = [(Dim::Tokens, tokens_acct), (Dim::CostUsd, cost_acct), (Dim::RuntimeSeconds, runtime_acct)];
        first_crossing(c, &draws, Amounts::default(), now)?;
        Ok(())
    }
}

/// A child's flow ended: its account closes, and what it used — its spend, plus what its own open
/// children still hold reserved, counted as spent so that they never make its requester's tree
/// overspend — moves from reserved to spent in the accounts it reserved from.
pub(super) fn close_account(c: &dyn Sql, session: i64) -> Result<()> {
    lock_accounts(c, session)?;
    let now = now_ms();
    let closed =
        c.execute("UPDATE budgets SET closed_at = ?2 WHERE session = ?1 AND closed_at IS NULL", args![session, now])?;
    if closed == 0 {
        return Ok(());
    }
    let accounts = chain(c, session, now)?;
    let Some((own, above)) = accounts.split_first().filter(|(own, _)| own.session == session) else { return Ok(()) };
    let used = own.used();
    for dim in Dim::ALL {
        let (Some(limit), Some(from)) = (own.limits.get(dim), budget::drawn_from(above, dim)) else { continue };
        let (reserved, spent) = amount_columns(dim);
        c.execute(
            &format!(
                "UPDATE budgets SET {reserved} = {greatest}({reserved} - ?2, 0), {spent} = {add} WHERE session = ?1",
                greatest = c.dialect().greatest(),
                add = c.dialect().saturating_add(spent, "?3")
            ),
            args![from.session, limit, used.get(dim).max(0)],
        )?;
    }
    Ok(())
}

impl Store {
    /// Before a run starts: whether it draws on a budget, and if one it would draw on has nothing
    /// left. A drawing run gets its live row here. `root`: the session is a root with these
    /// configured limits, whose account opens (or is brought to them) first.
    pub fn start_meter(&self, run_id: &str, session: i64, root: Option<&Limits>) -> Result<Meter> {
        // Most runs draw on no budget: a read says so without taking the writer.
        if root.is_none() && self.read(|c| chain(c, session, now_ms()))?.is_empty() {
            return Ok(Meter::Unlimited);
        }
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<Meter> {
            let now = now_ms();
            // A root's account is the only one of its chain: its upsert locks it.
            match root {
                Some(limits) => set_root_account(tx, session, limits)?,
                None => lock_accounts(tx, session)?,
            }
            let accounts = chain(tx, session, now)?;
            let draws = draws(&accounts);
            if draws.iter().all(|(_, a)| a.is_none()) {
                return Ok(Meter::Unlimited);
            }
            // Nothing starts in a tree an exceeded account is part of, nor on an account spent to its limit.
            if let Some(x) = exceeded_in(tx, &accounts)? {
                return Ok(Meter::Exhausted(x));
            }
            for (dim, id) in &draws {
                let Some(a) = id.and_then(|id| accounts.iter().find(|a| a.session == id)) else { continue };
                if let Some(x) = crossing(tx, a, *dim, true)? {
                    return Ok(Meter::Exhausted(x));
                }
            }
            tx.execute(
                "INSERT INTO budget_live (run_id, session, tokens_account, cost_account, runtime_account, started_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (run_id) DO UPDATE SET session = excluded.session,
                     tokens_account = excluded.tokens_account, cost_account = excluded.cost_account,
                     runtime_account = excluded.runtime_account, started_at = excluded.started_at,
                     tokens = 0, cost_micros = 0, reported = 0, waiting_since = NULL",
                args![run_id, session, draws[0].1, draws[1].1, draws[2].1, now],
            )?;
            Ok(Meter::Drawing)
        })
    }

    /// A live usage report of a running run (this turn's usage so far): recorded on the run and
    /// its session (`live_usage`), and, when the run draws on a budget, the first limit it makes
    /// an account cross, with the runs to stop, or the room it leaves.
    pub fn record_usage(&self, run_id: &str, report: &serde_json::Value) -> Result<Recorded> {
        let spend = super::live_usage::Spend::of(Some(report), None);
        let (tokens, cost_micros) = (spend.tokens(), spend.cost.map_or(0, crate::policy::budget::micros));
        // Session row, run row, accounts: the order of a run's end (`finish_run`).
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<Recorded> {
            super::run_queue::lock_session_of_run(tx, run_id)?;
            lock_accounts_of_run(tx, run_id)?;
            super::live_usage::record(tx, run_id, report)?;
            // The run's live row, as this report leaves it: none when it draws on no budget.
            let live = tx
                .query_row(
                    &format!(
                        "UPDATE budget_live SET tokens = {g}(tokens, ?2), cost_micros = {g}(cost_micros, ?3), reported = 1
                         WHERE run_id = ?1
                         RETURNING tokens, cost_micros, tokens_account, cost_account, runtime_account",
                        g = tx.dialect().greatest()
                    ),
                    args![run_id, tokens, cost_micros],
                    |r| {
                        let recorded = Amounts { tokens: r.get(0)?, cost_micros: r.get(1)?, runtime_ms: 0 };
                        let draws: Draws =
                            [(Dim::Tokens, r.get(2)?), (Dim::CostUsd, r.get(3)?), (Dim::RuntimeSeconds, r.get(4)?)];
                        Ok((recorded, draws))
                    },
                )
                .optional()?;
            let Some((recorded, draws)) = live else { return Ok(Recorded::Within(Room::default())) };
            first_crossing(tx, &draws, recorded, now_ms())
        })
    }

    /// A live run starts (`true`) or stops waiting for an answer: while it waits its runtime
    /// stands still; when it stops, its start moves later by the time waited.
    pub fn hold_runtime(&self, run_id: &str, waiting: bool) -> Result<()> {
        // Its runtime counts in the sums its accounts are checked against: they are locked first.
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<()> {
            lock_accounts_of_run(tx, run_id)?;
            let now = now_ms();
            let sql = if waiting {
                "UPDATE budget_live SET waiting_since = ?2 WHERE run_id = ?1 AND waiting_since IS NULL"
            } else {
                "UPDATE budget_live SET started_at = started_at + (?2 - waiting_since), waiting_since = NULL
                 WHERE run_id = ?1 AND waiting_since IS NOT NULL"
            };
            tx.execute(sql, args![run_id, now])?;
            Ok(())
        })
    }

    /// Accounts whose runtime limit the runs drawing on them crossed by now.
    pub fn runtime_crossings(&self) -> Result<Vec<Crossing>> {
        // Every tick asks; only a live run with a runtime limit makes it take the writer.
        let limited = self.read(|c| {
            c.query_row("SELECT EXISTS (SELECT 1 FROM budget_live WHERE runtime_account IS NOT NULL)", args![], |r| {
                r.get::<bool>(0)
            })
        })?;
        if !limited {
            return Ok(Vec::new());
        }
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| -> Result<Vec<Crossing>> {
            let drawing = "SELECT runtime_account FROM budget_live WHERE runtime_account IS NOT NULL";
            lock_chains(tx, drawing, args![])?;
            let now = now_ms();
            let ids: Vec<i64> = tx.query_map(
                "SELECT DISTINCT runtime_account FROM budget_live WHERE runtime_account IS NOT NULL",
                args![],
                |r| r.get(0),
            )?;
            let mut out = Vec::new();
            for id in ids {
                let Some(a) = account(tx, id, now)? else { continue };
                if let Some(x) = crossing(tx, &a, Dim::RuntimeSeconds, false)? {
                    mark_exceeded(tx, id, Dim::RuntimeSeconds, now)?;
                    out.push(x);
                }
            }
            Ok(out)
        })
    }

    /// Whether a running run is in a tree whose budget was exceeded (its own account or an
    /// ancestor's, nearest first): that crossing, if so.
    pub fn run_over_budget(&self, run_id: &str) -> Result<Option<Crossing>> {
        self.read(|c| {
            let session: Option<i64> = c
                .query_row("SELECT session FROM budget_live WHERE run_id = ?1", args![run_id], |r| r.get(0))
                .optional()?;
            let Some(session) = session else { return Ok(None) };
            exceeded_in(c, &chain(c, session, now_ms())?)
        })
    }

    /// A session's own account, as it stands now.
    pub fn budget_of(&self, session: i64) -> Result<Option<Account>> {
        self.read(|c| account(c, session, now_ms()))
    }

    /// The account `session` draws each dimension from (its own, else the nearest ancestor's).
    pub fn budget_chain(&self, session: i64) -> Result<Vec<Account>> {
        self.read(|c| chain(c, session, now_ms()))
    }
}

#[cfg(test)]
impl Store {
    /// Settles a live run as its end would, with what it reported (the property tests' runs have
    /// no runs rows to finish).
    pub fn settle_live_for_test(&self, run_id: &str) -> Result<()> {
        self.write_sql(|tx| -> Result<()> { settle_run(tx, run_id, None, now_ms()) })
    }
}
