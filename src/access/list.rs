//! The visible session list: visibility and kind filters apply before the limit (**Fix**), in
//! index order, with a keyset cursor. Cost grows with `limit` under `agent`/`all`, and with the
//! caller's tree under `self`/`tree`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Access;
use crate::access::ToolError;
use crate::access::caller::Caller;
use crate::config::Visibility;
use crate::keys::{SessionKey, SessionKind};
use crate::store::{ListQuery, SessionRow, SessionState, SliceScope, now_ms};

/// Where a session's transcript can be read.
pub enum Transcript {
    /// Its exported file, when that lies under the export dir and exists.
    File(String),
    /// Otherwise its history resource.
    Resource(String),
}

pub fn transcript(r: &SessionRow, export_dir: Option<&std::path::Path>) -> Transcript {
    let exported = |p: &&String| {
        export_dir.is_some_and(|d| std::path::Path::new(p).starts_with(d)) && std::path::Path::new(p).exists()
    };
    match r.transcript_path.as_ref().filter(exported) {
        Some(path) => Transcript::File(path.clone()),
        None => Transcript::Resource(format!("sessions://history/{}", r.key)),
    }
}

/// What the caller asked for (already validated).
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    pub kinds: Option<Vec<SessionKind>>,
    pub limit: usize,
    pub active_minutes: Option<u64>,
    pub include_archived: bool,
    pub cursor: Option<String>,
}

/// One page of visible rows, newest first.
#[derive(Debug)]
pub struct ListPage {
    pub rows: Vec<SessionRow>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
    /// The caller's own key (its row is on the first page only) and the filters' fingerprint:
    /// what a cursor is made of.
    own_key: SessionKey,
    fingerprint: String,
}

impl ListPage {
    /// Ends the page one row earlier (for the answer budget): drops the last row other than the
    /// caller's own and points the cursor at it. The index it had; None when one other row is
    /// left, which every page keeps so that paging moves on.
    pub fn drop_last_other(&mut self) -> Option<usize> {
        if self.rows.iter().filter(|r| r.key != self.own_key).count() < 2 {
            return None;
        }
        let at = self.rows.iter().rposition(|r| r.key != self.own_key)?;
        self.rows.remove(at);
        self.has_more = true;
        self.next_cursor = Some(next_cursor(&self.rows, &self.own_key, &self.fingerprint));
        Some(at)
    }
}

/// Continue after the last other row; a page holding only the caller's own row continues from
/// the top (the own row is excluded from every page after the first).
fn next_cursor(rows: &[SessionRow], own_key: &SessionKey, fingerprint: &str) -> String {
    let position = rows.iter().rev().find(|r| r.key != *own_key).map_or((i64::MAX, i64::MAX), |r| (r.updated_at, r.id));
    encode_cursor(position, fingerprint)
}

#[derive(Serialize, Deserialize)]
struct Cursor {
    u: i64,
    i: i64,
    f: String,
}

fn newest_first(a: &SessionRow, b: &SessionRow) -> std::cmp::Ordering {
    (b.updated_at, b.id).cmp(&(a.updated_at, a.id))
}

impl Access {
    pub fn list(&self, caller: &Caller, req: &ListRequest) -> Result<ListPage, ToolError> {
        let rules = self.rules(caller);
        let fingerprint = filter_fingerprint(caller, req, rules.effective);
        let after = req.cursor.as_deref().map(|c| decode_cursor(c, &fingerprint)).transpose()?;
        let since = req.active_minutes.map(|m| now_ms() - (m as i64).saturating_mul(60_000));
        let want = req.limit + 1;
        let own_agent = caller.agent.to_string();
        let other_agents: Vec<String> = if rules.effective == Visibility::All && rules.a2a_enabled {
            let others = self.store.agent_ids()?;
            others
                .into_iter()
                .filter(|a| *a != caller.agent && rules.agent_visible(&caller.agent, a))
                .map(|a| a.to_string())
                .collect()
        } else {
            Vec::new()
        };
        let mut scopes: Vec<SliceScope> = Vec::new();
        match rules.effective {
            Visibility::OwnSession => {}
            Visibility::Tree => scopes.push(SliceScope::TreeOf(caller.key.as_str())),
            Visibility::Agent | Visibility::All => {
                scopes.push(SliceScope::Agent(&own_agent));
                scopes.extend(other_agents.iter().map(|a| SliceScope::Agent(a)));
                // The children the caller spawned under other agents are its tree (policy::visibility).
                scopes.push(SliceScope::TreeOfOtherAgents(caller.key.as_str()));
            }
        }
        let kinds: Vec<Option<SessionKind>> = match &req.kinds {
            Some(ks) => ks.iter().copied().map(Some).collect(),
            None => vec![None],
        };
        let mut rows = Vec::new();
        for scope in scopes {
            for kind in &kinds {
                rows.extend(self.store.list_slice(&ListQuery {
                    scope,
                    kind: *kind,
                    include_archived: req.include_archived,
                    updated_since: since,
                    after,
                    exclude_key: Some(caller.key.as_str()),
                    limit: want,
                })?);
            }
        }
        rows.retain(|r| r.key != caller.key);
        rows.sort_by(newest_first);
        // Under `all` an agent slice may hold what the tree slice holds too.
        rows.dedup_by_key(|r| r.id);
        rows.truncate(want);
        let mut has_more = rows.len() > req.limit;
        rows.truncate(req.limit);
        // The caller's own session is always on the first page (a model that sees `count: 0`
        // tends to loop); it never displaces the cursor position of the others.
        if after.is_none()
            && let Some(own) = self.store.session_by_key(&caller.key)?.filter(|r| {
                r.state != SessionState::Deleted && req.kinds.as_ref().is_none_or(|ks| ks.contains(&r.kind))
            })
        {
            let pos = rows.partition_point(|r| newest_first(r, &own).is_lt());
            rows.insert(pos, own);
            if rows.len() > req.limit {
                let last_other = rows.iter().rposition(|r| r.key != caller.key).expect("more rows than one");
                rows.remove(last_other);
                has_more = true;
            }
        }
        let own_key = caller.key.clone();
        let next_cursor = has_more.then(|| next_cursor(&rows, &own_key, &fingerprint));
        Ok(ListPage { rows, has_more, next_cursor, own_key, fingerprint })
    }
}

/// Binds a cursor to the caller and the filters it was made for.
fn filter_fingerprint(caller: &Caller, req: &ListRequest, effective: Visibility) -> String {
    let mut kinds: Vec<&str> = req.kinds.iter().flatten().map(|k| k.as_str()).collect();
    kinds.sort();
    let text = format!(
        "{}|{}|{:?}|{}|{}",
        caller.key,
        kinds.join(","),
        req.active_minutes,
        req.include_archived,
        effective.as_str()
    );
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

fn encode_cursor((u, i): (i64, i64), fingerprint: &str) -> String {
    let c = Cursor { u, i, f: fingerprint.to_string() };
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(&c).expect("cursor serialises"))
}

fn decode_cursor(raw: &str, fingerprint: &str) -> Result<(i64, i64), ToolError> {
    let bad = || {
        ToolError::invalid("cursor is not a cursor from sessions_list nextCursor; omit it to start from the first page")
    };
    let bytes = URL_SAFE_NO_PAD.decode(raw.trim()).map_err(|_| bad())?;
    let c: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if c.f != fingerprint {
        return Err(ToolError::invalid(
            "cursor was made for other filters (kinds, activeMinutes, includeArchived) or another caller; repeat the same filters or omit cursor",
        ));
    }
    Ok((c.u, c.i))
}
