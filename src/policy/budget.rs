//! Budgets for spawn trees: what a child may be granted from what its requester's accounts have
//! left, and when spending crosses a limit. Pure arithmetic over amounts the store reads, so the
//! spawn's reservation, the live stop and every view decide the same way.
//!
//! Amounts are integers in stored units — tokens, micro-dollars, milliseconds — so that sums are
//! exact and a comparison never depends on float rounding.

use serde_json::{Value, json};

use crate::config::{Budget, BudgetOverflow};

/// What a budget limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dim {
    /// Input plus output tokens.
    Tokens,
    CostUsd,
    /// Wall time of the runs that draw on it, added up (two runs at once count twice).
    RuntimeSeconds,
}

impl Dim {
    pub const ALL: [Dim; 3] = [Dim::Tokens, Dim::CostUsd, Dim::RuntimeSeconds];

    /// The field's name in `budget` objects.
    pub fn as_str(self) -> &'static str {
        match self {
            Dim::Tokens => "tokens",
            Dim::CostUsd => "costUsd",
            Dim::RuntimeSeconds => "runtimeSeconds",
        }
    }

    pub fn parse(s: &str) -> Option<Dim> {
        Dim::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// An amount for people: `12,000 tokens`, `$0.5000`, `30.0s`.
    pub fn show(self, amount: i64) -> String {
        match self {
            Dim::Tokens if amount == 1 => "1 token".to_string(),
            Dim::Tokens => format!("{} tokens", thousands(amount)),
            Dim::CostUsd => format!("${:.4}", amount as f64 / 1e6),
            Dim::RuntimeSeconds => format!("{:.1}s", amount as f64 / 1e3),
        }
    }

    /// Spent against a limit, for people: `4,200/10,000 tokens`, `$0.0100/$0.5000`, `12.0s/60.0s`.
    pub fn show_of(self, spent: i64, limit: i64) -> String {
        match self {
            Dim::Tokens => format!("{}/{} tokens", thousands(spent), thousands(limit)),
            _ => format!("{}/{}", self.show(spent), self.show(limit)),
        }
    }

    /// An amount in the field's own unit, as JSON: tokens, dollars, seconds.
    pub fn to_field(self, amount: i64) -> Value {
        match self {
            Dim::Tokens => json!(amount),
            Dim::CostUsd => json!(amount as f64 / 1e6),
            Dim::RuntimeSeconds => json!(amount as f64 / 1e3),
        }
    }
}

fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// US dollars in the stored unit, micro-dollars.
pub fn micros(usd: f64) -> i64 {
    (usd * 1e6).round() as i64
}

/// One amount per dimension, in stored units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    pub tokens: i64,
    pub cost_micros: i64,
    pub runtime_ms: i64,
}

impl Amounts {
    pub fn get(&self, dim: Dim) -> i64 {
        match dim {
            Dim::Tokens => self.tokens,
            Dim::CostUsd => self.cost_micros,
            Dim::RuntimeSeconds => self.runtime_ms,
        }
    }

    pub fn plus(self, other: Amounts) -> Amounts {
        Amounts {
            tokens: self.tokens.saturating_add(other.tokens),
            cost_micros: self.cost_micros.saturating_add(other.cost_micros),
            runtime_ms: self.runtime_ms.saturating_add(other.runtime_ms),
        }
    }

    /// Only the dimensions `limits` limits, in their fields' units.
    pub fn to_json(&self, limits: &Limits) -> Value {
        let fields = Dim::ALL.into_iter().filter(|d| limits.get(*d).is_some());
        Value::Object(fields.map(|d| (d.as_str().to_string(), d.to_field(self.get(d)))).collect())
    }
}

/// A limit per dimension; `None`: not limited by this account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub tokens: Option<i64>,
    pub cost_micros: Option<i64>,
    pub runtime_ms: Option<i64>,
}

impl Limits {
    /// A configured or asked budget (validated: every amount positive and finite).
    pub fn of(b: &Budget) -> Limits {
        Limits {
            tokens: b.tokens.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
            cost_micros: b.cost_usd.map(micros),
            runtime_ms: b.runtime_seconds.map(|s| (s * 1e3).round() as i64),
        }
    }

    pub fn get(&self, dim: Dim) -> Option<i64> {
        match dim {
            Dim::Tokens => self.tokens,
            Dim::CostUsd => self.cost_micros,
            Dim::RuntimeSeconds => self.runtime_ms,
        }
    }

    fn set(&mut self, dim: Dim, value: Option<i64>) {
        match dim {
            Dim::Tokens => self.tokens = value,
            Dim::CostUsd => self.cost_micros = value,
            Dim::RuntimeSeconds => self.runtime_ms = value,
        }
    }

    pub fn is_empty(&self) -> bool {
        Dim::ALL.into_iter().all(|d| self.get(d).is_none())
    }

    /// The limited dimensions, in their fields' units.
    pub fn to_json(&self) -> Value {
        let fields = Dim::ALL.into_iter().filter_map(|d| self.get(d).map(|v| (d.as_str().to_string(), d.to_field(v))));
        Value::Object(fields.collect())
    }
}

