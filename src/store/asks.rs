//! Asks: a question or an approval a running turn put to someone above it (`input_request`).
//! The owner of the run records it `open` with whom it asked; any process may answer it, once (a
//! compare-and-set on `open`); the owner hands the answer to the turn. An ask whose run ended
//! first is withdrawn.

use super::sql::{Optional, Row, Sql, args};
use serde_json::Value;

use super::text_enum::text_enum;
use super::{Result, Store, now_ms};
use crate::keys::SessionKey;

/// What is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskKind {
    /// May I (run this tool, write that file)?
    Approval,
    /// A question that needs an answer in words.
    Question,
}

/// Where an ask is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskState {
    Open,
    Answered,
    /// No one answered in time: `agents.defaults.subagents.approvals.onTimeout` decided.
    Expired,
    /// Its run ended before an answer came (it finished, was cancelled, or its owner died).
    Withdrawn,
}

/// The answer's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskDecision {
    Allow,
    Deny,
}

/// Who answered, by which path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredVia {
    /// `subagents {action: "respond"}` by an ancestor (a person at a host, or a driven parent's run).
    Subagents,
    /// `sessions-mcp respond`.
    Operator,
    /// An MCP elicitation answered at the host.
    Elicitation,
    /// The operator's dashboard (`/ui`), by an operator or a client token.
    Dashboard,
    /// `approvals.rules` decided without asking.
    Rule,
    /// `approvals.timeoutSeconds` passed.
    Timeout,
    /// A person in the chat the ask was posted to, through the channel's bridge.
    Channel,
    /// The A2A peer whose task the ask holds `input-required` (docs/A2A.md).
    A2a,
}

text_enum!(AskKind { Approval => "approval", Question => "question" });
text_enum!(AskState { Open => "open", Answered => "answered", Expired => "expired", Withdrawn => "withdrawn" });
text_enum!(AskDecision { Allow => "allow", Deny => "deny" });
text_enum!(AnsweredVia {
    Subagents => "subagents", Operator => "operator", Elicitation => "elicitation", Dashboard => "dashboard", Rule => "rule", Timeout => "timeout", Channel => "channel", A2a => "a2a",
});

/// An ask to record.
#[derive(Debug, Clone)]
pub struct NewAsk<'a> {
    pub id: &'a str,
    pub run_id: &'a str,
    pub session: i64,
    /// The agent's own id for it (the runner answers by it).
    pub agent_request_id: &'a str,
    pub kind: AskKind,
    pub text: &'a str,
    pub options: Option<&'a Value>,
    pub details: Option<&'a Value>,
    /// Whom it was put to.
    pub target: &'a SessionKey,
    pub deadline_at: i64,
}

/// An answer to record.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub decision: AskDecision,
    pub text: Option<&'a str>,
    /// The answering session, or "operator".
    pub by: &'a str,
    pub via: AnsweredVia,
    /// The MCP client (`clientInfo.name`) of the person who answered at a host, when it said.
    pub host: Option<&'a str>,
}

/// A stored ask.
#[derive(Debug, Clone)]
pub struct AskRow {
    pub id: String,
    pub run_id: String,
    pub session: i64,
    /// The asking session's key.
    pub child: SessionKey,
    pub agent_request_id: String,
    pub kind: AskKind,
    pub text: String,
    pub options: Option<Value>,
    pub details: Option<Value>,
    pub target: SessionKey,
    pub state: AskState,
    pub decision: Option<AskDecision>,
    pub answer_text: Option<String>,
    pub answered_by: Option<String>,
    pub answered_via: Option<AnsweredVia>,
    /// The MCP client of the person who answered at a host.
    pub answered_host: Option<String>,
    /// How each way to a person went, oldest first (`{route, outcome, client?, ms?, at}`).
    pub routes: Vec<Value>,
    pub created_at: i64,
    pub deadline_at: i64,
}

