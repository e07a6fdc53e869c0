//! Session rows: insert, look up, walk the spawn tree, and list in index order.

use super::sql::{Arg, ArgValue, Optional, Row, Sql, args};
use serde_json::Value;

use super::text_enum::text_enum;
use super::{Result, Store, StoreError, now_ms};
use crate::keys::{AgentId, ChatType, SessionKey, SessionKind};

/// A session's own send-policy override (`sessions-mcp policy`), over the configured rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SendPolicyOverride {
    Allow,
    Deny,
}

text_enum!(SendPolicyOverride { Allow => "allow", Deny => "deny" });

/// Where a session is in its life. Only `Active` (and `Archived` on request) is listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    Active = 0,
    Archived = 1,
    Deleted = 2,
    /// Never listed (cron run keys), but readable.
    Unlisted = 3,
}

impl SessionState {
    fn from_i64(v: i64) -> Self {
        match v {
            1 => Self::Archived,
            2 => Self::Deleted,
            3 => Self::Unlisted,
            _ => Self::Active,
        }
    }
}

/// One stored session.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub id: i64,
    pub key: SessionKey,
    pub session_id: String,
    pub agent_id: AgentId,
    pub kind: SessionKind,
    pub state: SessionState,
    pub external: bool,
    pub chat_type: Option<ChatType>,
    pub channel: Option<String>,
    pub last_channel: Option<String>,
    pub last_to: Option<String>,
    pub last_account_id: Option<String>,
    /// The thread the session's last inbound channel message came in (replies go there).
    pub last_thread_id: Option<String>,
    pub delivery_context: Option<Value>,
    pub label: Option<String>,
    pub display_name: Option<String>,
    pub spawned_by: Option<SessionKey>,
    pub spawn_depth: i64,
    pub subagent_role: Option<String>,
    pub sandboxed: bool,
    pub send_policy: Option<SendPolicyOverride>,
    pub model: Option<String>,
    pub thinking_level: Option<String>,
    pub verbose_level: Option<String>,
    pub context_tokens: Option<i64>,
    pub system_sent: Option<bool>,
    pub aborted_last_run: Option<bool>,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub tokens_total: i64,
    pub cost: Option<f64>,
    /// The agent CLI's own session id, resumed by the next run (`runner.context`;
    /// docs/RUNNER-PROTOCOL.md, Adapters).
    pub external_session_id: Option<String>,
    pub transcript_path: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub archived_at: Option<i64>,
    pub deleted_at: Option<i64>,
    /// The spawn run of a sub-agent session, and when its completion was announced.
    pub spawn_run: Option<String>,
    pub announced_at: Option<i64>,
    /// When an ancestor cancelled this session's work (`subagents` cancel).
    pub cancelled_at: Option<i64>,
}

const COLUMNS: &str = "id, key, session_id, agent_id, kind, state, driver, chat_type, channel, last_channel, \
    last_to, last_account_id, delivery_context, label, display_name, spawned_by, spawn_depth, subagent_role, \
    sandboxed, send_policy, model, thinking_level, verbose_level, context_tokens, system_sent, \
    aborted_last_run, tokens_in, tokens_out, tokens_total, cost, transcript_path, created_at, updated_at, \
    archived_at, deleted_at, spawn_run, announced_at, external_session_id, cancelled_at, last_thread_id";

/// The column list `SessionRow::from_row` reads.
pub(super) fn session_columns() -> &'static str {
    COLUMNS
}

