//! The operator's dashboard at `/ui` (docs/OPERATING.md, Dashboard): a page and its assets embedded in the
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

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::http::{Credential, Held, HttpOptions, Open};
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
/// Live streams open at once on one listener, and how many of them only operator tokens may
/// open (so that clients, together, can never lock the operator out).
const MAX_STREAMS: usize = 64;
const OPERATOR_STREAMS: usize = 8;
/// The least time between two looks at one view, however many changes come: with the view
/// built once per look for all the streams that show it, this bounds what a busy store costs.
const LOOK_GAP: Duration = Duration::from_millis(250);
/// The page may load only what it came with.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// What the dashboard shares with the rest of its listener.
pub struct Shared {
    /// The change feed of the resource subscriptions.
    pub hub: Hub,
    /// Each credential's places (`server.maxStreamsPerCredential`): a live stream takes one, as
    /// its `/mcp` requests do.
    pub open: Open<Credential>,
    pub cancel: CancellationToken,
}

#[derive(Clone)]
struct Ui {
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    options: HttpOptions,
    hub: Hub,
    open: Open<Credential>,
    streams: Arc<AtomicUsize>,
    views: LiveViews,
    cancel: CancellationToken,
}

pub fn router(access: Access, runtime: Option<Arc<Scheduler>>, options: HttpOptions, shared: Shared) -> axum::Router {
    let Shared { hub, open, cancel } = shared;
    let streams = Arc::new(AtomicUsize::new(0));
    let ui = Ui { access, runtime, options, hub, open, streams, views: LiveViews::default(), cancel };
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
            _ => Err(unauthorized(
                "a token is required: an operator token (`sessions-mcp token create --operator`, or server.operatorTokens) or a client token",
            )),
        };
    };
    if ui.access.is_operator_token(token) {
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

/// One open live stream; dropping it gives the listener's slot and the credential's place back.
struct StreamSlot {
    streams: Arc<AtomicUsize>,
    _place: Held<Credential>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.streams.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A slot of the listener's live streams, when one is free for this viewer: a client may take
/// all but the operators' share.
fn stream_slot(streams: &Arc<AtomicUsize>, operator: bool, place: Held<Credential>) -> Option<StreamSlot> {
    let max = if operator { MAX_STREAMS } else { MAX_STREAMS - OPERATOR_STREAMS };
    streams.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1)).ok()?;
    Some(StreamSlot { streams: streams.clone(), _place: place })
}

/// What makes two live streams show the same view: whose scope, and what was asked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ViewKey {
    /// The viewer's session; None for an operator.
    session: Option<String>,
    filter: Option<String>,
    roots: usize,
}

impl ViewKey {
    fn of(viewer: &Viewer, req: &ViewRequest) -> ViewKey {
        match viewer {
            Viewer::Operator => ViewKey { session: None, filter: req.filter.clone(), roots: req.roots },
            // A client's filter changes nothing in its view (`Access::dashboard`).
            Viewer::Session(c) => ViewKey { session: Some(c.key.to_string()), filter: None, roots: req.roots },
        }
    }
}

/// The views the listener's live streams show, one per distinct key, kept while a stream
/// shows it.
#[derive(Clone, Default)]
struct LiveViews(Arc<std::sync::Mutex<HashMap<ViewKey, Weak<LiveView>>>>);

impl LiveViews {
    fn view(&self, key: ViewKey) -> Arc<LiveView> {
        let mut views = self.0.lock().expect("live views");
        if let Some(view) = views.get(&key).and_then(Weak::upgrade) {
            return view;
        }
        views.retain(|_, v| v.strong_count() > 0);
        let view = Arc::new(LiveView::default());
        views.insert(key, Arc::downgrade(&view));
        view
    }
}

/// One view shared by the streams that show it: the streams one change wakes wait on its lock
/// for a single look, and then all send what it built.
#[derive(Default)]
struct LiveView(tokio::sync::Mutex<Looked>);

#[derive(Default)]
struct Looked {
    /// When the last look started, and the store's mark it read.
    at: Option<Instant>,
    mark: Option<String>,
    /// The last view built, without `generatedAt` (what tells a change).
    compared: String,
    shown: Option<Shown>,
}

/// A view as its streams send it; `version` grows with each change in what it shows.
#[derive(Debug, Clone)]
struct Shown {
    version: u64,
    data: Arc<str>,
}

/// One look at the store for a view: given the mark of the last, the store's mark now and, when
/// it moved, the view built anew.
type Look = Box<dyn FnOnce(Option<String>) -> Option<(String, Option<Value>)> + Send>;

