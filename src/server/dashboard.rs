//! The operator's dashboard at `/ui` (README, Dashboard): a page and its assets embedded in the
//! binary, a JSON API under `/ui/api/`, and a live stream of the view.
//!
//! Who sees what is the bearer token's business, through the same access rules as the tools
//! ([`Viewer`]): an operator token (`server.operatorTokens`) sees everything and may act; a
//! client or run token sees its own session's tree and may do what its tools let it (cancel its
//! descendants, answer their asks); the loopback `--as` session is such a viewer without a token.
//! Tokens travel only in the `Authorization` header (never in a URL or a cookie), which is also
//! what makes the actions CSRF-safe: a page elsewhere cannot make the browser send that header,
//! and a cross-site JSON POST needs a CORS preflight this server never grants. Host and Origin are
//! checked as on `/mcp`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::http::HttpOptions;
use super::subscriptions::Hub;
use crate::access::{Access, ErrorStatus, ToolError, ViewRequest, Viewer};
use crate::engine::Engine;
use crate::engine::scheduler::Scheduler;
use crate::keys::SessionKey;
use crate::store::{Answer, AnsweredVia, AskDecision, AskState, LedgerAct};

const INDEX: &str = include_str!("ui/index.html");
const SCRIPT: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/app.css");
/// Roots in a view unless asked for more; the most one view holds.
const ROOTS: usize = 50;
const MAX_ROOTS: usize = 1_000;
/// How often the live stream looks for changes nobody announced (another process's writes).
const POLL: Duration = Duration::from_secs(1);
/// Live streams open at once on one listener.
const MAX_STREAMS: usize = 64;
/// The page may load only what it came with.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

#[derive(Clone)]
struct Ui {
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    options: HttpOptions,
    hub: Hub,
    streams: Arc<AtomicUsize>,
    cancel: CancellationToken,
}

pub fn router(
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    options: HttpOptions,
    hub: Hub,
    cancel: CancellationToken,
) -> axum::Router {
    let ui = Ui { access, runtime, options, hub, streams: Arc::new(AtomicUsize::new(0)), cancel };
    axum::Router::new()
        .route("/ui", axum::routing::get(page))
        .route("/ui/", axum::routing::get(page))
        .route("/ui/app.js", axum::routing::get(script))
        .route("/ui/app.css", axum::routing::get(style))
        .route("/ui/api/hello", axum::routing::get(hello))
        .route("/ui/api/view", axum::routing::get(view))
        .route("/ui/api/transcript", axum::routing::get(transcript))
        .route("/ui/api/events", axum::routing::get(events))
        .route("/ui/api/act", axum::routing::post(act))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(ui)
}

/// The headers every answer carries (Host and Origin were checked before, for every route
/// outside `/mcp`: `http::same_host_only`).
async fn security_headers(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    response
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, axum::Json(json!({"status": "error", "error": why}))).into_response()
}

async fn page() -> Response {
    let csp = HeaderValue::from_static(CSP);
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
            (header::CONTENT_SECURITY_POLICY, csp),
        ],
        INDEX,
    )
        .into_response()
}

async fn script() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT).into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// Whether requests without a token are served (loopback `serve --http --as`), so the page knows
/// whether to ask for one first.
async fn hello(State(ui): State<Ui>) -> Response {
    axum::Json(json!({"anonymous": ui.options.anonymous.is_some()})).into_response()
}

/// The viewer the request's credentials stand for, or the 401 to answer.
fn viewer(ui: &Ui, headers: &HeaderMap) -> Result<Viewer, Box<Response>> {
    let unauthorized = |why: &str| {
        let mut r = refuse(StatusCode::UNAUTHORIZED, why);
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        Box::new(r)
    };
    let Some(token) = super::http::bearer_token(headers) else {
        return match &ui.options.anonymous {
            Some(caller) if headers.get(header::AUTHORIZATION).is_none() => {
                Ok(Viewer::Session(Box::new(caller.clone())))
            }
            _ => Err(unauthorized("a token is required: an operator token (server.operatorTokens) or a client token")),
        };
    };
    if super::http::bears_one_of(headers, &ui.access.config().server.operator_tokens) {
        return Ok(Viewer::Operator);
    }
    match ui.access.caller_by_token(token) {
        Ok(Some(caller)) => Ok(Viewer::Session(Box::new(caller))),
        _ => Err(unauthorized("this token is not valid here (unknown, expired, or its run has ended)")),
    }
}

