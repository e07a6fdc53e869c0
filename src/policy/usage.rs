//! What an agent's usage reports may say (docs/RUNNER-PROTOCOL.md, `usage`). A report is whatever
//! the agent printed, so it is checked where it enters, like a request: every count a whole number
//! from 0 to [`MAX_RUN_TOKENS`], the cost a finite number from 0 to [`MAX_RUN_COST_USD`]. A report
//! is the run's usage *so far*, so the usage a run has reported never goes down: a field that is
//! lower than before, or not a valid number, keeps what the run reported before, and the first
//! such value is named in `rejected`. Whatever is kept is then safe for the store's sums, the
//! budgets and every read.

use serde_json::{Map, Value};

/// The most tokens of one kind one run may report: far above any real run (a million model calls
/// of a million tokens), and low enough that the totals of millions of runs fit a 64-bit integer.
pub const MAX_RUN_TOKENS: i64 = 1_000_000_000_000;

/// The most one run may report it cost, in US dollars.
pub const MAX_RUN_COST_USD: f64 = 1_000_000.0;

/// The token counts of a report.
pub const COUNT_FIELDS: [&str; 4] = ["inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens"];

/// The usage a run has reported so far, as the run keeps it.
#[derive(Debug, Default, Clone)]
pub struct UsageSoFar {
    kept: Option<Map<String, Value>>,
}

impl UsageSoFar {
    /// Takes one report and returns the run's usage so far, or `None` while no report brought a
    /// valid number (such a run counts as one that reported nothing).
    pub fn take(&mut self, report: &Value) -> Option<Value> {
        let mut kept = self.kept.take().unwrap_or_default();
        let mut valid = kept.keys().any(|k| is_amount(k));
        for field in COUNT_FIELDS {
            if let Some(v) = report.get(field) {
                valid |= keep(&mut kept, field, v, count(v));
            }
        }
        if let Some(v) = report.get("costUsd") {
            valid |= keep(&mut kept, "costUsd", v, cost(v));
        }
        if report.get("cumulative") == Some(&Value::Bool(true)) {
            kept.insert("cumulative".into(), Value::Bool(true));
        }
        kept.insert("type".into(), "usage".into());
        self.kept = Some(kept);
        valid.then(|| self.kept.clone().map(Value::Object)).flatten()
    }

    /// The first value that was not kept, with why: `inputTokens: -5 is not …`.
    pub fn rejected(&self) -> Option<&str> {
        self.kept.as_ref().and_then(|k| k.get("rejected")).and_then(Value::as_str)
    }
}

fn is_amount(field: &str) -> bool {
    field == "costUsd" || COUNT_FIELDS.contains(&field)
}

/// Keeps `parsed` in `field` unless it is lower than what is kept; a value that did not parse
/// is named in `rejected` (the first one only: a hostile agent can print millions). True when
/// the field now holds a valid amount.
fn keep(kept: &mut Map<String, Value>, field: &str, raw: &Value, parsed: Result<Value, String>) -> bool {
    match parsed {
        Ok(new) => {
            let lower = kept.get(field).and_then(Value::as_f64).zip(new.as_f64()).is_some_and(|(old, n)| n < old);
            if !lower {
                kept.insert(field.into(), new);
            }
            true
        }
        Err(allowed) => {
            if !kept.contains_key("rejected") {
                let shown: String = raw.to_string().chars().take(40).collect();
                kept.insert("rejected".into(), format!("{field}: {shown} is not {allowed}; it was ignored").into());
            }
            kept.contains_key(field)
        }
    }
}

fn count(v: &Value) -> Result<Value, String> {
    v.as_i64()
        .filter(|n| (0..=MAX_RUN_TOKENS).contains(n))
        .map(Value::from)
        .ok_or_else(|| format!("a whole number from 0 to {MAX_RUN_TOKENS}"))
}

fn cost(v: &Value) -> Result<Value, String> {
    v.as_f64()
        .filter(|c| c.is_finite() && (0.0..=MAX_RUN_COST_USD).contains(c))
        .map(Value::from)
        .ok_or_else(|| format!("a number of US dollars from 0 to {MAX_RUN_COST_USD}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(reports: &[Value]) -> (Option<Value>, Option<String>) {
        let mut so_far = UsageSoFar::default();
        let last = reports.iter().map(|r| so_far.take(r)).last().flatten();
        (last, so_far.rejected().map(String::from))
    }

    #[test]
    fn a_count_past_the_ceiling_or_negative_or_fractional_is_ignored_and_named() {
        let (usage, why) = run(&[json!({"type": "usage", "inputTokens": i64::MAX, "outputTokens": 2})]);
        assert_eq!(
            usage,
            Some(json!({"type": "usage", "outputTokens": 2,
            "rejected": "inputTokens: 9223372036854775807 is not a whole number from 0 to 1000000000000; it was ignored"}))
        );
        assert!(why.unwrap().starts_with("inputTokens: 9223372036854775807"));
        for bad in [json!(-1), json!(1.5), json!("12"), json!(1e300), json!(null), json!([1])] {
            let (usage, why) = run(&[json!({"inputTokens": bad})]);
            assert_eq!(usage, None, "{bad}: nothing valid, nothing reported");
            assert!(why.is_some(), "{bad}");
        }
    }

    #[test]
    fn a_lower_running_total_keeps_the_higher_one() {
        let reports = [
            json!({"inputTokens": 1000}),
            json!({"inputTokens": 2000}),
            json!({"inputTokens": -1_000_000}),
            json!({"inputTokens": 1500, "costUsd": 0.5}),
            json!({"costUsd": 0.25}),
        ];
        let (usage, why) = run(&reports);
        assert_eq!(
            usage.unwrap(),
            json!({"type": "usage", "inputTokens": 2000, "costUsd": 0.5,
            "rejected": "inputTokens: -1000000 is not a whole number from 0 to 1000000000000; it was ignored"})
        );
        assert!(why.is_some());
    }

    #[test]
    fn a_cost_must_be_finite_and_bounded_and_cumulative_is_kept() {
        let (usage, _) = run(&[json!({"inputTokens": 3, "costUsd": 2e6, "cumulative": true})]);
        let usage = usage.unwrap();
        assert_eq!(usage.get("costUsd"), None);
        assert_eq!(usage["cumulative"], true);
        assert_eq!(usage["inputTokens"], 3);
        let (usage, why) = run(&[json!({"inputTokens": 3, "outputTokens": 4, "cacheReadTokens": 5,
            "cacheWriteTokens": 6, "costUsd": 0.01})]);
        assert_eq!(why, None);
        assert_eq!(
            usage.unwrap(),
            json!({"type": "usage", "inputTokens": 3, "outputTokens": 4, "cacheReadTokens": 5,
            "cacheWriteTokens": 6, "costUsd": 0.01})
        );
    }
}