impl AskRow {
    /// An open ask `a1` of run `r1`, asked by `agent:main:subagent:x` of `agent:main:main`, for
    /// unit tests that need a row without a store; set other fields by struct update.
    #[cfg(test)]
    pub fn for_test(kind: AskKind, text: &str) -> AskRow {
        AskRow {
            id: "a1".into(),
            run_id: "r1".into(),
            session: 1,
            child: SessionKey::from_canonical("agent:main:subagent:x"),
            agent_request_id: "q".into(),
            kind,
            text: text.into(),
            options: None,
            details: None,
            target: SessionKey::from_canonical("agent:main:main"),
            state: AskState::Open,
            decision: None,
            answer_text: None,
            answered_by: None,
            answered_via: None,
            answered_host: None,
            routes: Vec::new(),
            created_at: 0,
            deadline_at: 0,
        }
    }
}

const SELECT: &str = "SELECT a.id, a.run_id, a.session, c.key, a.agent_request_id, a.kind, a.text, a.options,
         a.details, a.target_key, a.state, a.decision, a.answer_text, a.answered_by, a.answered_via, a.created_at,
         a.deadline_at, a.answered_host, a.routes
     FROM asks a JOIN sessions c ON c.id = a.session";

fn from_row(r: &Row) -> Result<AskRow> {
    let json = |i: usize| -> Result<Option<Value>> {
        Ok(r.get::<Option<String>>(i)?.and_then(|s| serde_json::from_str(&s).ok()))
    };
    let text = |i: usize| -> Result<Option<String>> { r.get(i) };
    Ok(AskRow {
        id: r.get(0)?,
        run_id: r.get(1)?,
        session: r.get(2)?,
        child: SessionKey::from_canonical(r.get::<String>(3)?),
        agent_request_id: r.get(4)?,
        kind: AskKind::parse(&r.get::<String>(5)?).unwrap_or(AskKind::Question),
        text: r.get(6)?,
        options: json(7)?,
        details: json(8)?,
        target: SessionKey::from_canonical(r.get::<String>(9)?),
        state: AskState::parse(&r.get::<String>(10)?).unwrap_or(AskState::Open),
        decision: text(11)?.as_deref().and_then(AskDecision::parse),
        answer_text: text(12)?,
        answered_by: text(13)?,
        answered_via: text(14)?.as_deref().and_then(AnsweredVia::parse),
        created_at: r.get(15)?,
        deadline_at: r.get(16)?,
        answered_host: text(17)?,
        routes: json(18)?.and_then(|v| v.as_array().cloned()).unwrap_or_default(),
    })
}

pub(super) fn add_ask(tx: &dyn Sql, a: &NewAsk) -> Result<()> {
    tx.execute(
        "INSERT INTO asks (id, run_id, session, agent_request_id, kind, text, options, details, target_key, state,
                           created_at, deadline_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'open', ?10, ?11)",
        args![
            a.id,
            a.run_id,
            a.session,
            a.agent_request_id,
            a.kind.as_str(),
            a.text,
            a.options.map(Value::to_string),
            a.details.map(Value::to_string),
            a.target.as_str(),
            now_ms(),
            a.deadline_at
        ],
    )?;
    Ok(())
}

/// Closes an open ask as `state` with `answer`; false when it was closed already.
pub(super) fn close_ask(tx: &dyn Sql, id: &str, state: AskState, answer: &Answer) -> Result<bool> {
    let changed = tx.execute(
        "UPDATE asks SET state = ?2, decision = ?3, answer_text = ?4, answered_by = ?5, answered_via = ?6,
                 answered_at = ?7, answered_host = ?8
             WHERE id = ?1 AND state = 'open'",
        args![
            id,
            state.as_str(),
            answer.decision.as_str(),
            answer.text,
            answer.by,
            answer.via.as_str(),
            now_ms(),
            answer.host
        ],
    )?;
    Ok(changed == 1)
}

/// Adds `event` to the routes of open ask `id`; false when it is closed (or unknown). The ask's
/// row is locked before its routes are read (on a shared database, where no global lock orders
/// writers), so two routes noted at once both stay.
pub(super) fn add_ask_route(tx: &dyn Sql, id: &str, event: &Value) -> Result<bool> {
    let lock = if tx.dialect() == super::sql::Dialect::Postgres { " FOR UPDATE" } else { "" };
    let Some(routes) = tx
        .query_row(&format!("SELECT routes FROM asks WHERE id = ?1 AND state = 'open'{lock}"), args![id], |r| {
            r.get::<Option<String>>(0)
        })
        .optional()?
    else {
        return Ok(false);
    };
    let mut list: Vec<Value> = routes.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
    list.push(event.clone());
    tx.execute("UPDATE asks SET routes = ?2 WHERE id = ?1", args![id, Value::from(list).to_string()])?;
    Ok(true)
}