fn tool_error(e: ToolError) -> Response {
    let status = match e.status {
        ErrorStatus::Invalid => StatusCode::BAD_REQUEST,
        ErrorStatus::Forbidden => StatusCode::FORBIDDEN,
        ErrorStatus::NotFound => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, axum::Json(serde_json::to_value(&e).unwrap_or_default())).into_response()
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ViewQuery {
    filter: Option<String>,
    roots: Option<usize>,
    /// The transcript the page has open (the live stream tells when it grows).
    session: Option<String>,
}

impl ViewQuery {
    fn request(&self) -> ViewRequest {
        let filter = self.filter.clone().filter(|f| !f.trim().is_empty());
        ViewRequest { filter, roots: self.roots.unwrap_or(ROOTS).clamp(1, MAX_ROOTS) }
    }
}

async fn view(State(ui): State<Ui>, headers: HeaderMap, Query(q): Query<ViewQuery>) -> Response {
    let viewer = match viewer(&ui, &headers) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let access = ui.access.clone();
    let req = q.request();
    match tokio::task::spawn_blocking(move || access.dashboard(&viewer, &req)).await {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e)) => tool_error(e),
        Err(_) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "the view could not be read"),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TranscriptQuery {
    session: String,
    before: Option<i64>,
}

async fn transcript(State(ui): State<Ui>, headers: HeaderMap, Query(q): Query<TranscriptQuery>) -> Response {
    let viewer = match viewer(&ui, &headers) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let access = ui.access.clone();
    match tokio::task::spawn_blocking(move || access.dashboard_transcript(&viewer, &q.session, q.before)).await {
        Ok(Ok(v)) => axum::Json(v).into_response(),
        Ok(Err(e)) => tool_error(e),
        Err(_) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "the transcript could not be read"),
    }
}

/// One open live stream; dropping it gives the place back.
struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a live stream knows between two looks.
struct Live {
    ui: Ui,
    viewer: Viewer,
    req: ViewRequest,
    /// The open transcript, when the viewer may read it, and its last seq told.
    watched: Option<(SessionKey, i64)>,
    feed: tokio::sync::broadcast::Receiver<super::subscriptions::Batch>,
    changes: tokio::sync::watch::Receiver<u64>,
    mark: Option<String>,
    last_view: Option<String>,
    _slot: StreamSlot,
}