impl SessionRow {
    pub(super) fn from_row(r: &Row) -> Result<Self> {
        let json = |i: usize| -> Result<Option<Value>> {
            Ok(r.get::<Option<String>>(i)?.and_then(|s| serde_json::from_str(&s).ok()))
        };
        Ok(SessionRow {
            id: r.get(0)?,
            key: SessionKey::from_canonical(r.get::<String>(1)?),
            session_id: r.get(2)?,
            agent_id: AgentId::parse(&r.get::<String>(3)?).unwrap_or_else(|_| AgentId::main()),
            kind: SessionKind::parse(&r.get::<String>(4)?).unwrap_or(SessionKind::Other),
            state: SessionState::from_i64(r.get(5)?),
            external: r.get::<String>(6)? == "external",
            chat_type: r.get::<Option<String>>(7)?.as_deref().and_then(ChatType::parse),
            channel: r.get(8)?,
            last_channel: r.get(9)?,
            last_to: r.get(10)?,
            last_account_id: r.get(11)?,
            delivery_context: json(12)?,
            label: r.get(13)?,
            display_name: r.get(14)?,
            spawned_by: r.get::<Option<String>>(15)?.map(SessionKey::from_canonical),
            spawn_depth: r.get(16)?,
            subagent_role: r.get(17)?,
            sandboxed: r.get(18)?,
            send_policy: r.get::<Option<String>>(19)?.as_deref().and_then(SendPolicyOverride::parse),
            model: r.get(20)?,
            thinking_level: r.get(21)?,
            verbose_level: r.get(22)?,
            context_tokens: r.get(23)?,
            system_sent: r.get(24)?,
            aborted_last_run: r.get(25)?,
            tokens_in: r.get(26)?,
            tokens_out: r.get(27)?,
            tokens_total: r.get(28)?,
            cost: r.get(29)?,
            transcript_path: r.get(30)?,
            created_at: r.get(31)?,
            updated_at: r.get(32)?,
            archived_at: r.get(33)?,
            deleted_at: r.get(34)?,
            spawn_run: r.get(35)?,
            announced_at: r.get(36)?,
            external_session_id: r.get(37)?,
            cancelled_at: r.get(38)?,
            last_thread_id: r.get(39)?,
        })
    }
}

/// What a new session row holds; everything not named here starts empty.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub key: SessionKey,
    pub session_id: String,
    pub agent_id: AgentId,
    pub kind: SessionKind,
    pub external: bool,
    pub chat_type: Option<ChatType>,
    pub channel: Option<String>,
    pub last_channel: Option<String>,
    pub last_to: Option<String>,
    pub delivery_context: Option<Value>,
    pub label: Option<String>,
    pub display_name: Option<String>,
    pub spawned_by: Option<SessionKey>,
    pub spawn_depth: i64,
    pub subagent_role: Option<String>,
    pub sandboxed: bool,
    pub model: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub archived_at: Option<i64>,
    pub origin: Option<Value>,
}

impl NewSession {
    /// A fresh session with a new UUID sessionId, stamped now.
    pub fn new(key: SessionKey, agent_id: AgentId, kind: SessionKind, external: bool) -> Self {
        let now = now_ms();
        NewSession {
            key,
            session_id: uuid::Uuid::new_v4().to_string(),
            agent_id,
            kind,
            external,
            chat_type: None,
            channel: None,
            last_channel: None,
            last_to: None,
            delivery_context: None,
            label: None,
            display_name: None,
            spawned_by: None,
            spawn_depth: 0,
            subagent_role: None,
            sandboxed: false,
            model: None,
            created_at: now,
            updated_at: now,
            archived_at: None,
            origin: None,
        }
    }
}

