//! Transcripts as MCP resources: the template `sessions://history/{key}` (`?beforeSeq=N` or
//! `?afterSeq=N` for another page, within the same answer budget), a paginated list of the
//! caller's visible sessions, reads through the same path as `sessions_history` (so an invisible
//! session and an unknown one answer alike), and `notifications/resources/updated` when a watched transcript grows — asked for with
//! `resources/subscribe` (handshake era) or `subscriptions/listen` (2026-07-28).

use rmcp::model::{
    CacheScope, ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate, SubscriptionFilter,
};
use rmcp::service::{Peer, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};

use super::subscriptions::{Named, Subscriptions};
use crate::access::caller::Caller;
use crate::access::{Access, ListRequest};
use crate::keys::{SessionKey, SessionRef};
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
            .with_description(
                "A session's transcript as sessions_history returns it (key in any accepted form); \
                 page on with ?beforeSeq=N or ?afterSeq=N, the answer's nextBeforeSeq / nextAfterSeq",
            )
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
    let key = key_part(uri)?;
    let mut args = json!({"sessionKey": key}).as_object().cloned()?;
    for (name, value) in page_query(uri)? {
        args.insert(name.into(), value.into());
    }
    let result = tools::call(ctx, "sessions_history", Some(args)).await?;
    let structured = result.structured_content?;
    (structured.get("status").and_then(Value::as_str) == Some("ok")).then_some(structured)
}

fn key_part(uri: &str) -> Option<&str> {
    let path = uri.split_once('?').map_or(uri, |(path, _)| path);
    path.strip_prefix(PREFIX).filter(|k| !k.is_empty() && !k.contains('/'))
}

/// The page a URI asks for: `?beforeSeq=N` or `?afterSeq=N` (nothing: the newest page). None
/// for any other query, which reads as an unknown resource.
fn page_query(uri: &str) -> Option<Vec<(&'static str, u64)>> {
    let Some((_, query)) = uri.split_once('?') else { return Some(Vec::new()) };
    query
        .split('&')
        .map(|pair| {
            let (name, value) = pair.split_once('=')?;
            let name = ["beforeSeq", "afterSeq"].into_iter().find(|n| *n == name)?;
            Some((name, value.parse().ok()?))
        })
        .collect()
}

/// `resources/subscribe` (handshake era): watches a transcript the caller may read, counted once
/// whatever form its key takes; "not found" if the caller may not read it.
pub async fn subscribe(ctx: &Ctx<'_>, subs: &Subscriptions, uri: &str, peer: Peer<RoleServer>) -> Result<(), McpError> {
    history(ctx, uri).await.ok_or_else(|| not_found(uri))?;
    let raw = key_part(uri).ok_or_else(|| not_found(uri))?;
    let target = ctx.access.resolve(ctx.caller, crate::policy::Action::History, "uri", raw);
    let key = target.map_err(|_| not_found(uri))?.key;
    subs.start_watcher(peer);
    subs.add(&ctx.caller.key, Named { identity: key.to_string(), readable: Some(key) }, uri)
}

/// `resources/unsubscribe`: forgets the transcript in whatever form it was subscribed.
pub fn unsubscribe(ctx: &Ctx<'_>, subs: &Subscriptions, uri: &str) {
    let identity = key_part(uri).and_then(|raw| identity_of(ctx, raw));
    subs.remove(identity.as_deref(), uri);
}

/// The canonical key a reference names for this caller, without asking whether the caller may
/// see it; a sessionId only through a visible session (else what was typed, lower-cased).
fn identity_of(ctx: &Ctx<'_>, raw: &str) -> Option<String> {
    match ctx.access.parse_ref(ctx.caller, "uri", raw).ok()? {
        SessionRef::Key(key) => Some(key.to_string()),
        SessionRef::SessionId(id) => Some(
            ctx.access
                .resolve(ctx.caller, crate::policy::Action::History, "uri", &id)
                .map_or_else(|_| format!("sessionId:{}", id.to_ascii_lowercase()), |t| t.key.to_string()),
        ),
    }
}

/// A listened-to URI: readable, or held without notifications (so the caller's slot count
/// cannot tell an invisible session from a missing one). None for a key that cannot parse.
async fn listened(ctx: &Ctx<'_>, uri: &str) -> Option<Named> {
    let raw = key_part(uri)?;
    let identity = identity_of(ctx, raw)?;
    let readable = match history(ctx, uri).await {
        Some(_) => ctx.access.resolve(ctx.caller, crate::policy::Action::History, "uri", raw).ok().map(|t| t.key),
        None => None,
    };
    Some(match readable {
        Some(key) => Named { identity: key.to_string(), readable: Some(key) },
        None => Named { identity, readable: None },
    })
}

/// The part of a `subscriptions/listen` filter we serve: transcript URIs (our tool, prompt and
/// resource lists never change while a client is connected).
pub fn accepted_filter(requested: &SubscriptionFilter) -> SubscriptionFilter {
    let uris = requested.resource_subscriptions.iter().flatten().filter(|u| u.starts_with(PREFIX));
    SubscriptionFilter::builder().resource_subscriptions(uris.cloned()).build()
}

/// `subscriptions/listen` (2026-07-28): notifies while the accepted transcripts grow, until the
/// client cancels. A transcript the caller may not read is accepted like any other and simply
/// never updates, so the acknowledgment cannot tell an invisible session from a missing one. The
/// URIs count against the caller's `server.maxSubscriptions` while the listen lasts.
pub async fn listen(ctx: &Ctx<'_>, subs: Subscriptions, context: SubscriptionContext) -> Result<(), McpError> {
    let mut rx = subs.receiver();
    for uri in context.accepted().resource_subscriptions.iter().flatten() {
        if let Some(named) = listened(ctx, uri).await {
            subs.add(&ctx.caller.key, named, uri)?;
        }
    }
    subs.tracked(async {
        loop {
            let grown = tokio::select! {
                _ = context.cancelled() => return Ok(()),
                g = subs.next(&mut rx) => g,
            };
            for uri in grown.unwrap_or_default() {
                if context.sink().notify_resource_updated(uri).await.is_err() {
                    return Ok(());
                }
            }
        }
    })
    .await
}
