//! Budgets in the engine (docs/BEHAVIOUR.md, Budgets): the reservation a spawn makes inside the
//! transaction that admits it, the live meter of a run (usage counted as it is reported; a run
//! whose account crosses its limit is stopped through the cancel path, with every other run
//! drawing on that account), and the runtime limit, checked at each scheduler tick.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::config::{Budget, Config, RunnerKind};
use crate::engine::scheduler::Scheduler;
use crate::keys::AgentId;
use crate::policy::budget::{self, Dim, Granted, Limits};
use crate::store::{Crossing, Meter, Recorded, Room, RunStatus, SessionRow, StoreError, Tx};

/// The budget a spawn asks: its own `budget`, else the child agent's configured one, else the
/// default for every spawn; none means the child shares its requester's.
pub fn asked(config: &Config, agent: &AgentId, explicit: Option<&Budget>) -> Limits {
    let per_agent = config.agent(agent).and_then(|e| e.subagents.as_ref()).and_then(|s| s.budget.as_ref());
    explicit.or(per_agent).or(config.agents.defaults.subagents.budget.as_ref()).map(Limits::of).unwrap_or_default()
}

/// What a spawn's admission decided about its budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub granted: Granted,
    /// Dimensions the child draws from its requester's accounts without a reservation.
    pub shared: Vec<Dim>,
}

impl Reserved {
    /// `{limit, clamped?, shared?}` for the spawn's answer; none when no budget applies.
    pub fn to_json(&self) -> Option<Value> {
        if self.granted.limits.is_empty() && self.shared.is_empty() {
            return None;
        }
        let names = |dims: &[Dim]| dims.iter().map(|d| d.as_str()).collect::<Vec<_>>();
        let mut out = json!({"limit": self.granted.limits.to_json()});
        if !self.granted.clamped.is_empty() {
            out["clamped"] = json!(names(&self.granted.clamped));
        }
        if !self.shared.is_empty() {
            out["shared"] = json!(names(&self.shared));
        }
        Some(out)
    }
}

/// Why a spawn's budget refused it.
#[derive(Debug)]
pub enum BudgetRefusal {
    Short(budget::Shortfall),
    Unmetered {
        agent: String,
        dim: Dim,
        /// What it runs that may report no usage.
        runner: RunnerKind,
    },
    /// The requester's tree was stopped for its budget.
    Exceeded(String),
    Store(StoreError),
}

impl From<StoreError> for BudgetRefusal {
    fn from(e: StoreError) -> Self {
        BudgetRefusal::Store(e)
    }
}

impl BudgetRefusal {
    pub fn message(&self) -> String {
        match self {
            BudgetRefusal::Short(s) => s.message(),
            BudgetRefusal::Unmetered { agent, dim, runner } => format!(
                "agent \"{agent}\" {}, so a {} budget cannot be kept for it; the operator can allow it with agents.defaults.subagents.allowUnmetered=true",
                match runner {
                    RunnerKind::A2a => "is a remote agent (A2A), whose peer need not report its usage",
                    _ => "runs the text runner, which reports no usage",
                },
                dim.as_str()
            ),
            BudgetRefusal::Exceeded(text) => {
                format!("the requester's tree is over its budget ({text}); no sub-agent can start in it")
            }
            BudgetRefusal::Store(e) => e.to_string(),
        }
    }
}

/// What a spawn's reservation needs to know.
pub struct Reservation<'a> {
    /// The requester's session row (an external caller's exists from its first call).
    pub requester: Option<i64>,
    /// The requester was not spawned: `session.budget` opens its account.
    pub requester_is_root: bool,
    pub child: i64,
    pub child_agent: &'a AgentId,
    pub asked: Limits,
    pub child_runner: RunnerKind,
}

