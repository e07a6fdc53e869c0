//! The legacy HTTP+SSE transport (MCP 2024-11-05: `GET /sse` + `POST /message?sessionId=`) for
//! older clients. rmcp dropped it, so this adapter feeds an rmcp service through a channel pair.
//! It is authenticated like `/mcp` (the bearer middleware runs first), checks Host and Origin
//! like `/mcp`, and a `/message` POST must carry the same bearer as the `/sse` GET that opened
//! its session (else the answer for an unknown session, 404).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt, channel::mpsc};
use rmcp::ServiceExt;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use tokio::sync::RwLock;
use tokio_util::sync::CancellationToken;

use super::SessionsServer;
use super::http::Credential;
use super::http::HttpOptions;
use super::subscriptions::Hub;
use crate::access::Access;
use crate::access::caller::Caller;
use crate::engine::scheduler::Scheduler;

/// Open SSE sessions at most (each holds a stream and a service).
const MAX_SESSIONS: usize = 256;

struct Session {
    to_server: mpsc::Sender<ClientJsonRpcMessage>,
    opened_by: Credential,
}

#[derive(Clone)]
struct SseState {
    sessions: Arc<RwLock<HashMap<String, Session>>>,
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    options: HttpOptions,
    cancel: CancellationToken,
    hub: Hub,
}

pub fn router(
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    options: HttpOptions,
    cancel: CancellationToken,
    hub: Hub,
) -> axum::Router {
    // One body limit for both transports: what `/mcp` accepts, `/message` accepts.
    let body_limit = axum::extract::DefaultBodyLimit::max(options.max_body_bytes);
    let state = SseState { sessions: Default::default(), access, runtime, options, cancel, hub };
    axum::Router::new()
        .route("/sse", axum::routing::get(open_stream))
        .route("/message", axum::routing::post(post_message))
        .layer(body_limit)
        .with_state(state)
}

async fn open_stream(
    State(st): State<SseState>,
    Extension(caller): Extension<Caller>,
    Extension(credential): Extension<Credential>,
    headers: HeaderMap,
) -> Response {
    if !super::http::host_and_origin_ok(&st.options, &headers) {
        return (StatusCode::FORBIDDEN, "Host or Origin not allowed").into_response();
    }
    if st.sessions.read().await.len() >= MAX_SESSIONS {
        return (StatusCode::SERVICE_UNAVAILABLE, "too many SSE sessions").into_response();
    }
    let id = uuid::Uuid::new_v4().to_string();
    let (to_server, from_client) = mpsc::channel::<ClientJsonRpcMessage>(64);
    let (to_client, from_server) = mpsc::channel::<ServerJsonRpcMessage>(64);
    st.sessions.write().await.insert(id.clone(), Session { to_server, opened_by: credential });
    // Dropping the SSE body (the client went away) ends the service.
    let closed = CancellationToken::new();
    let guard = closed.clone().drop_guard();
    let server = SessionsServer::on_hub(st.access.clone(), caller, st.runtime.clone(), st.hub.clone());
    let (sessions, sid, shutdown) = (st.sessions.clone(), id.clone(), st.cancel.clone());
    tokio::spawn(async move {
        if let Ok(running) = server.serve((to_client, from_client)).await {
            let stop = running.cancellation_token();
            tokio::spawn(async move {
                tokio::select! {
                    _ = closed.cancelled() => {}
                    _ = shutdown.cancelled() => {}
                }
                stop.cancel();
            });
            let _ = running.waiting().await;
        }
        sessions.write().await.remove(&sid);
    });
    let endpoint = Event::default().event("endpoint").data(format!("/message?sessionId={id}"));
    let messages = from_server.map(move |msg| {
        let _keep = &guard;
        Ok::<_, Infallible>(Event::default().event("message").data(serde_json::to_string(&msg).unwrap_or_default()))
    });
    Sse::new(futures::stream::once(async { Ok(endpoint) }).chain(messages))
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[derive(serde::Deserialize)]
struct SessionQuery {
    #[serde(rename = "sessionId")]
    session_id: String,
}

async fn post_message(
    State(st): State<SseState>,
    Query(q): Query<SessionQuery>,
    Extension(credential): Extension<Credential>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    if !super::http::host_and_origin_ok(&st.options, &headers) {
        return (StatusCode::FORBIDDEN, "Host or Origin not allowed");
    }
    // Another token's session is answered like a missing one: it must not learn the id is live.
    let tx = {
        let sessions = st.sessions.read().await;
        sessions.get(&q.session_id).filter(|s| s.opened_by == credential).map(|s| s.to_server.clone())
    };
    let Some(mut tx) = tx else { return (StatusCode::NOT_FOUND, "unknown sessionId") };
    let Ok(msg) = serde_json::from_slice::<ClientJsonRpcMessage>(&body) else {
        return (StatusCode::BAD_REQUEST, "body is not a JSON-RPC message");
    };
    match tx.send(msg).await {
        Ok(()) => (StatusCode::ACCEPTED, "Accepted"),
        Err(_) => (StatusCode::GONE, "session closed"),
    }
}