impl LiveView {
    /// The view as of a look that started at or after `woke`: the last one's when it did (a
    /// stream woken by the same change as another), else a new look, no sooner than
    /// [`LOOK_GAP`] after the last.
    async fn since(&self, woke: Instant, look: Look) -> Option<Shown> {
        let mut looked = self.0.lock().await;
        if looked.at.is_some_and(|at| at >= woke) {
            return looked.shown.clone();
        }
        if let Some(at) = looked.at {
            tokio::time::sleep_until(at + LOOK_GAP).await;
        }
        let at = Instant::now();
        let last = looked.mark.clone();
        let (mark, view) = tokio::task::spawn_blocking(move || look(last)).await.ok()??;
        looked.at = Some(at);
        looked.mark = Some(mark);
        if let Some(view) = view {
            looked.show(view);
        }
        looked.shown.clone()
    }
}

impl Looked {
    fn show(&mut self, mut view: Value) {
        let generated = view.as_object_mut().and_then(|v| v.remove("generatedAt"));
        let compared = view.to_string();
        if self.shown.is_some() && self.compared == compared {
            return;
        }
        self.compared = compared;
        view["generatedAt"] = generated.unwrap_or(Value::Null);
        let version = self.shown.as_ref().map_or(0, |s| s.version + 1);
        self.shown = Some(Shown { version, data: view.to_string().into() });
    }
}

/// The real look: the store's mark, and the viewer's view when the mark moved.
fn look(access: Access, viewer: Viewer, req: ViewRequest) -> Look {
    Box::new(move |last| {
        let mark = access.dashboard_mark().ok()?;
        if last.as_ref() == Some(&mark) {
            return Some((mark, None));
        }
        let view = access.dashboard(&viewer, &req).ok()?;
        Some((mark, Some(view)))
    })
}

/// What a live stream knows between two looks.
struct Live {
    ui: Ui,
    viewer: Viewer,
    req: ViewRequest,
    view: Arc<LiveView>,
    /// The open transcript, when the viewer may read it, and its last seq told.
    watched: Option<(SessionKey, i64)>,
    feed: tokio::sync::broadcast::Receiver<super::subscriptions::Batch>,
    changes: tokio::sync::watch::Receiver<u64>,
    /// The version of the view last sent.
    sent: Option<u64>,
    _slot: StreamSlot,
}