/// Which sessions a list slice draws from.
#[derive(Debug, Clone, Copy)]
pub enum SliceScope<'a> {
    /// Every session of one agent (served by the agent/state/updated indexes: O(limit)).
    Agent(&'a str),
    /// Every session spawned by this key, transitively, whatever its agent (O(tree)).
    TreeOf(&'a str),
    /// The same, only the sessions of other agents than the key's: what an `agent` or `all` list
    /// adds to the agent slices (O(tree) to find, few to sort).
    TreeOfOtherAgents(&'a str),
}

/// One ordered slice of the session list: one scope, optionally one kind, some states.
#[derive(Debug, Clone)]
pub struct ListQuery<'a> {
    pub scope: SliceScope<'a>,
    pub kind: Option<SessionKind>,
    pub include_archived: bool,
    pub updated_since: Option<i64>,
    /// Keyset cursor: rows strictly after `(updated_at, id)` in (DESC, DESC) order.
    pub after: Option<(i64, i64)>,
    pub exclude_key: Option<&'a str>,
    pub limit: usize,
}

impl Store {
    pub fn session_by_key(&self, key: &SessionKey) -> Result<Option<SessionRow>> {
        self.read(|c| session_by_key(c, key))
    }

    /// Sessions whose sessionId matches (case-insensitive); the caller filters visibility.
    pub fn sessions_by_session_id(&self, id: &str) -> Result<Vec<SessionRow>> {
        self.read(|c| {
            let sql = format!(
                "SELECT {COLUMNS} FROM sessions WHERE {} LIMIT 64",
                self.dialect().eq_nocase("session_id", "?1")
            );
            c.query_map(&sql, args![id], SessionRow::from_row)
        })
    }

    /// Sessions carrying `label` (labels are not unique); the caller filters visibility.
    pub fn sessions_by_label(&self, label: &str) -> Result<Vec<SessionRow>> {
        self.read(|c| {
            let sql = format!("SELECT {COLUMNS} FROM sessions WHERE label = ?1 AND state <> 2 LIMIT 256");
            c.query_map(&sql, args![label], SessionRow::from_row)
        })
    }

    /// Was `key` spawned, directly or further down, from `ancestor`? Read from the spawn-tree
    /// index that `sessions_list` uses, so the list and the other tools agree at any depth, and
    /// after `prune` removed a session in the middle of a lineage.
    pub fn is_ancestor(&self, ancestor: &SessionKey, key: &SessionKey) -> Result<bool> {
        self.read(|c| {
            c.query_row(
                "SELECT EXISTS (SELECT 1 FROM session_tree
                     WHERE ancestor = (SELECT id FROM sessions WHERE key = ?1)
                       AND session = (SELECT id FROM sessions WHERE key = ?2))",
                args![ancestor.as_str(), key.as_str()],
                |r| r.get(0),
            )
        })
    }

    /// One slice of the list in (updated_at DESC, id DESC) order, served by an index.
    pub fn list_slice(&self, q: &ListQuery) -> Result<Vec<SessionRow>> {
        self.read(|c| list_slice(c, q))
    }

    /// Agent ids that own at least one session.
    pub fn agent_ids(&self) -> Result<Vec<AgentId>> {
        self.read(|c| {
            let ids: Vec<String> =
                c.query_map("SELECT agent_id FROM agent_ids ORDER BY agent_id", args![], |r| r.get(0))?;
            Ok(ids.iter().filter_map(|s| AgentId::parse(s).ok()).collect())
        })
    }

    /// Creates the session if its key is new; returns the stored row either way. Holds no global
    /// lock on a shared database: the insert decides by itself (`ON CONFLICT (key)`).
    pub fn insert_session(&self, s: &NewSession) -> Result<SessionRow> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| {
            insert_session(tx, s)?;
            session_by_key(tx, &s.key)?.ok_or_else(|| StoreError::Corrupt(format!("session {} vanished", s.key)))
        })
    }

    /// Marks `key` as an external session acting through an MCP client: creates it when missing,
    /// and flips a main session to external. Other existing sessions keep their driver. As
    /// [`Store::insert_session`], no global lock: each statement decides on the key's row itself.
    pub fn ensure_external(&self, new: &NewSession, is_main: bool) -> Result<SessionRow> {
        self.write_sql_row_locked(super::Survives::PowerLoss, true, |tx| {
            insert_session(tx, new)?;
            if is_main {
                tx.execute(
                    "UPDATE sessions SET driver = 'external', last_channel = coalesce(last_channel, 'webchat')
                     WHERE key = ?1 AND driver <> 'external'",
                    args![new.key.as_str()],
                )?;
            }
            session_by_key(tx, &new.key)?.ok_or_else(|| StoreError::Corrupt(format!("session {} vanished", new.key)))
        })
    }
}

pub(super) fn session_by_key(c: &dyn Sql, key: &SessionKey) -> Result<Option<SessionRow>> {
    let sql = format!("SELECT {COLUMNS} FROM sessions WHERE key = ?1");
    c.query_row(&sql, args![key.as_str()], SessionRow::from_row).optional()
}

/// The row id of the session `key`, inside a write (the flows append to sessions they just
/// created or looked up).
pub(super) fn session_id(tx: &dyn Sql, key: &SessionKey) -> Result<i64> {
    tx.query_row("SELECT id FROM sessions WHERE key = ?1", args![key.as_str()], |r| r.get(0))
}

/// Sets a session's `updated_at` back to what its source says (appending moves it).
pub(super) fn set_updated_at(tx: &dyn Sql, id: i64, at: i64) -> Result<()> {
    tx.execute("UPDATE sessions SET updated_at = ?2 WHERE id = ?1", args![id, at])?;
    Ok(())
}

