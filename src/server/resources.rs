//! Transcripts as MCP resources: the template `sessions://history/{key}`, a paginated list of the
//! caller's visible sessions, reads through the same path as `sessions_history` (so an invisible
//! session and an unknown one answer alike), and `notifications/resources/updated` when a watched transcript grows — asked for with
//! `resources/subscribe` (handshake era) or `subscriptions/listen` (2026-07-28).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CacheScope, ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate, ResourceUpdatedNotificationParam, SubscriptionFilter,
};
use rmcp::service::{Peer, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};

use crate::access::{Access, ListRequest};
use crate::caller::Caller;
use crate::keys::SessionKey;
use crate::tools::{self, Ctx};

const PREFIX: &str = "sessions://history/";
pub const TEMPLATE: &str = "sessions://history/{key}";
const PAGE: usize = 50;
/// How often watched transcripts are checked for new messages.
const POLL: Duration = Duration::from_millis(250);

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

/// The transcripts one client watches: uri → (its session, the highest seq it was told about).
#[derive(Clone, Default)]
pub struct Subscriptions {
    seen: Arc<Mutex<HashMap<String, (SessionKey, i64)>>>,
    watching: Arc<std::sync::atomic::AtomicBool>,
}

impl Subscriptions {
    /// `resources/subscribe` (handshake era): watches a transcript the caller may read; the first
    /// subscription starts the watcher, which notifies through `peer`.
    pub async fn subscribe(&self, ctx: &Ctx<'_>, uri: &str, peer: Peer<RoleServer>) -> Result<(), McpError> {
        self.add(ctx, uri).await?;
        if !self.watching.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tokio::spawn(watch(self.clone(), ctx.access.clone(), peer));
        }
        Ok(())
    }

    pub fn unsubscribe(&self, uri: &str) {
        self.seen.lock().expect("subscriptions").remove(uri);
    }

    /// Starts watching `uri` from its current last seq; "not found" if the caller may not read it.
    async fn add(&self, ctx: &Ctx<'_>, uri: &str) -> Result<(), McpError> {
        let structured = history(ctx, uri).await.ok_or_else(|| not_found(uri))?;
        let target = ctx.access.resolve(ctx.caller, crate::policy::Action::History, "uri", &uri[PREFIX.len()..]);
        let key = target.map_err(|_| not_found(uri))?.key;
        let last = structured["messages"]
            .as_array()
            .and_then(|m| m.iter().filter_map(|x| x["seq"].as_i64()).max())
            .unwrap_or(0);
        self.seen.lock().expect("subscriptions").insert(uri.to_string(), (key, last));
        Ok(())
    }

    /// The watched transcripts that grew since the last call (the store is polled: other
    /// processes append too).
    fn grown(&self, access: &Access) -> Vec<String> {
        let mut seen = self.seen.lock().expect("subscriptions");
        let mut grown = Vec::new();
        for (uri, (key, last)) in seen.iter_mut() {
            let Ok(now) = access.store.last_seq_of(key) else { continue };
            if now > *last {
                *last = now;
                grown.push(uri.clone());
            }
        }
        grown
    }
}

/// Tells a handshake-era client when a subscribed transcript grows. Ends when the client is gone.
async fn watch(subs: Subscriptions, access: Access, peer: Peer<RoleServer>) {
    loop {
        tokio::time::sleep(POLL).await;
        for uri in subs.grown(&access) {
            if peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri)).await.is_err() {
                return;
            }
        }
    }
}

/// The part of a `subscriptions/listen` filter we serve: transcript URIs (our tool, prompt and
/// resource lists never change while a client is connected).
pub fn accepted_filter(requested: &SubscriptionFilter) -> SubscriptionFilter {
    let uris = requested.resource_subscriptions.iter().flatten().filter(|u| u.starts_with(PREFIX));
    SubscriptionFilter::builder().resource_subscriptions(uris.cloned()).build()
}

/// `subscriptions/listen` (2026-07-28): notifies while the accepted transcripts grow, until the
/// client cancels. A transcript the caller may not read is accepted like any other and simply
/// never updates, so the acknowledgment cannot tell an invisible session from a missing one.
pub async fn listen(ctx: &Ctx<'_>, context: SubscriptionContext) -> Result<(), McpError> {
    let subs = Subscriptions::default();
    for uri in context.accepted().resource_subscriptions.iter().flatten() {
        let _ = subs.add(ctx, uri).await;
    }
    loop {
        tokio::select! {
            _ = context.cancelled() => return Ok(()),
            _ = tokio::time::sleep(POLL) => {}
        }
        for uri in subs.grown(ctx.access) {
            if context.sink().notify_resource_updated(uri).await.is_err() {
                return Ok(());
            }
        }
    }
}