/// Inside the spawn's transaction: the requester's accounts decide what the child gets; its
/// account opens and its budget is reserved from the accounts it draws on, or nothing happens.
pub fn reserve(tx: &Tx, config: &Config, r: &Reservation) -> Result<Reserved, BudgetRefusal> {
    let sub = &config.agents.defaults.subagents;
    let chain = match r.requester {
        Some(requester) => {
            if r.requester_is_root
                && let Some(root) = &config.session.budget
            {
                tx.set_root_budget(requester, &Limits::of(root))?;
            }
            tx.budget_chain(requester)?
        }
        None => Vec::new(),
    };
    let granted =
        budget::grant(&r.asked, &budget::left_in(&chain), sub.budget_overflow).map_err(BudgetRefusal::Short)?;
    let shared: Vec<Dim> = Dim::ALL
        .into_iter()
        .filter(|d| granted.limits.get(*d).is_none() && budget::drawn_from(&chain, *d).is_some())
        .collect();
    let metered_dims = [Dim::Tokens, Dim::CostUsd];
    if matches!(r.child_runner, RunnerKind::Text | RunnerKind::A2a)
        && !sub.allow_unmetered
        && let Some(dim) = metered_dims.into_iter().find(|d| granted.limits.get(*d).is_some() || shared.contains(d))
    {
        return Err(BudgetRefusal::Unmetered { agent: r.child_agent.to_string(), dim, runner: r.child_runner });
    }
    if !granted.limits.is_empty() {
        tx.open_budget(r.child, &granted.limits, &granted.clamped)?;
        for dim in Dim::ALL {
            if let (Some(amount), Some(from)) = (granted.limits.get(dim), budget::drawn_from(&chain, dim)) {
                tx.reserve_budget(from.session, dim, amount)?;
            }
        }
    }
    Ok(Reserved { granted, shared })
}

/// A run's meter: opened before the agent starts, fed every usage report (recorded on the run and
/// its session, and counted against the budgets it draws on), asked at the end whether a cancel
/// was the budget's.
pub struct RunMeter {
    rt: Arc<Scheduler>,
    run_id: String,
    drawing: bool,
    /// A CLI that reports its own session's running totals (Codex): what they were before this turn.
    totals_before: Option<Value>,
    /// Its reports are recorded at most once per [`LIVE_USAGE_EVERY`] (see `on_usage`).
    live: Arc<std::sync::Mutex<LiveReports>>,
}

/// The least time between two recorded reports of a run: an agent that prints usage in a tight
/// loop costs one store write per this (a row-locked transaction on its session, run and budget
/// accounts, which the other runs of its tree wait for on a shared database). For a run on no
/// budget it is also the time from its start to its first report recorded, so a run shorter than
/// this (its end records its usage) costs none.
const LIVE_USAGE_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The reports of a run not yet recorded.
struct LiveReports {
    /// When the next report may be recorded.
    due: tokio::time::Instant,
    /// The newest report not yet recorded; a write is scheduled for it at `due`.
    pending: Option<Value>,
    /// What the last recorded report left before an account the run draws on may cross: a
    /// report that reaches it is recorded at once, whatever the window.
    room: Room,
}

impl RunMeter {
    /// Opens the meter; `Err(text)` when an account the run would draw on has nothing left (the
    /// run then ends `budget_exceeded` without starting).
    pub fn open(
        rt: &Arc<Scheduler>,
        run_id: &str,
        session: &SessionRow,
        totals_before: Option<Value>,
    ) -> Result<Result<RunMeter, String>, StoreError> {
        // A root's own runs spend from its budget too, from its first run on.
        let root = rt.config.session.budget.as_ref().filter(|_| session.spawned_by.is_none()).map(Limits::of);
        let drawing = match rt.store.start_meter(run_id, session.id, root.as_ref())? {
            Meter::Exhausted(x) => return Ok(Err(format!("{}; the run did not start", x.text()))),
            Meter::Drawing => true,
            Meter::Unlimited => false,
        };
        // A run on a budget has its first report recorded at once: a run that crosses with it
        // is stopped then, not a window later.
        let first = tokio::time::Instant::now() + if drawing { std::time::Duration::ZERO } else { LIVE_USAGE_EVERY };
        let live = LiveReports { due: first, pending: None, room: Room::default() };
        let live = Arc::new(std::sync::Mutex::new(live));
        Ok(Ok(RunMeter { rt: rt.clone(), run_id: run_id.to_string(), drawing, totals_before, live }))
    }