/// How many asks of `run_id` are open.
pub(super) fn open_asks_of_run(c: &dyn Sql, run_id: &str) -> Result<i64> {
    c.one("SELECT count(*) FROM asks WHERE run_id = ?1 AND state = 'open'", args![run_id])
}

/// The open asks of one session, oldest first.
pub(super) fn open_asks_of(c: &dyn Sql, session: i64) -> Result<Vec<AskRow>> {
    let sql = format!("{SELECT} WHERE a.state = 'open' AND a.session = ?1 ORDER BY a.created_at");
    c.query_map(&sql, args![session], from_row)
}

/// The open asks of the sessions `cond` (an SQL condition on `a.session` bound to `?1`) admits,
/// oldest first, up to `limit`.
pub(super) fn open_asks_in(c: &dyn Sql, cond: &str, root: Option<i64>, limit: usize) -> Result<Vec<AskRow>> {
    let sql = format!("{SELECT} WHERE a.state = 'open' AND {cond} ORDER BY a.created_at LIMIT ?2");
    c.query_map(&sql, args![root, limit as i64], from_row)
}

impl Store {
    pub fn ask(&self, id: &str) -> Result<Option<AskRow>> {
        let sql = format!("{SELECT} WHERE a.id = ?1");
        self.read(|c| c.query_row(&sql, args![id], from_row).optional())
    }

    /// The open asks of these runs (a run's owner holds their turns).
    pub fn asks_of_runs(&self, run_ids: &[String]) -> Result<Vec<AskRow>> {
        let sql = format!("{SELECT} WHERE a.run_id = ?1 ORDER BY a.created_at");
        self.read(|c| {
            let mut out = Vec::new();
            for run in run_ids {
                out.extend(c.query_map(&sql, args![run], from_row)?);
            }
            Ok(out)
        })
    }

    /// Open asks of the sessions in `ancestor`'s tree, oldest first.
    pub fn open_asks_below(&self, ancestor: &SessionKey) -> Result<Vec<AskRow>> {
        let sql = format!(
            "{SELECT} WHERE a.state = 'open' AND a.session IN (SELECT t.session FROM session_tree t
                 WHERE t.ancestor = (SELECT id FROM sessions WHERE key = ?1)) ORDER BY a.created_at"
        );
        self.read(|c| c.query_map(&sql, args![ancestor.as_str()], from_row))
    }

    /// Every open ask, oldest first (the operator's `ls --pending`).
    pub fn open_asks(&self) -> Result<Vec<AskRow>> {
        let sql = format!("{SELECT} WHERE a.state = 'open' ORDER BY a.created_at");
        self.read(|c| c.query_map(&sql, args![], from_row))
    }

    /// The asks whose id starts with `prefix` (lowercase hex and dashes), newest first, at most `limit`.
    pub fn asks_with_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<AskRow>> {
        let sql = format!("{SELECT} WHERE a.id LIKE ?1 ORDER BY a.created_at DESC LIMIT ?2");
        self.read(|c| c.query_map(&sql, args![format!("{prefix}%"), limit as i64], from_row))
    }

    /// Open asks whose deadline has passed.
    pub fn asks_due(&self, now: i64) -> Result<Vec<AskRow>> {
        let sql = format!("{SELECT} WHERE a.state = 'open' AND a.deadline_at <= ?1 ORDER BY a.deadline_at");
        self.read(|c| c.query_map(&sql, args![now], from_row))
    }

    /// Open asks whose run is no longer running (it ended, or its owner died).
    pub fn stranded_asks(&self) -> Result<Vec<AskRow>> {
        let sql =
            format!("{SELECT} JOIN runs r ON r.run_id = a.run_id WHERE a.state = 'open' AND r.status <> 'running'");
        self.read(|c| c.query_map(&sql, args![], from_row))
    }
}