/// Inserts `s` unless its key exists. Returns whether a row was created.
pub(super) fn insert_session(tx: &dyn Sql, s: &NewSession) -> Result<bool> {
    let state = if s.key.is_cron_run() {
        SessionState::Unlisted
    } else if s.archived_at.is_some() {
        SessionState::Archived
    } else {
        SessionState::Active
    };
    let json = |v: &Option<Value>| v.as_ref().map(Value::to_string);
    let created = tx.execute(
        "INSERT INTO sessions (key, session_id, agent_id, kind, state, driver, chat_type, channel, last_channel,
             last_to, delivery_context, label, display_name, spawned_by, spawn_depth, subagent_role, sandboxed,
             model, origin, created_at, updated_at, archived_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)
         ON CONFLICT (key) DO NOTHING",
        args![
            s.key.as_str(),
            s.session_id,
            s.agent_id.as_str(),
            s.kind.as_str(),
            state as i64,
            if s.external { "external" } else { "driven" },
            s.chat_type.map(ChatType::as_str),
            s.channel,
            s.last_channel,
            s.last_to,
            json(&s.delivery_context),
            s.label,
            s.display_name,
            s.spawned_by.as_ref().map(SessionKey::as_str),
            s.spawn_depth,
            s.subagent_role,
            s.sandboxed,
            s.model,
            json(&s.origin),
            s.created_at,
            s.updated_at,
            s.archived_at,
        ],
    )? > 0;
    if created {
        tx.execute("INSERT INTO agent_ids (agent_id) VALUES (?1) ON CONFLICT DO NOTHING", args![s.agent_id.as_str()])?;
    }
    Ok(created)
}

fn list_slice(c: &dyn Sql, q: &ListQuery) -> Result<Vec<SessionRow>> {
    // Both shapes order by (updated_at DESC, id DESC) straight off an index.
    let (root, mut sql) = match q.scope {
        SliceScope::Agent(agent) => (agent, format!("SELECT {COLUMNS} FROM sessions WHERE agent_id = ?1")),
        SliceScope::TreeOf(key) | SliceScope::TreeOfOtherAgents(key) => {
            let cols: Vec<String> = COLUMNS.split(", ").map(|c| format!("s.{}", c.trim())).collect();
            let other_agents = if matches!(q.scope, SliceScope::TreeOfOtherAgents(_)) {
                " AND s.agent_id <> (SELECT agent_id FROM sessions WHERE key = ?1)"
            } else {
                ""
            };
            (
                key,
                format!(
                    "SELECT {} FROM session_tree t JOIN sessions s ON s.id = t.session
                     WHERE t.ancestor = (SELECT id FROM sessions WHERE key = ?1){other_agents}",
                    cols.join(", ")
                ),
            )
        }
    };
    let (p, t) = match q.scope {
        SliceScope::Agent(_) => ("", ""),
        SliceScope::TreeOf(_) | SliceScope::TreeOfOtherAgents(_) => ("s.", "t."),
    };
    let id = if t.is_empty() { "id" } else { "t.session" };
    // Only the filters asked for are in the statement; each takes the next parameter number.
    let mut bound: Vec<ArgValue> = vec![root.arg()];
    let mut param = |v: ArgValue<'static>| {
        bound.push(v);
        format!("?{}", bound.len())
    };
    if let Some(kind) = q.kind {
        sql.push_str(&format!(" AND {p}kind = {}", param(ArgValue::Text(kind.as_str().into()))));
    }
    sql.push_str(&if q.include_archived { format!(" AND {p}state IN (0, 1)") } else { format!(" AND {p}state = 0") });
    if let Some(since) = q.updated_since {
        sql.push_str(&format!(" AND {t}updated_at >= {}", param(ArgValue::Int(since))));
    }
    if let Some((after_u, after_id)) = q.after {
        let (u, i) = (param(ArgValue::Int(after_u)), param(ArgValue::Int(after_id)));
        sql.push_str(&format!(" AND ({t}updated_at < {u} OR ({t}updated_at = {u} AND {id} < {i}))"));
    }
    if let Some(k) = q.exclude_key {
        sql.push_str(&format!(" AND {p}key <> {}", param(ArgValue::Text(k.to_string().into()))));
    }
    sql.push_str(&format!(" ORDER BY {t}updated_at DESC, {id} DESC LIMIT {}", param(ArgValue::Int(q.limit as i64))));
    let args: Vec<&dyn Arg> = bound.iter().map(|v| v as &dyn Arg).collect();
    c.query_map(&sql, &args, SessionRow::from_row)
}

/// Where a session's replies on its channel go (`Tx::set_route`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub channel: String,
    /// The address on the channel (`user:<id>` for a direct chat; group keys carry their own).
    pub to: Option<String>,
    pub thread_id: Option<String>,
    pub account_id: Option<String>,
}