/// `GET /ui/api/events`: server-sent events — `view` (the whole view, whenever what it shows
/// changed; the first at once) and `transcript` (`{sessionKey, lastSeq}`, when the open one grew).
/// Woken by the same change feed as the resource subscriptions, plus a one-second look for
/// writers that announce nothing. The streams that show the same view share its looks: one
/// build per change, at most one look per [`LOOK_GAP`]. A stream takes one of its credential's
/// places (`server.maxStreamsPerCredential`) and one of the listener's [`MAX_STREAMS`].
async fn events(State(ui): State<Ui>, headers: HeaderMap, Query(q): Query<ViewQuery>) -> Response {
    let viewer = match viewer(&ui, &headers) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(place) = ui.open.take(&Credential::of(&headers)) else { return ui.open.refused() };
    let Some(slot) = stream_slot(&ui.streams, viewer.is_operator(), place) else {
        return refuse(StatusCode::TOO_MANY_REQUESTS, "too many dashboard streams are open; close one");
    };
    let feed = ui.hub.receiver();
    let changes = ui.access.changes();
    let watched = q.session.as_deref().and_then(|raw| readable(&ui.access, &viewer, raw));
    let cancel = ui.cancel.clone();
    let req = q.request();
    let view = ui.views.view(ViewKey::of(&viewer, &req));
    let live = Live { req, view, ui, viewer, watched, feed, changes, sent: None, _slot: slot };
    let stream = futures::stream::unfold(live, move |mut live| {
        let cancel = cancel.clone();
        async move {
            let mut woke = Instant::now();
            loop {
                if let Some(event) = live.next_event(woke).await {
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
                woke = Instant::now();
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
    /// The view, when what it shows changed since this stream last sent it, as of a look at the
    /// store at or after `woke`.
    async fn next_event(&mut self, woke: Instant) -> Option<Event> {
        let look = look(self.ui.access.clone(), self.viewer.clone(), self.req.clone());
        let shown = self.view.since(woke, look).await?;
        if self.sent == Some(shown.version) {
            return None;
        }
        self.sent = Some(shown.version);
        Some(Event::default().event("view").data(&*shown.data))
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
            match engine.respond(caller, &ask, decision, text, AnsweredVia::Dashboard, Default::default())? {
                crate::engine::ask::Responded::Answered(_) => {
                    return Ok(format!("answered {id}: {}", decision.as_str()));
                }
                crate::engine::ask::Responded::AlreadyAnswered(ask) => ask,
            }
        }
        Viewer::Operator => {
            let rt = ui.runtime.as_ref().ok_or_else(|| ToolError::error("answering needs the runtime"))?;
            let answer = Answer { decision, text, by: "operator", via: AnsweredVia::Dashboard, host: None };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::caller::Caller;

    /// A look that counts its builds, over a store whose mark is `mark`.
    fn counting(mark: &Arc<std::sync::Mutex<u64>>, builds: &Arc<AtomicUsize>) -> Look {
        let (mark, builds) = (mark.clone(), builds.clone());
        Box::new(move |last| {
            let now = mark.lock().unwrap().to_string();
            if last.as_ref() == Some(&now) {
                return Some((now, None));
            }
            builds.fetch_add(1, Ordering::SeqCst);
            Some((now.clone(), Some(json!({"mark": now, "generatedAt": 1}))))
        })
    }

    /// What `streams` streams of one view send when all are woken at once.
    async fn wake_all(view: &Arc<LiveView>, streams: usize, look: impl Fn() -> Look) -> Vec<u64> {
        let woke = Instant::now();
        let all = (0..streams).map(|_| view.since(woke, look()));
        futures::future::join_all(all).await.into_iter().map(|s| s.expect("a view").version).collect()
    }

    #[tokio::test]
    async fn the_streams_of_one_view_share_one_build_per_change() {
        let (mark, builds) = (Arc::new(std::sync::Mutex::new(1)), Arc::new(AtomicUsize::new(0)));
        let views = LiveViews::default();
        let key = ViewKey { session: Some("agent:main:desk".into()), filter: None, roots: 50 };
        let streams: Vec<Arc<LiveView>> = (0..20).map(|_| views.view(key.clone())).collect();
        assert!(streams.iter().all(|v| Arc::ptr_eq(v, &streams[0])), "one view for one key");
        assert_eq!(wake_all(&streams[0], 20, || counting(&mark, &builds)).await, vec![0; 20]);
        assert_eq!(builds.load(Ordering::SeqCst), 1, "20 streams opened: one build");
        *mark.lock().unwrap() = 2;
        assert_eq!(wake_all(&streams[0], 20, || counting(&mark, &builds)).await, vec![1; 20]);
        assert_eq!(builds.load(Ordering::SeqCst), 2, "one change: one build, not 20");
        assert_eq!(wake_all(&streams[0], 20, || counting(&mark, &builds)).await, vec![1; 20]);
        assert_eq!(builds.load(Ordering::SeqCst), 2, "no change: no build");
        // Another viewer's view is its own; a key no stream shows any more is let go.
        let other = views.view(ViewKey { session: None, ..key.clone() });
        assert!(!Arc::ptr_eq(&other, &streams[0]));
        drop(streams);
        assert_eq!(views.view(key).0.lock().await.shown.as_ref().map(|s| s.version), None);
    }

    #[tokio::test]
    async fn a_change_that_leaves_the_view_as_it_was_sends_nothing_new() {
        let view = LiveView::default();
        let same = |mark: &str| -> Look {
            let mark = mark.to_string();
            Box::new(move |_| Some((mark, Some(json!({"trees": [], "generatedAt": crate::store::now_ms()})))))
        };
        let first = view.since(Instant::now(), same("1")).await.unwrap();
        let second = view.since(Instant::now(), same("2")).await.unwrap();
        assert_eq!((first.version, second.version), (0, 0));
        assert_eq!(first.data, second.data, "the first sent view is kept, generatedAt included");
    }

    #[test]
    fn a_clients_filter_makes_no_other_view_and_operators_keep_a_share_of_the_streams() {
        let req = |filter: Option<&str>| ViewRequest { filter: filter.map(String::from), roots: 50 };
        let key = SessionKey::from_canonical("agent:main:desk");
        let client = Viewer::Session(Box::new(Caller::top_level(key, crate::keys::AgentId::main(), false, true)));
        assert_eq!(ViewKey::of(&client, &req(Some("x"))), ViewKey::of(&client, &req(None)));
        assert_ne!(ViewKey::of(&Viewer::Operator, &req(Some("x"))), ViewKey::of(&Viewer::Operator, &req(None)));
        let (streams, open) = (Arc::new(AtomicUsize::new(0)), Open::new(MAX_STREAMS * 2, "test"));
        let place = || open.take(&Credential::of(&HeaderMap::new())).expect("a place");
        let clients: Vec<_> = std::iter::from_fn(|| stream_slot(&streams, false, place())).collect();
        assert_eq!(clients.len(), MAX_STREAMS - OPERATOR_STREAMS);
        let operators: Vec<_> = std::iter::from_fn(|| stream_slot(&streams, true, place())).collect();
        assert_eq!(operators.len(), OPERATOR_STREAMS);
        drop(clients);
        assert_eq!(streams.load(Ordering::SeqCst), OPERATOR_STREAMS, "closed streams give their slots back");
    }
}