/// A session with a budget, as the store read it inside the transaction that decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Account {
    /// The session's row id.
    pub session: i64,
    pub limits: Limits,
    /// What open children with budgets of their own reserved from it.
    pub reserved: Amounts,
    /// Settled: ended runs that drew on it, and the whole spend of reserved children that closed.
    pub spent: Amounts,
    /// The runs drawing on it now, so far (runtime up to the moment it was read).
    pub live: Amounts,
    /// The first dimension that crossed its limit, once one did.
    pub exceeded: Option<Dim>,
    /// A run that drew on it reported no usage.
    pub unmetered: bool,
}

impl Account {
    /// What it spent (its settled spend and its running runs'), per limited dimension, against
    /// the limit: `budget 4,200/10,000 tokens, $0.0100/$0.5000`, marked `(unmetered)` when a run
    /// drawing on it reported no usage.
    pub fn spent_text(&self) -> String {
        let spent = self.spent.plus(self.live);
        let dims = Dim::ALL.into_iter().filter_map(|d| self.limits.get(d).map(|l| d.show_of(spent.get(d), l)));
        let unmetered = if self.unmetered { " (unmetered)" } else { "" };
        format!("budget {}{unmetered}", dims.collect::<Vec<_>>().join(", "))
    }

    /// Spent, running and reserved: what the account answers for.
    pub fn used(&self) -> Amounts {
        self.spent.plus(self.live).plus(self.reserved)
    }

    /// Per limited dimension, what is left (zero or less when spent); never more than the limit,
    /// whatever was stored.
    pub fn left(&self) -> Limits {
        let used = self.used();
        let mut left = Limits::default();
        for d in Dim::ALL {
            left.set(d, self.limits.get(d).map(|l| l.saturating_sub(used.get(d).max(0))));
        }
        left
    }

    /// `{limit, spent, reserved, remaining, exceeded?, unmetered?}`, each in the fields' units
    /// and over the limited dimensions only.
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "limit": self.limits.to_json(),
            "spent": self.spent.plus(self.live).to_json(&self.limits),
            "reserved": self.reserved.to_json(&self.limits),
            "remaining": self.left().to_json(),
        });
        if let Some(d) = self.exceeded {
            out["exceeded"] = json!(d.as_str());
        }
        if self.unmetered {
            out["unmetered"] = json!(true);
        }
        out
    }

    /// The first limited dimension whose use is over its limit (reaching it exactly is within).
    pub fn crossed(&self) -> Option<Dim> {
        let used = self.used();
        Dim::ALL.into_iter().find(|d| self.limits.get(*d).is_some_and(|l| used.get(*d) > l))
    }
}

/// For `dim`, the account a session draws on: the nearest of `chain` (the session's own account
/// first, then its ancestors' nearest first) that limits it.
pub fn drawn_from(chain: &[Account], dim: Dim) -> Option<&Account> {
    chain.iter().find(|a| a.limits.get(dim).is_some())
}

/// Per dimension, what the account a session draws on has left.
pub fn left_in(chain: &[Account]) -> Limits {
    let mut left = Limits::default();
    for d in Dim::ALL {
        left.set(d, drawn_from(chain, d).and_then(|a| a.left().get(d)));
    }
    left
}

/// A budget granted to a child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub limits: Limits,
    /// The dimensions cut down to what was left (`budgetOverflow: "clamp"`).
    pub clamped: Vec<Dim>,
}

/// Why a spawn gets no budget: `dim` has `left` (never negative) and the child asked `asked`
/// (`None`: it asked nothing for it and would share what is left, which is nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    pub dim: Dim,
    pub asked: Option<i64>,
    pub left: i64,
}

impl Shortfall {
    pub fn message(&self) -> String {
        let field = self.dim.as_str();
        let left = self.dim.show(self.left);
        match self.asked.filter(|_| self.left > 0) {
            Some(asked) => format!(
                "budget.{field} asks {} but the requester has {left} left; ask at most that (or the operator can set agents.defaults.subagents.budgetOverflow=\"clamp\")",
                self.dim.show(asked)
            ),
            None => format!("the requester's budget is spent: {field} has {left} left, so no sub-agent can start"),
        }
    }
}

