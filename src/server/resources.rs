//! Transcripts as MCP resources: the template `sessions://history/{key}`, a paginated list of the
//! caller's visible sessions, reads through the same path as `sessions_history` (so an invisible
//! session and an unknown one answer alike), and `resources/subscribe` (handshake era) with
//! `notifications/resources/updated` when a subscribed transcript grows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CacheScope, ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate, ResourceUpdatedNotificationParam,
};
use rmcp::service::Peer;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};

use crate::access::{Access, ListRequest};
use crate::caller::Caller;
use crate::keys::SessionKey;
use crate::tools::{self, Ctx};

const PREFIX: &str = "sessions://history/";
pub const TEMPLATE: &str = "sessions://history/{key}";
const PAGE: usize = 50;

pub fn uri_of(key: &SessionKey) -> String {
    format!("{PREFIX}{key}")
}

fn not_found(uri: &str) -> McpError {
    McpError::resource_not_found("resource not found", Some(json!({"uri": uri})))
}

pub fn templates() -> ListResourceTemplatesResult {
    let mut r = ListResourceTemplatesResult::with_all_items(vec![
        ResourceTemplate::new(TEMPLATE, "session-history")
            .with_title("Session transcript")
            .with_description("A session's transcript as sessions_history returns it (key in any accepted form)")
            .with_mime_type("application/json"),
    ]);
    r.cache_scope = Some(CacheScope::Private);
    r
}

/// The caller's visible sessions, newest first, a page at a time.
pub fn list(access: &Access, caller: &Caller, cursor: Option<String>) -> Result<ListResourcesResult, McpError> {
    let req = ListRequest { kinds: None, limit: PAGE, active_minutes: None, include_archived: false, cursor };
    let page = access.list(caller, &req).map_err(|e| McpError::invalid_params(e.message, None))?;
    let scope = access.scope(caller);
    let resources = page
        .rows
        .iter()
        .map(|r| {
            let mut res = Resource::new(uri_of(&r.key), scope.display(&r.key)).with_mime_type("application/json");
            if let Some(label) = &r.label {
                res = res.with_description(format!("label: {label}"));
            }
            res
        })
        .collect();
    let mut result = ListResourcesResult::with_all_items(resources);
    result.next_cursor = page.next_cursor;
    result.cache_scope = Some(CacheScope::Private);
    Ok(result)
}

/// Reads a transcript; anything the caller may not read is "not found", like an unknown key.
pub async fn read(ctx: &Ctx<'_>, uri: &str) -> Result<ReadResourceResult, McpError> {
    let history = history(ctx, uri).await.ok_or_else(|| not_found(uri))?;
    Ok(ReadResourceResult::new(vec![ResourceContents::TextResourceContents {
        uri: uri.to_string(),
        mime_type: Some("application/json".into()),
        text: history.to_string(),
        meta: None,
    }]))
}

async fn history(ctx: &Ctx<'_>, uri: &str) -> Option<Value> {
    let key = uri.strip_prefix(PREFIX).filter(|k| !k.is_empty() && !k.contains('/'))?;
    let args = json!({"sessionKey": key}).as_object().cloned();
    let result = tools::call(ctx, "sessions_history", args).await?;
    let structured = result.structured_content?;
    (structured.get("status").and_then(Value::as_str) == Some("ok")).then_some(structured)
}

/// A client's subscriptions: uri → the highest seq it was told about.
#[derive(Clone, Default)]
pub struct Subscriptions {
    seen: Arc<Mutex<HashMap<String, (SessionKey, i64)>>>,
    watching: Arc<std::sync::atomic::AtomicBool>,
}

impl Subscriptions {
    /// Subscribes to a transcript the caller may read; starts the watcher on first use.
    pub async fn subscribe(&self, ctx: &Ctx<'_>, uri: &str, peer: Peer<RoleServer>) -> Result<(), McpError> {
        let structured = history(ctx, uri).await.ok_or_else(|| not_found(uri))?;
        let target = ctx.access.resolve(ctx.caller, crate::policy::Action::History, "uri", &uri[PREFIX.len()..]);
        let key = target.map_err(|_| not_found(uri))?.key;
        let last = structured["messages"]
            .as_array()
            .and_then(|m| m.iter().filter_map(|x| x["seq"].as_i64()).max())
            .unwrap_or(0);
        self.seen.lock().expect("subscriptions").insert(uri.to_string(), (key, last));
        if !self.watching.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tokio::spawn(watch(self.clone(), ctx.access.clone(), peer));
        }
        Ok(())
    }

    pub fn unsubscribe(&self, uri: &str) {
        self.seen.lock().expect("subscriptions").remove(uri);
    }
}

/// Tells the client when a subscribed transcript grows (polls the store: other processes append
/// too). Ends when the client is gone.
async fn watch(subs: Subscriptions, access: Access, peer: Peer<RoleServer>) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let entries: Vec<(String, SessionKey, i64)> =
            subs.seen.lock().expect("subscriptions").iter().map(|(u, (k, s))| (u.clone(), k.clone(), *s)).collect();
        for (uri, key, seen) in entries {
            let Ok(now) = access.store.last_seq_of(&key) else { continue };
            if now > seen {
                if let Some(entry) = subs.seen.lock().expect("subscriptions").get_mut(&uri) {
                    entry.1 = now;
                }
                if peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri.clone())).await.is_err() {
                    return;
                }
            }
        }
    }
}