    /// One usage report (the run's totals so far): recorded, and the runs of an account it makes
    /// cross are stopped. At most one report per [`LIVE_USAGE_EVERY`] is recorded: one that comes
    /// at least that long after the last recorded is recorded at once, the others wait for the
    /// end of the window and only the newest of them is recorded then; but a report that reaches
    /// the room the last one left ([`Room`]) is recorded at once. So a figure shows within that
    /// time of its report, a run alone on its account is stopped at the report that crosses, and
    /// runs sharing one at most that time later (an agent reporting once per model turn has
    /// every report recorded at once); the run's end records the last.
    pub fn on_usage(&self, usage: &Value) {
        let turn = turn_of(usage, self.totals_before.as_ref());
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let now = tokio::time::Instant::now();
        if (live.pending.is_none() && now >= live.due) || live.room.reached_by(&turn) {
            live.due = now + LIVE_USAGE_EVERY;
            live.pending = None; // older than this one, which is the run's usage so far
            drop(live);
            return record(&self.rt, &self.run_id, &self.live, &turn);
        }
        if live.pending.replace(turn).is_some() {
            return; // its write is already scheduled, and takes this newer report
        }
        let (rt, run_id, reports, due) = (self.rt.clone(), self.run_id.clone(), self.live.clone(), live.due);
        tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            let turn = {
                let mut live = reports.lock().unwrap_or_else(|e| e.into_inner());
                live.due = tokio::time::Instant::now() + LIVE_USAGE_EVERY;
                live.pending.take()
            };
            // A run that ended meanwhile is not running: its end recorded its usage.
            if let Some(turn) = turn {
                record(&rt, &run_id, &reports, &turn);
            }
        });
    }

    /// The run starts (`true`) or stops waiting for an answer: a runtime budget does not count
    /// the time a person takes to answer.
    pub fn on_waiting(&self, waiting: bool) {
        if !self.drawing {
            return;
        }
        if let Err(e) = self.rt.store.hold_runtime(&self.run_id, waiting) {
            tracing::error!(run = %self.run_id, error = %e, "holding the run's runtime while it waits failed");
        }
    }

    /// The status a run ends with: a cancel of a run whose account crossed is the budget's.
    pub fn outcome(&self, status: RunStatus, error: Option<String>) -> (RunStatus, Option<String>) {
        if !self.drawing || status != RunStatus::Cancelled {
            return (status, error);
        }
        match self.rt.store.run_over_budget(&self.run_id) {
            Ok(Some(x)) => (RunStatus::BudgetExceeded, Some(x.text())),
            Ok(None) => (status, error),
            Err(e) => {
                tracing::error!(run = %self.run_id, error = %e, "reading the run's budget failed");
                (status, error)
            }
        }
    }
}

/// Records one report of a running run, and stops the runs of an account it makes cross; else
/// keeps the room it leaves.
fn record(rt: &Arc<Scheduler>, run_id: &str, live: &std::sync::Mutex<LiveReports>, turn: &Value) {
    match rt.store.record_usage(run_id, turn) {
        Ok(Recorded::Crossed(crossing)) => stop(rt, &crossing),
        Ok(Recorded::Within(room)) => live.lock().unwrap_or_else(|e| e.into_inner()).room = room,
        Err(e) => tracing::error!(run = %run_id, error = %e, "recording live usage failed"),
    }
}

