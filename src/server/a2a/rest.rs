//! The A2A HTTP+JSON binding under `/a2a/<agentId>`: `POST message:send`, `POST message:stream`
//! (SSE of `StreamResponse`s), `GET tasks/<id>`, `POST tasks/<id>:cancel`, `POST` (or `GET`)
//! `tasks/<id>:subscribe`. Errors are `google.rpc.Status` bodies with the A2A `ErrorInfo`, at
//! the status A2A gives each error code.

use a2a_protocol_types::error::{A2aError, ErrorCode};
use a2a_protocol_types::params::MessageSendParams;
use a2a_protocol_types::responses::SendMessageResponse;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::tasks::task_of;
use super::{A2a, caller_of, exposed, not_served};
use crate::access::caller::Caller;
use crate::keys::AgentId;

/// `POST /a2a/<agent>/message:send` and `message:stream`.
pub(super) async fn message(
    State(a): State<A2a>,
    Path((agent, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let (agent, caller) = match signed_in(&a, &agent, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let body = match crate::server::http::bounded_body(body, a.max_body_bytes).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let streaming = match action.as_str() {
        "message:send" => false,
        "message:stream" => true,
        _ => return failure(&A2aError::new(ErrorCode::MethodNotFound, format!("no A2A operation {action:?}"))),
    };
    let p: MessageSendParams = match serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&body))
    {
        Ok(p) => p,
        Err(e) => return failure(&A2aError::invalid_params(format!("body.{}: {}", e.path(), e.inner()))),
    };
    let view = match a.send(&caller, &agent, &p) {
        Ok(v) => v,
        Err(e) => return failure(&e),
    };
    if streaming {
        return stream(a, caller, agent, view);
    }
    let immediately = p.configuration.as_ref().and_then(|c| c.return_immediately).unwrap_or(false);
    let view = if immediately { Ok(view) } else { a.settled(&caller, &agent, view).await };
    match view {
        Ok(v) => axum::Json(SendMessageResponse::Task(task_of(&v))).into_response(),
        Err(e) => failure(&e),
    }
}

/// `GET /a2a/<agent>/tasks/<id>` (and `<id>:subscribe`).
pub(super) async fn task_get(
    State(a): State<A2a>,
    Path((agent, task)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if task.ends_with(":subscribe") {
        return task_action(State(a), Path((agent, task)), headers).await;
    }
    let (agent, caller) = match signed_in(&a, &agent, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match a.view(&caller, &agent, &task) {
        Ok(v) => axum::Json(task_of(&v)).into_response(),
        Err(e) => failure(&e),
    }
}

/// `POST /a2a/<agent>/tasks/<id>:cancel` and `<id>:subscribe`.
pub(super) async fn task_action(
    State(a): State<A2a>,
    Path((agent, task)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let (agent, caller) = match signed_in(&a, &agent, &headers).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match task.rsplit_once(':') {
        Some((id, "cancel")) => match a.cancel(&caller, &agent, id).await {
            Ok(v) => axum::Json(task_of(&v)).into_response(),
            Err(e) => failure(&e),
        },
        Some((id, "subscribe")) => match a.subscribable(&caller, &agent, id) {
            Ok(v) => stream(a, caller, agent, v),
            Err(e) => failure(&e),
        },
        _ => failure(&A2aError::new(ErrorCode::MethodNotFound, "POST tasks/<id>:cancel or tasks/<id>:subscribe")),
    }
}

async fn signed_in(a: &A2a, agent: &str, headers: &HeaderMap) -> Result<(AgentId, Caller), Response> {
    let agent = exposed(a, agent).ok_or_else(not_served)?;
    Ok((agent, caller_of(a, headers).await?))
}

/// The error as a `google.rpc.Status` body.
fn status_body(e: &A2aError) -> serde_json::Value {
    serde_json::json!({"error": {
        "code": e.code.http_status(), "status": e.code.grpc_status(), "message": e.message,
        "details": e.error_info_data(None),
    }})
}

/// The error's body at its HTTP status: 403 for a refusal of a signed-in caller, 429 (with
/// `Retry-After`) for a peer whose queue is full, else the status A2A gives its code.
fn failure(e: &A2aError) -> Response {
    if let Some(after) = e.retry_after() {
        let headers = [(axum::http::header::RETRY_AFTER, after.as_secs().to_string())];
        return (StatusCode::TOO_MANY_REQUESTS, headers, axum::Json(status_body(e))).into_response();
    }
    let status = match e.auth_rejection() {
        Some(_) => StatusCode::FORBIDDEN,
        None => StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    };
    (status, axum::Json(status_body(e))).into_response()
}

fn stream(a: A2a, caller: Caller, agent: AgentId, view: crate::engine::a2a::TaskView) -> Response {
    let events = a.watch(caller, agent, view).map(|item| match item {
        Ok(event) => Event::default().json_data(event),
        Err(e) => Event::default().json_data(status_body(&e)),
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}
