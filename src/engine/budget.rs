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
use crate::store::{Crossing, Meter, RunStatus, StoreError, Tx};

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
    Unmetered { agent: String, dim: Dim },
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
            BudgetRefusal::Unmetered { agent, dim } => format!(
                "agent \"{agent}\" runs the text runner, which reports no usage, so a {} budget cannot be kept for it; the operator can allow it with agents.defaults.subagents.allowUnmetered=true",
                dim.as_str()
            ),
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
                tx.open_budget(requester, &Limits::of(root), &[])?;
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
    if r.child_runner == RunnerKind::Text
        && !sub.allow_unmetered
        && let Some(dim) = metered_dims.into_iter().find(|d| granted.limits.get(*d).is_some() || shared.contains(d))
    {
        return Err(BudgetRefusal::Unmetered { agent: r.child_agent.to_string(), dim });
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

/// A run's budget meter: opened before the agent starts, fed every usage report, asked at the end
/// whether a cancel was the budget's.
pub struct RunMeter {
    rt: Arc<Scheduler>,
    run_id: String,
    drawing: bool,
    /// A CLI that reports its own session's running totals (Codex): what they were before this turn.
    totals_before: Option<Value>,
}

impl RunMeter {
    /// Opens the meter; `Err(text)` when an account the run would draw on has nothing left (the
    /// run then ends `budget_exceeded` without starting).
    pub fn open(
        rt: &Arc<Scheduler>,
        run_id: &str,
        session: i64,
        totals_before: Option<Value>,
    ) -> Result<Result<RunMeter, String>, StoreError> {
        let drawing = match rt.store.start_meter(run_id, session)? {
            Meter::Exhausted(x) => return Ok(Err(format!("{}; the run did not start", x.text()))),
            Meter::Drawing => true,
            Meter::Unlimited => false,
        };
        Ok(Ok(RunMeter { rt: rt.clone(), run_id: run_id.to_string(), drawing, totals_before }))
    }

    /// Whether the runner should hand usage reports over at all.
    pub fn is_drawing(&self) -> bool {
        self.drawing
    }

    /// One usage report (the run's totals so far): counted, and the runs of an account it makes
    /// cross are stopped.
    pub fn on_usage(&self, usage: &Value) {
        let (tokens, cost_micros) = spend_of(usage, self.totals_before.as_ref());
        match self.rt.store.record_usage(&self.run_id, tokens, cost_micros) {
            Ok(Some(crossing)) => stop(&self.rt, &crossing),
            Ok(None) => {}
            Err(e) => tracing::error!(run = %self.run_id, error = %e, "recording live usage failed"),
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

/// Tokens (input plus output) and micro-dollars of a usage report; a CLI's running session totals
/// count only what this turn added.
fn spend_of(usage: &Value, before: Option<&Value>) -> (i64, i64) {
    let cumulative = usage.get("cumulative") == Some(&Value::Bool(true));
    let count = |v: &Value, f: &str| v.get(f).and_then(Value::as_i64).unwrap_or(0);
    let tokens = |v: &Value| count(v, "inputTokens") + count(v, "outputTokens");
    let earlier = if cumulative { before.map_or(0, tokens) } else { 0 };
    let cost = usage.get("costUsd").and_then(Value::as_f64).map_or(0, |c| (c * 1e6).round() as i64);
    ((tokens(usage) - earlier).max(0), cost)
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
    use super::spend_of;
    use serde_json::json;

    #[test]
    fn a_report_counts_input_and_output_and_a_clis_totals_only_past_the_last_turn() {
        let usage = json!({"inputTokens": 120, "outputTokens": 30, "cacheReadTokens": 900, "costUsd": 0.0125});
        assert_eq!(spend_of(&usage, None), (150, 12_500), "cache reads are not counted");
        let totals = json!({"inputTokens": 500, "outputTokens": 100, "cumulative": true});
        let before = json!({"inputTokens": 300, "outputTokens": 50});
        assert_eq!(spend_of(&totals, Some(&before)), (250, 0));
        assert_eq!(spend_of(&json!({"inputTokens": 1, "cumulative": true}), Some(&before)), (0, 0), "never below 0");
    }
}