/// This turn's usage of a report: a CLI's running session totals count only what this turn
/// added, by the same rule the run's end records them with.
fn turn_of(usage: &Value, before: Option<&Value>) -> Value {
    let mut turn = usage.clone();
    if usage.get("cumulative") == Some(&Value::Bool(true)) {
        super::turn::turn_usage(&mut turn, before);
    }
    turn
}

/// Stops every run drawing on an account that crossed, through the cancel path.
fn stop(rt: &Scheduler, crossing: &Crossing) {
    tracing::info!(account = %crossing.account_key, runs = crossing.runs.len(), "{}", crossing.text());
    for run_id in &crossing.runs {
        if let Err(e) = rt.cancel_run(run_id) {
            tracing::error!(run = %run_id, error = %e, "stopping a run over its budget failed");
        }
    }
}

/// At each scheduler tick: the accounts whose runtime the runs drawing on them used up.
pub fn stop_overtime(rt: &Scheduler) {
    match rt.store.runtime_crossings() {
        Ok(crossings) => crossings.iter().for_each(|x| stop(rt, x)),
        Err(e) => tracing::error!(error = %e, "checking runtime budgets failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{SessionKey, SessionKind};
    use crate::store::{NewSession, Store};
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// The largest single usage report of the property below.
    const REPORT: i64 = 500;

    #[derive(Debug, Clone)]
    enum Op {
        /// A child of the `parent`-th open session, asking `tokens` (none: it shares).
        Spawn { parent: usize, tokens: Option<i64> },
        /// The `session`-th open session's run reports `delta` more tokens (a run starts first).
        Report { session: usize, delta: i64 },
        /// Its run ends.
        End { session: usize },
        /// A child whose children all closed closes (its announce).
        Close { session: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..8, proptest::option::of(1i64..6_000)).prop_map(|(parent, tokens)| Op::Spawn { parent, tokens }),
            (0usize..8, 1i64..=REPORT).prop_map(|(session, delta)| Op::Report { session, delta }),
            (0usize..8, 1i64..=REPORT).prop_map(|(session, delta)| Op::Report { session, delta }),
            (0usize..8).prop_map(|session| Op::End { session }),
            (0usize..8).prop_map(|session| Op::Close { session }),
        ]
    }

    /// One session of the model the property keeps beside the store.
    struct Node {
        id: i64,
        key: SessionKey,
        depth: i64,
        parent: Option<usize>,
        /// Its own limit and the node it was reserved from.
        own: Option<(i64, Option<usize>)>,
        closed: bool,
        run: Option<(String, i64)>,
    }

    struct World {
        store: Store,
        config: Config,
        nodes: Vec<Node>,
        /// Every token any run reported: what the tree really spent.
        spent: i64,
        /// The room the last op left, when it was a report that crossed nothing: the run's next
        /// report, with nothing else between, crosses only if it reaches it.
        room: Option<(String, Room)>,
        _dir: tempfile::TempDir,
    }

    impl World {
        fn new(budget: i64) -> World {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(&dir.path().join("s.db")).unwrap();
            let mut config = Config::default();
            config.session.budget = Some(Budget { tokens: Some(budget as u64), ..Budget::default() });
            let key = SessionKey::from_canonical("agent:main:main");
            let id = store
                .insert_session(&NewSession::new(key.clone(), AgentId::main(), SessionKind::Main, true))
                .unwrap()
                .id;
            let root = Node { id, key, depth: 0, parent: None, own: None, closed: false, run: None };
            World { store, config, nodes: vec![root], spent: 0, room: None, _dir: dir }
        }

        fn open(&self, i: usize) -> Option<usize> {
            let open: Vec<usize> = (0..self.nodes.len()).filter(|n| !self.nodes[*n].closed).collect();
            (!open.is_empty()).then(|| open[i % open.len()])
        }

        /// The nearest ancestor-or-self with an account (the root has one from its first spawn).
        fn account_of(&self, mut n: usize) -> Option<usize> {
            loop {
                if n == 0 || self.nodes[n].own.is_some() {
                    return Some(n);
                }
                n = self.nodes[n].parent?;
            }
        }

        fn spawn(&mut self, parent: usize, tokens: Option<i64>) {
            self.room = None;
            let Some(p) = self.open(parent).filter(|p| self.nodes[*p].depth < 3) else { return };
            let key = SessionKey::for_agent(&AgentId::main(), &format!("subagent:{}", uuid::Uuid::new_v4()));
            let mut new = NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false);
            new.spawned_by = Some(self.nodes[p].key.clone());
            new.spawn_depth = self.nodes[p].depth + 1;
            let asked = Limits { tokens, ..Limits::default() };
            let (parent_id, root) = (self.nodes[p].id, self.nodes[p].depth == 0);
            let config = &self.config;
            let made = self.store.write(|tx| -> Result<i64, BudgetRefusal> {
                tx.insert_session(&new)?;
                let child = tx.session_id(&key)?;
                let agent = AgentId::main();
                let r = Reservation {
                    requester: Some(parent_id),
                    requester_is_root: root,
                    child,
                    child_agent: &agent,
                    asked,
                    child_runner: RunnerKind::Jsonl,
                };
                reserve(tx, config, &r).map(|_| child)
            });
            let Ok(id) = made else { return };
            let from = self.account_of(p);
            let own = tokens.map(|t| (t, from));
            self.nodes.push(Node {
                id,
                key,
                depth: self.nodes[p].depth + 1,
                parent: Some(p),
                own,
                closed: false,
                run: None,
            });
            if let Some(f) = from {
                let a = self.store.budget_of(self.nodes[f].id).unwrap().unwrap();
                assert!(a.used().tokens <= a.limits.tokens.unwrap(), "a grant left its account over: {a:?}");
            }
        }

        fn report(&mut self, session: usize, delta: i64) {
            let room = self.room.take();
            let Some(n) = self.open(session) else { return };
            if self.nodes[n].run.is_none() {
                let run_id = uuid::Uuid::new_v4().to_string();
                let root = (n == 0).then(|| Limits::of(self.config.session.budget.as_ref().unwrap()));
                match self.store.start_meter(&run_id, self.nodes[n].id, root.as_ref()).unwrap() {
                    Meter::Exhausted(_) => return,
                    _ => self.nodes[n].run = Some((run_id, 0)),
                }
            }
            let (run_id, total) = self.nodes[n].run.clone().unwrap();
            self.spent += delta;
            self.nodes[n].run = Some((run_id.clone(), total + delta));
            let report = json!({"inputTokens": total + delta});
            let crossing = match self.store.record_usage(&run_id, &report).unwrap() {
                Recorded::Within(left) => return self.room = Some((run_id, left)),
                Recorded::Crossed(crossing) => crossing,
            };
            if let Some((same, left)) = room.filter(|(id, _)| *id == run_id) {
                assert!(left.reached_by(&report), "{report} crossed within the room {left:?} of {same}");
            }
            // The cancel path: every stopped run ends with what it reported.
            let stopped: Vec<usize> = (0..self.nodes.len())
                .filter(|m| self.nodes[*m].run.as_ref().is_some_and(|(id, _)| crossing.runs.contains(id)))
                .collect();
            assert!(stopped.contains(&n), "the crossing run is stopped: {crossing:?}");
            stopped.into_iter().for_each(|m| self.end(m));
        }

        fn end(&mut self, n: usize) {
            self.room = None;
            if let Some((run_id, _)) = self.nodes[n].run.take() {
                self.store.settle_live_for_test(&run_id).unwrap();
            }
        }

        fn close(&mut self, session: usize) {
            let Some(n) = self.open(session).filter(|n| *n != 0) else { return };
            if self.nodes.iter().any(|c| c.parent == Some(n) && !c.closed) {
                return;
            }
            self.end(n);
            self.store.mark_announced(self.nodes[n].id, false, None).unwrap();
            self.nodes[n].closed = true;
        }

        /// Every open account holds reserved exactly its open children's limits.
        fn check_reservations(&self) {
            let mut expected: HashMap<usize, i64> = HashMap::new();
            for node in self.nodes.iter().filter(|n| !n.closed) {
                if let Some((limit, Some(from))) = node.own {
                    *expected.entry(from).or_default() += limit;
                }
            }
            for (i, node) in self.nodes.iter().enumerate().filter(|(i, n)| !n.closed && (*i == 0 || n.own.is_some())) {
                let Some(a) = self.store.budget_of(node.id).unwrap() else { continue };
                assert_eq!(a.reserved.tokens, expected.get(&i).copied().unwrap_or(0), "node {i}: {a:?}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Issue 19: whatever the spawns, reports and closes, every account holds reserved exactly
        /// what its open children were granted, no grant leaves its account over, and the tree
        /// never spends more than its root's budget plus one report.
        #[test]
        fn a_tree_never_spends_past_its_root_by_more_than_one_report(
            budget in 2_000i64..20_000,
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let mut w = World::new(budget);
            for op in ops {
                match op {
                    Op::Spawn { parent, tokens } => w.spawn(parent, tokens),
                    Op::Report { session, delta } => w.report(session, delta),
                    Op::End { session } => if let Some(n) = w.open(session) { w.end(n) },
                    Op::Close { session } => w.close(session),
                }
                w.check_reservations();
                prop_assert!(w.spent <= budget + REPORT, "spent {} of {budget}", w.spent);
            }
        }

        /// Issue 34 (points 1 and 4): whatever usage an agent prints — past any integer, negative,
        /// going down, fractional, not a number — every read of the tree still answers, nothing
        /// is spent below zero, and no account's remaining ever exceeds its limit.
        #[test]
        fn hostile_usage_never_breaks_a_read_nor_raises_a_remaining_above_its_limit(
            runs in proptest::collection::vec((0usize..3, proptest::collection::vec(report(), 0..6)), 1..8),
        ) {
            let w = World::new(10_000);
            let root_key = w.nodes[0].key.clone();
            let mut sessions = vec![w.nodes[0].id];
            for i in 0..2 {
                let key = SessionKey::for_agent(&AgentId::main(), &format!("subagent:c{i}"));
                let mut new = NewSession::new(key, AgentId::main(), SessionKind::Other, false);
                new.spawned_by = Some(root_key.clone());
                new.spawn_depth = 1;
                sessions.push(w.store.insert_session(&new).unwrap().id);
            }
            let root_limits = Limits::of(w.config.session.budget.as_ref().unwrap());
            for (n, (who, reports)) in runs.iter().enumerate() {
                let root = (*who == 0).then_some(&root_limits);
                hostile_run(&w.store, sessions[*who], n, reports, root);
                for key in w.store.children(&root_key, 0).unwrap().iter().map(|c| c.key.clone()) {
                    let row = w.store.session_by_key(&key).unwrap().unwrap();
                    prop_assert!(row.tokens_in >= 0 && row.tokens_out >= 0 && row.tokens_total >= 0, "{row:?}");
                }
                w.store.tree_totals(&root_key, 0).unwrap();
                w.store.metric_counts().unwrap();
                w.store.usage_over_time(crate::store::Scope::All, 0, 3_600_000).unwrap();
                w.store.dashboard_runs(crate::store::Scope::All, 100).unwrap();
                if let Some(a) = w.store.budget_of(w.nodes[0].id).unwrap() {
                    prop_assert!(a.spent.tokens >= 0 && a.spent.cost_micros >= 0, "{a:?}");
                    prop_assert!(a.left().tokens.unwrap() <= 10_000, "remaining above the limit: {a:?}");
                }
            }
        }
    }

    /// One amount of a hostile usage report: plausible counts, and what an agent may print.
    fn amount() -> impl Strategy<Value = Value> {
        prop_oneof![
            (0i64..5_000).prop_map(Value::from),
            (-2_000_000i64..0).prop_map(Value::from),
            Just(Value::from(i64::MAX)),
            Just(Value::from(i64::MIN)),
            Just(Value::from(u64::MAX)),
            (0i64..=2 * crate::policy::usage::MAX_RUN_TOKENS).prop_map(Value::from),
            Just(json!(1e300)),
            Just(json!(-0.5)),
            (0.0f64..5.0).prop_map(Value::from),
            Just(json!("12")),
            Just(Value::Null),
        ]
    }

    fn report() -> impl Strategy<Value = Value> {
        let field = |f: &'static str| proptest::option::of(amount()).prop_map(move |v| (f, v));
        (field("inputTokens"), field("outputTokens"), field("costUsd"), any::<bool>()).prop_map(
            |(a, b, c, cumulative)| {
                let mut r = json!({"type": "usage"});
                for (f, v) in [a, b, c] {
                    if let Some(v) = v {
                        r[f] = v;
                    }
                }
                if cumulative {
                    r["cumulative"] = json!(true);
                }
                r
            },
        )
    }

    /// One run of `session` that reports `reports` through the checks a real run's reports go
    /// through (`policy::usage`, then the meter), and ends with what was kept.
    fn hostile_run(store: &Store, session: i64, n: usize, reports: &[Value], root: Option<&Limits>) {
        use crate::store::{Finished, NewRun, RunMode};
        let run_id = format!("run-{session}-{n}");
        let input = json!({"role": "user", "content": "go"});
        store.write(|tx| tx.enqueue(&NewRun::new(run_id.clone(), session, RunMode::Spawn, input))).unwrap();
        let caps = crate::store::Caps { global: 10, per_agent: Default::default(), default_agent: 10, spawns: 10 };
        store.claim_ready("owner", &caps).unwrap();
        let drawing = !matches!(store.start_meter(&run_id, session, root).unwrap(), Meter::Exhausted(_));
        let mut so_far = crate::policy::usage::UsageSoFar::default();
        let mut usage = None;
        for r in reports {
            if let Some(kept) = so_far.take(r) {
                if drawing {
                    store.record_usage(&run_id, &turn_of(&kept, None)).unwrap();
                }
                usage = Some(kept);
            }
        }
        let cost = usage.as_ref().and_then(|u| u.get("costUsd")).and_then(Value::as_f64);
        let finished = Finished {
            status: RunStatus::Ok,
            reply: Some("done".into()),
            messages: Vec::new(),
            usage,
            cost,
            model: None,
            error: None,
            exit_status: Some(0),
            external_session_id: None,
            cli_usage_total: None,
        };
        store.finish_run(&run_id, "owner", &finished).unwrap();
    }

    #[test]
    fn a_report_is_the_turns_and_a_clis_totals_count_only_past_the_last_turn() {
        let usage = json!({"inputTokens": 120, "outputTokens": 30, "cacheReadTokens": 900, "costUsd": 0.0125});
        assert_eq!(turn_of(&usage, None), usage);
        let totals = json!({"inputTokens": 500, "outputTokens": 100, "cumulative": true});
        let before = json!({"inputTokens": 300, "outputTokens": 50});
        let turn = turn_of(&totals, Some(&before));
        assert_eq!((turn["inputTokens"].as_i64(), turn["outputTokens"].as_i64()), (Some(200), Some(50)));
        assert!(turn.get("cumulative").is_none(), "{turn}");
        let below = turn_of(&json!({"inputTokens": 1, "cumulative": true}), Some(&before));
        assert_eq!(below["inputTokens"], 0, "never below 0");
    }
}
