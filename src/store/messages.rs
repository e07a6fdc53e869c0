//! Transcript messages: append with the next `seq`, and read pages that cost O(limit).

use super::sql::{Dialect, Optional, Row, Sql, Statement, args};
use serde_json::{Map, Value};

use super::{Result, Store, now_ms};

/// One stored message, as tools return it (before sanitising).
#[derive(Debug, Clone)]
pub struct MessageRow {
    pub seq: i64,
    pub role: String,
    pub content: Value,
    pub timestamp: i64,
    pub run_id: Option<String>,
    pub provenance: Option<Value>,
    pub usage: Option<Value>,
    pub model: Option<String>,
    pub stop_reason: Option<String>,
    pub silent: bool,
    /// Other transcript fields (toolCallId, toolName, isError, …).
    pub extra: Map<String, Value>,
}

/// The column list `MessageRow::from_row` reads.
pub(super) fn message_columns() -> &'static str {
    COLUMNS
}

impl MessageRow {
    pub(super) fn from_row(r: &Row) -> Result<Self> {
        let json = |i: usize| -> Result<Option<Value>> {
            Ok(r.get::<Option<String>>(i)?.and_then(|s| serde_json::from_str(&s).ok()))
        };
        Ok(MessageRow {
            seq: r.get(0)?,
            role: r.get(1)?,
            content: json(2)?.unwrap_or(Value::Null),
            timestamp: r.get(3)?,
            run_id: r.get(4)?,
            provenance: json(5)?,
            usage: json(6)?,
            model: r.get(7)?,
            stop_reason: r.get(8)?,
            silent: r.get(9)?,
            extra: match json(10)? {
                Some(Value::Object(m)) => m,
                _ => Map::new(),
            },
        })
    }

    /// The message as JSON (the transcript shape plus `seq`).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("seq".into(), self.seq.into());
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone());
        m.insert("timestamp".into(), self.timestamp.into());
        for (k, v) in &self.extra {
            if k != "imported" {
                m.insert(k.clone(), v.clone());
            }
        }
        let mut opt = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.into(), v);
            }
        };
        opt("runId", self.run_id.clone().map(Value::from));
        opt("provenance", self.provenance.clone());
        opt("usage", self.usage.clone());
        opt("model", self.model.clone().map(Value::from));
        opt("stopReason", self.stop_reason.clone().map(Value::from));
        if self.silent {
            m.insert("silent".into(), true.into());
        }
        Value::Object(m)
    }
}

/// A message to append; the store assigns `seq`.
#[derive(Debug, Clone, Default)]
pub struct NewMessage {
    pub role: String,
    pub content: Value,
    pub timestamp: Option<i64>,
    pub run_id: Option<String>,
    pub provenance: Option<Value>,
    pub usage: Option<Value>,
    pub model: Option<String>,
    pub stop_reason: Option<String>,
    pub silent: bool,
    /// The chain this message belongs to (the loop guard counts them), if any.
    pub chain_id: Option<String>,
    pub extra: Option<Map<String, Value>>,
}

impl NewMessage {
    /// A user message of one text block that another session (or the server on its behalf)
    /// puts in a transcript: a send, an announce, a steer, a question to an ancestor.
    pub fn user_text(text: &str, run_id: Option<String>, provenance: Value, chain_id: Option<String>) -> Self {
        NewMessage {
            role: "user".into(),
            content: serde_json::json!([{"type": "text", "text": text}]),
            run_id,
            provenance: Some(provenance),
            chain_id,
            ..Default::default()
        }
    }
}

/// The input of a queued run, shown last in history until the run starts.
#[derive(Debug, Clone)]
pub struct PendingInput {
    pub run_id: String,
    pub input: Value,
    pub provenance: Option<Value>,
    pub created_at: i64,
}

/// A page of messages in ascending `seq`, and whether more lie beyond it.
#[derive(Debug, Clone)]
pub struct HistoryPage {
    pub messages: Vec<MessageRow>,
    pub has_more: bool,
}

