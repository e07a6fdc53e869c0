//! A running run's usage as its agent reports it (docs/BEHAVIOUR.md, Budgets; RUNNER-PROTOCOL,
//! `usage`): every report is recorded on the run's row and credited to its session at once, so
//! that every read (`subagents list`, the dashboard, `/metrics`, `sessions_list`) shows a child's
//! spend while it works, not only once it ended. A report is the run's usage so far, so the
//! recorded figure only goes up, and the run's end settles at no less than it.

use serde_json::{Map, Value};

use super::Result;
use super::sql::{Dialect, Optional, Sql, Statement, args};
use crate::policy::usage::{MAX_RUN_COST_USD, MAX_RUN_TOKENS};

/// The amounts of one usage object: what the reads and the session's totals count.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Spend {
    pub input: i64,
    pub output: i64,
    pub cost: Option<f64>,
}

impl Spend {
    /// The amounts of `usage` (bounded again: these feed sums that must never overflow, whoever
    /// built the object); `cost` is the run's `cost` column, which wins over the object's.
    pub fn of(usage: Option<&Value>, cost: Option<f64>) -> Spend {
        let count =
            |k: &str| usage.and_then(|u| u.get(k)).and_then(Value::as_i64).unwrap_or(0).clamp(0, MAX_RUN_TOKENS);
        let cost = cost
            .or_else(|| usage.and_then(|u| u.get("costUsd")).and_then(Value::as_f64))
            .filter(|c| c.is_finite())
            .map(|c| c.clamp(0.0, MAX_RUN_COST_USD));
        Spend { input: count("inputTokens"), output: count("outputTokens"), cost }
    }

    /// The larger of the two, field by field.
    pub fn max(self, other: Spend) -> Spend {
        let cost = match (self.cost, other.cost) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Spend { input: self.input.max(other.input), output: self.output.max(other.output), cost }
    }

    pub fn tokens(self) -> i64 {
        self.input.saturating_add(self.output)
    }

    /// `usage` with these amounts in place of its own (the settled figure of a run whose last
    /// report was lower than an earlier one).
    pub fn written_into(self, usage: Option<&Value>) -> Value {
        let mut out = usage.and_then(Value::as_object).cloned().unwrap_or_else(|| {
            let mut m = Map::new();
            m.insert("type".into(), "usage".into());
            m
        });
        out.insert("inputTokens".into(), self.input.into());
        out.insert("outputTokens".into(), self.output.into());
        if let Some(cost) = self.cost {
            out.insert("costUsd".into(), cost.into());
        }
        Value::Object(out)
    }
}

/// The usage recorded so far on a running run: its session, and the amounts already credited.
pub(super) fn recorded(c: &dyn Sql, run_id: &str) -> Result<Option<(i64, Option<Value>, Spend)>> {
    let row: Option<(i64, Option<String>, Option<f64>)> = c
        .query_row(
            "SELECT session, usage, cost FROM runs WHERE run_id = ?1 AND status = 'running'",
            args![run_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    Ok(row.map(|(session, usage, cost)| {
        let (usage, spend) = of_run_row(usage, cost);
        (session, usage, spend)
    }))
}

/// A running run's usage and what was credited of it, from its row's `usage` and `cost`.
pub(super) fn of_run_row(usage: Option<String>, cost: Option<f64>) -> (Option<Value>, Spend) {
    let usage: Option<Value> = usage.and_then(|u| serde_json::from_str(&u).ok());
    let spend = Spend::of(usage.as_ref(), cost);
    (usage, spend)
}

/// Records a live report of a running run: the run's figure rises to it (never falls), and the
/// rise is credited to its session. Nothing for a run that is not running.
pub(super) fn record(c: &dyn Sql, run_id: &str, report: &Value) -> Result<()> {
    let Some((session, _, before)) = recorded(c, run_id)? else { return Ok(()) };
    let now = before.max(Spend::of(Some(report), None));
    if now == before {
        return Ok(());
    }
    c.execute(
        "UPDATE runs SET usage = ?2, cost = ?3 WHERE run_id = ?1",
        args![run_id, now.written_into(Some(report)).to_string(), now.cost],
    )?;
    credit(c, session, before, now)
}

/// Adds what a run spent between `before` and `now` to its session's totals.
pub(super) fn credit(c: &dyn Sql, session: i64, before: Spend, now: Spend) -> Result<()> {
    let credit = credit_statement(c.dialect(), session, before, now);
    c.execute(credit.sql(), &credit.args())?;
    Ok(())
}

/// The statement of [`credit`], for a pipeline.
pub(super) fn credit_statement(d: Dialect, session: i64, before: Spend, now: Spend) -> Statement {
    let (tin, tout) = ((now.input - before.input).max(0), (now.output - before.output).max(0));
    let cost = now.cost.map(|n| (n - before.cost.unwrap_or(0.0)).max(0.0));
    Statement::new(
        format!(
            "UPDATE sessions SET tokens_in = {}, tokens_out = {}, tokens_total = {},
                 cost = CASE WHEN CAST(?4 AS DOUBLE PRECISION) IS NULL THEN cost ELSE coalesce(cost, 0) + ?4 END
             WHERE id = ?1",
            d.saturating_add("tokens_in", "?2"),
            d.saturating_add("tokens_out", "?3"),
            d.saturating_add("tokens_total", "?2 + ?3"),
        ),
        args![session, tin, tout, cost],
    )
}

#[cfg(test)]
mod tests {
    use super::Spend;
    use serde_json::json;

    #[test]
    fn the_settled_figure_is_the_larger_of_each_field_and_keeps_the_reports_other_fields() {
        let live = Spend::of(Some(&json!({"inputTokens": 900, "outputTokens": 101, "costUsd": 0.5})), None);
        let last = Spend::of(Some(&json!({"inputTokens": 100, "outputTokens": 7, "cacheReadTokens": 3})), None);
        let settled = live.max(last);
        assert_eq!(settled, Spend { input: 900, output: 101, cost: Some(0.5) });
        assert_eq!(settled.tokens(), 1001);
        let written = settled.written_into(Some(&json!({"type": "usage", "inputTokens": 100, "cacheReadTokens": 3})));
        assert_eq!(
            written,
            json!({"type": "usage", "inputTokens": 900, "outputTokens": 101, "cacheReadTokens": 3, "costUsd": 0.5})
        );
    }

    #[test]
    fn amounts_out_of_bounds_are_bounded_and_the_cost_column_wins() {
        let s = Spend::of(Some(&json!({"inputTokens": -5, "outputTokens": i64::MAX, "costUsd": 9.0})), Some(1.5));
        assert_eq!(s, Spend { input: 0, output: crate::policy::usage::MAX_RUN_TOKENS, cost: Some(1.5) });
    }
}