/// `GET /ui/api/events`: server-sent events — `view` (the whole view, whenever what it shows
/// changed; the first at once) and `transcript` (`{sessionKey, lastSeq}`, when the open one grew).
/// Woken by the same change feed as the resource subscriptions, plus a one-second look for
/// writers that announce nothing.
async fn events(State(ui): State<Ui>, headers: HeaderMap, Query(q): Query<ViewQuery>) -> Response {
    let viewer = match viewer(&ui, &headers) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    if ui.streams.fetch_add(1, Ordering::SeqCst) >= MAX_STREAMS {
        ui.streams.fetch_sub(1, Ordering::SeqCst);
        return refuse(StatusCode::TOO_MANY_REQUESTS, "too many dashboard streams are open; close one");
    }
    let slot = StreamSlot(ui.streams.clone());
    let feed = ui.hub.receiver();
    let changes = ui.access.changes();
    let watched = q.session.as_deref().and_then(|raw| readable(&ui.access, &viewer, raw));
    let cancel = ui.cancel.clone();
    let live = Live { req: q.request(), ui, viewer, watched, feed, changes, mark: None, last_view: None, _slot: slot };
    let stream = futures::stream::unfold(live, move |mut live| {
        let cancel = cancel.clone();
        async move {
            loop {
                if let Some(event) = live.next_event().await {
                    return Some((Ok::<_, Infallible>(event), live));
                }
                tokio::select! {
                    _ = cancel.cancelled() => return None,
                    batch = live.feed.recv() => {
                        if let Some(event) = live.grown(batch) {
                            return Some((Ok(event), live));
                        }
                    }
                    _ = live.changes.changed() => {}
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// The session `raw` names, with its last seq, when the viewer may read it; else None (the
/// stream then says nothing of it, exactly as for a session that does not exist).
fn readable(access: &Access, viewer: &Viewer, raw: &str) -> Option<(SessionKey, i64)> {
    let page = access.dashboard_transcript(viewer, raw, None).ok()?;
    let key = SessionKey::from_canonical(page["sessionKey"].as_str()?);
    let seq = access.last_seq_of(&key).ok()?;
    Some((key, seq))
}

impl Live {
    /// The view, when the store changed since the last look and what the view shows with it.
    async fn next_event(&mut self) -> Option<Event> {
        let access = self.ui.access.clone();
        let mark = tokio::task::spawn_blocking(move || access.dashboard_mark()).await.ok()?.ok()?;
        if self.mark.as_ref() == Some(&mark) {
            return None;
        }
        self.mark = Some(mark);
        let (access, viewer, req) = (self.ui.access.clone(), self.viewer.clone(), self.req.clone());
        let mut view = tokio::task::spawn_blocking(move || access.dashboard(&viewer, &req)).await.ok()?.ok()?;
        let generated = view.as_object_mut()?.remove("generatedAt");
        let text = view.to_string();
        if self.last_view.as_ref() == Some(&text) {
            return None;
        }
        self.last_view = Some(text);
        view["generatedAt"] = generated.unwrap_or(Value::Null);
        Some(Event::default().event("view").data(view.to_string()))
    }

    /// A `transcript` event when the open transcript is in the batch with a newer seq.
    fn grown(
        &mut self,
        batch: Result<super::subscriptions::Batch, tokio::sync::broadcast::error::RecvError>,
    ) -> Option<Event> {
        let (key, last) = self.watched.as_mut()?;
        let seq = match batch {
            Ok(batch) => batch.iter().find(|(k, _)| k == key.as_str()).map(|(_, s)| *s)?,
            Err(_) => self.ui.access.last_seq_of(key).ok()?,
        };
        if seq <= *last {
            return None;
        }
        *last = seq;
        Some(Event::default().event("transcript").data(json!({"sessionKey": key.as_str(), "lastSeq": seq}).to_string()))
    }
}

/// `POST /ui/api/act`: `{action: "cancel", sessionKey}`, `{action: "respond", requestId,
/// decision, text?}`, `{action: "retry" | "dismiss", deliveryId}`. JSON only.
#[derive(Deserialize)]
#[serde(tag = "action", rename_all = "camelCase", deny_unknown_fields)]
enum Act {
    #[serde(rename_all = "camelCase")]
    Cancel { session_key: String },
    #[serde(rename_all = "camelCase")]
    Respond { request_id: String, decision: String, text: Option<String> },
    #[serde(rename_all = "camelCase")]
    Retry { delivery_id: i64 },
    #[serde(rename_all = "camelCase")]
    Dismiss { delivery_id: i64 },
}

async fn act(State(ui): State<Ui>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")));
    if !json_body {
        return refuse(StatusCode::UNSUPPORTED_MEDIA_TYPE, "an action is a JSON body (Content-Type: application/json)");
    }
    let viewer = match viewer(&ui, &headers) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let act: Act = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            let why = format!(
                "the action could not be read ({e}); allowed: {{action: \"cancel\", sessionKey}}, \
                 {{action: \"respond\", requestId, decision: \"allow\"|\"deny\", text?}}, \
                 {{action: \"retry\"|\"dismiss\", deliveryId}}"
            );
            return refuse(StatusCode::BAD_REQUEST, &why);
        }
    };
    match perform(&ui, &viewer, act).await {
        Ok(note) => axum::Json(json!({"status": "ok", "note": note})).into_response(),
        Err(e) => tool_error(e),
    }
}

async fn perform(ui: &Ui, viewer: &Viewer, act: Act) -> Result<String, ToolError> {
    let engine = Engine::new(&ui.access, ui.runtime.as_ref());
    let by = viewer.name();
    match (act, viewer) {
        (Act::Cancel { session_key }, Viewer::Operator) => {
            let row = ui.access.operator_row(&session_key)?;
            let done = engine.cancel_tree(row, true, &CancellationToken::new()).await?;
            Ok(cancelled(&done))
        }
        (Act::Cancel { session_key }, Viewer::Session(caller)) => {
            let row = ui.access.subagent(caller, "sessionKey", &session_key)?;
            let done = engine.cancel_subagent(caller, row, true, &CancellationToken::new()).await?;
            Ok(cancelled(&done))
        }
        (Act::Respond { request_id, decision, text }, viewer) => {
            let decision = AskDecision::parse(&decision).ok_or_else(|| {
                ToolError::invalid(format!("decision {decision:?} is not allowed; allowed: allow, deny"))
            })?;
            respond(ui, &engine, viewer, &request_id, decision, text.as_deref())
        }
        (Act::Retry { .. } | Act::Dismiss { .. }, Viewer::Session(_)) => {
            Err(ToolError::forbidden("retry and dismiss need an operator token (server.operatorTokens)"))
        }
        (Act::Retry { delivery_id }, Viewer::Operator) => ledger_note(
            delivery_id,
            "queued again",
            engine.retry_delivery(delivery_id, &by)?,
            "failed or expired channel",
        ),
        (Act::Dismiss { delivery_id }, Viewer::Operator) => ledger_note(
            delivery_id,
            "dismissed",
            engine.dismiss_delivery(delivery_id, &by)?,
            "failed, expired or undeliverable",
        ),
    }
}

fn cancelled(done: &crate::engine::subagents::CancelOutcome) -> String {
    if done.already_ended {
        return "it had ended already; nothing changed".into();
    }
    let keys: Vec<&str> = done.cancelled.iter().map(SessionKey::as_str).collect();
    format!("cancelled: {}", keys.join(", "))
}

fn respond(
    ui: &Ui,
    engine: &Engine,
    viewer: &Viewer,
    id: &str,
    decision: AskDecision,
    text: Option<&str>,
) -> Result<String, ToolError> {
    let ask = match viewer {
        Viewer::Session(caller) => {
            let ask = ui.access.ask_in_tree(caller, id)?;
            match engine.respond(caller, &ask, decision, text, AnsweredVia::Dashboard)? {
                crate::engine::ask::Responded::Answered(_) => {
                    return Ok(format!("answered {id}: {}", decision.as_str()));
                }
                crate::engine::ask::Responded::AlreadyAnswered(ask) => ask,
            }
        }
        Viewer::Operator => {
            let rt = ui.runtime.as_ref().ok_or_else(|| ToolError::error("answering needs the runtime"))?;
            let answer = Answer { decision, text, by: "operator", via: AnsweredVia::Dashboard };
            if crate::engine::ask::close(rt, id, AskState::Answered, &answer)? {
                return Ok(format!("answered {id}: {}", decision.as_str()));
            }
            ui.access.ask(id)?.ok_or_else(|| ToolError::not_found(format!("no request {id}")))?
        }
    };
    Err(ToolError::invalid(format!(
        "requestId {id} {}; your answer was not used",
        crate::engine::ask::closed_how(&ask)
    )))
}

fn ledger_note(id: i64, done: &str, act: LedgerAct, applies_to: &str) -> Result<String, ToolError> {
    match act {
        LedgerAct::Done => Ok(format!("delivery {id} {done}")),
        LedgerAct::Missing => Err(ToolError::not_found(format!("no delivery {id}"))),
        LedgerAct::NotApplicable(status) => {
            Err(ToolError::invalid(format!("delivery {id} is {status}; this applies only to a {applies_to} delivery")))
        }
    }
}