const COLUMNS: &str = "seq, role, content, timestamp, run_id, provenance, usage, model, stop_reason, silent, extra";
/// How many columns [`COLUMNS`] has: what follows them in a row is this many columns on.
const COLUMNS_WIDTH: usize = 11;

fn visible_filter(include_tools: bool) -> &'static str {
    // Must match the partial index `messages_visible` word for word to be served by it.
    if include_tools { "" } else { " AND role <> 'toolResult' AND silent = 0" }
}

impl Store {
    /// The last `limit` messages of a session (oldest first).
    pub fn history_tail(&self, session: i64, limit: usize, include_tools: bool) -> Result<HistoryPage> {
        self.read(|c| history_tail(c, session, limit, include_tools))
    }

    /// The first `limit` messages after `after_seq` (oldest first).
    pub fn history_after(
        &self,
        session: i64,
        after_seq: i64,
        limit: usize,
        include_tools: bool,
    ) -> Result<HistoryPage> {
        self.read(|c| history_from(c, session, Direction::After(after_seq), limit, include_tools))
    }

    /// The last `limit` messages before `before_seq` (oldest first): reading backwards.
    pub fn history_before(
        &self,
        session: i64,
        before_seq: i64,
        limit: usize,
        include_tools: bool,
    ) -> Result<HistoryPage> {
        self.read(|c| history_from(c, session, Direction::Before(before_seq), limit, include_tools))
    }