/// Grants `asked` against what the requester's accounts have `left`. A dimension asked for is
/// reserved (at most what is left, or clamped to it); one not asked for is shared with the
/// requester's account. A limited dimension with nothing left refuses either way.
pub fn grant(asked: &Limits, left: &Limits, overflow: BudgetOverflow) -> Result<Granted, Shortfall> {
    let mut granted = Granted { limits: Limits::default(), clamped: Vec::new() };
    for dim in Dim::ALL {
        let want = asked.get(dim);
        match (want, left.get(dim)) {
            (_, Some(l)) if l <= 0 => return Err(Shortfall { dim, asked: want, left: 0 }),
            (Some(a), Some(l)) if a > l => match overflow {
                BudgetOverflow::Clamp => {
                    granted.limits.set(dim, Some(l));
                    granted.clamped.push(dim);
                }
                BudgetOverflow::Refuse => return Err(Shortfall { dim, asked: want, left: l }),
            },
            (Some(a), _) => granted.limits.set(dim, Some(a)),
            (None, _) => {}
        }
    }
    Ok(granted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(tokens: Option<i64>, cost: Option<i64>) -> Limits {
        Limits { tokens, cost_micros: cost, runtime_ms: None }
    }

    #[test]
    fn a_child_is_granted_what_it_asks_within_what_is_left_and_shares_the_rest() {
        let left = limits(Some(1000), Some(500_000));
        let g = grant(&limits(Some(400), None), &left, BudgetOverflow::Refuse).unwrap();
        assert_eq!(g.limits, limits(Some(400), None), "cost is shared, not reserved");
        let g = grant(&limits(Some(1000), None), &left, BudgetOverflow::Refuse).unwrap();
        assert_eq!(g.limits.tokens, Some(1000), "all that is left may be asked");
        let asked_unlimited = grant(&limits(Some(5), None), &Limits::default(), BudgetOverflow::Refuse).unwrap();
        assert_eq!(asked_unlimited.limits.tokens, Some(5), "a budget under an unlimited requester is its own");
    }

    #[test]
    fn asking_more_than_is_left_refuses_naming_it_or_clamps_when_configured() {
        let left = limits(Some(300), None);
        let err = grant(&limits(Some(400), None), &left, BudgetOverflow::Refuse).unwrap_err();
        assert_eq!(err, Shortfall { dim: Dim::Tokens, asked: Some(400), left: 300 });
        assert!(
            err.message().contains("budget.tokens asks 400 tokens but the requester has 300 tokens left"),
            "{}",
            err.message()
        );
        let g = grant(&limits(Some(400), None), &left, BudgetOverflow::Clamp).unwrap();
        assert_eq!((g.limits.tokens, g.clamped), (Some(300), vec![Dim::Tokens]));
    }

    #[test]
    fn nothing_left_refuses_even_a_child_that_asks_nothing_and_even_when_clamping() {
        let left = limits(None, Some(0));
        let err = grant(&Limits::default(), &left, BudgetOverflow::Clamp).unwrap_err();
        assert_eq!(err, Shortfall { dim: Dim::CostUsd, asked: None, left: 0 });
        assert!(err.message().contains("costUsd has $0.0000 left"), "{}", err.message());
        let overspent = limits(Some(-20), None);
        let spent = grant(&limits(Some(1), None), &overspent, BudgetOverflow::Refuse).unwrap_err();
        assert_eq!(spent.left, 0);
        assert!(
            spent.message().starts_with("the requester's budget is spent: tokens has 0 tokens left"),
            "{}",
            spent.message()
        );
    }

    #[test]
    fn an_account_crosses_only_when_strictly_over_and_draws_come_from_the_nearest_limit() {
        let mut a = Account { session: 1, limits: limits(Some(100), None), ..Account::default() };
        a.spent.tokens = 60;
        a.live.tokens = 40;
        assert_eq!(a.crossed(), None, "exactly the limit is within it");
        assert_eq!(a.left().tokens, Some(0));
        a.reserved.tokens = 1;
        assert_eq!(a.crossed(), Some(Dim::Tokens));
        let parent = Account { session: 2, limits: limits(Some(10), Some(50)), ..Account::default() };
        let chain = [a.clone(), parent];
        assert_eq!(drawn_from(&chain, Dim::Tokens).map(|x| x.session), Some(1));
        assert_eq!(drawn_from(&chain, Dim::CostUsd).map(|x| x.session), Some(2));
        assert_eq!(drawn_from(&chain, Dim::RuntimeSeconds), None);
        assert_eq!(left_in(&chain), limits(Some(-1), Some(50)));
    }

    #[test]
    fn amounts_show_in_their_fields_units() {
        assert_eq!(Dim::Tokens.show(1_234_567), "1,234,567 tokens");
        assert_eq!(Dim::CostUsd.show(1_500_000), "$1.5000");
        assert_eq!(Dim::RuntimeSeconds.show(2_500), "2.5s");
        assert_eq!(Dim::Tokens.show_of(4200, 10_000), "4,200/10,000 tokens");
        assert_eq!(Dim::CostUsd.show_of(10_000, 500_000), "$0.0100/$0.5000");
        let b = Budget { tokens: Some(10), cost_usd: Some(0.25), runtime_seconds: Some(1.5) };
        let l = Limits::of(&b);
        assert_eq!(l, Limits { tokens: Some(10), cost_micros: Some(250_000), runtime_ms: Some(1500) });
        assert_eq!(l.to_json(), json!({"tokens": 10, "costUsd": 0.25, "runtimeSeconds": 1.5}));
        assert_eq!(Dim::parse("costUsd"), Some(Dim::CostUsd));
    }
}