    /// The seq of a run's last assistant message in `session`: where its whole reply is.
    pub fn reply_seq(&self, session: &crate::keys::SessionKey, run_id: &str) -> Result<Option<i64>> {
        self.read(|c| {
            c.query_row(
                "SELECT m.seq FROM messages m JOIN sessions s ON s.id = m.session
                 WHERE s.key = ?1 AND m.run_id = ?2 AND m.role = 'assistant' ORDER BY m.seq DESC LIMIT 1",
                args![session.as_str(), run_id],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// One message by seq, whatever its role.
    pub fn message_at(&self, session: i64, seq: i64) -> Result<Option<MessageRow>> {
        self.read(|c| {
            c.query_row(
                &format!("SELECT {COLUMNS} FROM messages WHERE session = ?1 AND seq = ?2"),
                args![session, seq],
                MessageRow::from_row,
            )
            .optional()
        })
    }

    /// Whether the session has visible messages before `first` and after `last`: which ways a
    /// page of its history can be read on.
    pub fn history_around(&self, session: i64, first: i64, last: i64, include_tools: bool) -> Result<(bool, bool)> {
        self.read(|c| {
            let filter = visible_filter(include_tools);
            let exists = |cmp: &str, seq: i64| {
                c.query_row(
                    &format!("SELECT EXISTS(SELECT 1 FROM messages WHERE session = ?1 AND seq {cmp} ?2{filter})"),
                    args![session, seq],
                    |r| r.get::<bool>(0),
                )
            };
            Ok((exists("<", first)?, exists(">", last)?))
        })
    }

    /// The last `limit` visible messages of each session, for list rows.
    ///
    /// SQLite reads each session's tail in the server's own memory; PostgreSQL would make that a
    /// round trip per session (50 for a list page: 7 ms instead of 2), so there it is one
    /// statement, each session's tail taken by a `LATERAL` subquery on the same index.
    pub fn last_messages(&self, sessions: &[i64], limit: usize) -> Result<Vec<Vec<MessageRow>>> {
        self.read(|c| match c.dialect() {
            Dialect::Sqlite => sessions.iter().map(|s| Ok(history_tail(c, *s, limit, false)?.messages)).collect(),
            Dialect::Postgres => last_messages_in_one_statement(c, sessions, limit),
        })
    }

    /// The highest `seq` of a session by key, 0 when it has none (or does not exist).
    pub fn last_seq_of(&self, key: &crate::keys::SessionKey) -> Result<i64> {
        self.last_seqs_of(std::slice::from_ref(key)).map(|seqs| seqs[0])
    }

    /// [`Store::last_seq_of`] for several sessions in one read.
    pub fn last_seqs_of(&self, keys: &[crate::keys::SessionKey]) -> Result<Vec<i64>> {
        self.read(|c| {
            let sql =
                "SELECT coalesce(max(m.seq), 0) FROM messages m JOIN sessions s ON s.id = m.session WHERE s.key = ?1";
            keys.iter().map(|k| c.one(sql, args![k.as_str()])).collect()
        })
    }

    /// The newest message id, 0 for an empty store: where a change feed starts.
    pub fn newest_message_id(&self) -> Result<i64> {
        self.read(|c| c.query_row("SELECT coalesce(max(id), 0) FROM messages", args![], |r| r.get(0)))
    }

    /// The sessions that gained messages with an id above `after`, with their new last seq, and
    /// the id to ask from next time. The idle case costs one lookup at the end of the rowid index.
    pub fn grown_since(&self, after: i64) -> Result<(i64, Vec<(String, i64)>)> {
        self.read(|c| {
            let top: i64 = c.query_row("SELECT coalesce(max(id), 0) FROM messages", args![], |r| r.get(0))?;
            // Below `after`: `prune` removed the newest rows; ids above `top` will be new ones.
            if top <= after {
                return Ok((top, Vec::new()));
            }
            let grown = c.query_map(
                "SELECT s.key, max(m.seq) FROM messages m JOIN sessions s ON s.id = m.session
                     WHERE m.id > ?1 AND m.id <= ?2 GROUP BY m.session, s.key",
                args![after, top],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            Ok((top, grown))
        })
    }

    /// Runs of a session still waiting to start: their input shows in history as `pending`.
    pub fn pending_inputs(&self, session: i64) -> Result<Vec<PendingInput>> {
        self.read(|c| {
            let sql = format!(
                "SELECT run_id, input, provenance, created_at FROM runs
                 WHERE session = ?1 AND status = 'queued' ORDER BY created_at, {} LIMIT 100",
                c.dialect().runs_order()
            );
            c.query_map(&sql, args![session], |r| {
                let input: String = r.get(1)?;
                let prov: Option<String> = r.get(2)?;
                Ok(PendingInput {
                    run_id: r.get(0)?,
                    input: serde_json::from_str(&input).unwrap_or(Value::Null),
                    provenance: prov.and_then(|p| serde_json::from_str(&p).ok()),
                    created_at: r.get(3)?,
                })
            })
        })
    }
}

fn history_tail(c: &dyn Sql, session: i64, limit: usize, include_tools: bool) -> Result<HistoryPage> {
    history_from(c, session, Direction::Before(i64::MAX), limit, include_tools)
}

/// [`Store::last_messages`] in one PostgreSQL statement. The ids go as one text parameter, so the
/// statement's text (and its prepared plan) is the same for every page.
fn last_messages_in_one_statement(c: &dyn Sql, sessions: &[i64], limit: usize) -> Result<Vec<Vec<MessageRow>>> {
    let ids: Vec<String> = sessions.iter().map(i64::to_string).collect();
    let sql = format!(
        "SELECT m.*, t.id FROM unnest(CAST(string_to_array(?1, ',') AS BIGINT[])) AS t(id)
         CROSS JOIN LATERAL (SELECT {COLUMNS} FROM messages WHERE session = t.id{} ORDER BY seq DESC LIMIT ?2) m",
        visible_filter(false)
    );
    let rows: Vec<(i64, MessageRow)> = c.query_map(&sql, args![ids.join(","), limit as i64], |r| {
        Ok((r.get(COLUMNS_WIDTH)?, MessageRow::from_row(r)?))
    })?;
    let mut tails: std::collections::HashMap<i64, Vec<MessageRow>> = std::collections::HashMap::new();
    for (session, message) in rows {
        tails.entry(session).or_default().push(message);
    }
    Ok(sessions
        .iter()
        .map(|s| {
            let mut tail = tails.remove(s).unwrap_or_default();
            tail.sort_by_key(|m| m.seq); // oldest first, as history_tail gives them
            tail
        })
        .collect())
}

/// Which way a page of history reads from a seq.
#[derive(Clone, Copy)]
enum Direction {
    After(i64),
    Before(i64),
}

/// A page next to a seq, oldest first either way.
fn history_from(
    c: &dyn Sql,
    session: i64,
    direction: Direction,
    limit: usize,
    include_tools: bool,
) -> Result<HistoryPage> {
    let (cmp, order, seq) = match direction {
        Direction::After(seq) => (">", "ASC", seq),
        Direction::Before(seq) => ("<", "DESC", seq),
    };
    let sql = format!(
        "SELECT {COLUMNS} FROM messages WHERE session = ?1 AND seq {cmp} ?2{} ORDER BY seq {order} LIMIT ?3",
        visible_filter(include_tools)
    );
    let mut messages: Vec<MessageRow> =
        c.query_map(&sql, args![session, seq, limit as i64 + 1], MessageRow::from_row)?;
    let has_more = messages.len() > limit;
    messages.truncate(limit);
    if matches!(direction, Direction::Before(_)) {
        messages.reverse();
    }
    Ok(HistoryPage { messages, has_more })
}

/// Appends `m` to session `session` (row id) with the next seq; bumps `updated_at`.
pub(super) fn append_message(tx: &dyn Sql, session: i64, m: &NewMessage) -> Result<i64> {
    let timestamp = m.timestamp.unwrap_or_else(now_ms);
    let take = take_seqs(tx.dialect(), session, 1, timestamp);
    let seq: i64 = tx.query_row(&format!("{} RETURNING next_seq - 1", take.sql()), &take.args(), |r| r.get(0))?;
    let insert = insert_message(session, seq, m, timestamp);
    tx.execute(insert.sql(), &insert.args())?;
    Ok(seq)
}

/// Takes `count` seqs of session `session` (its `next_seq` rises by that much: the seqs taken
/// are the ones from its old value up) for messages the latest of which is dated `latest`,
/// which `updated_at` rises to. The session row must be locked by whoever reads the old value
/// first (a run's end: `run_queue::finish_run`).
pub(super) fn take_seqs(d: Dialect, session: i64, count: usize, latest: i64) -> Statement {
    let sql = format!(
        "UPDATE sessions SET next_seq = next_seq + ?3, updated_at = {}(updated_at, ?2) WHERE id = ?1",
        d.greatest()
    );
    Statement::new(sql, args![session, latest, count as i64])
}

/// The insert of `m` into session `session`'s transcript at `seq`, dated `timestamp` (its own
/// or the time it is stored).
pub(super) fn insert_message(session: i64, seq: i64, m: &NewMessage, timestamp: i64) -> Statement {
    let json = |v: &Option<Value>| v.as_ref().map(Value::to_string);
    Statement::new(
        "INSERT INTO messages (session, seq, role, content, timestamp, run_id, provenance, usage, model, stop_reason, silent, extra, chain_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        args![
            session,
            seq,
            m.role,
            m.content.to_string(),
            timestamp,
            m.run_id,
            json(&m.provenance),
            json(&m.usage),
            m.model,
            m.stop_reason,
            m.silent,
            m.extra.as_ref().map(|e| Value::Object(e.clone()).to_string()),
            m.chain_id,
        ],
    )
}

impl Store {
    /// The last `limit` visible messages before `seq` (a run's context, oldest first).
    pub fn context_before(&self, session: i64, seq: i64, limit: usize) -> Result<Vec<MessageRow>> {
        self.read(|c| {
            let sql = format!(
                "SELECT {COLUMNS} FROM messages WHERE session = ?1 AND seq < ?2 AND silent = 0 ORDER BY seq DESC LIMIT ?3"
            );
            let mut rows: Vec<MessageRow> = c
                .query_map(&sql, args![session, seq, limit as i64], MessageRow::from_row)?;
            rows.reverse();
            Ok(rows)
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_message_columns_are_columns_width_wide() {
        assert_eq!(super::COLUMNS.split(", ").count(), super::COLUMNS_WIDTH);
    }
}
