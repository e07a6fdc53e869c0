//! The A2A JSON-RPC binding: `POST /a2a/<agentId>` with one `JsonRpcRequest`; the streaming
//! methods answer with Server-Sent Events, each one a `JsonRpcResponse` carrying a
//! `StreamResponse`. Errors are JSON-RPC errors (HTTP 200) with the A2A `ErrorInfo` details.
//! The v0.3 method names are served too, answering in v0.3's shapes ([`v03`]).

use a2a_protocol_types::error::{A2aError, ErrorCode};
use a2a_protocol_types::jsonrpc::{
    JsonRpcError, JsonRpcErrorResponse, JsonRpcId, JsonRpcRequest, JsonRpcResponse, JsonRpcSuccessResponse,
};
use a2a_protocol_types::method::Method;
use a2a_protocol_types::params::{CancelTaskParams, MessageSendParams, TaskIdParams, TaskQueryParams};
use a2a_protocol_types::responses::SendMessageResponse;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::tasks::task_of;
use super::{A2a, caller_of, exposed, not_served, v03};
use crate::access::caller::Caller;
use crate::keys::AgentId;

pub(super) async fn handle(
    State(a): State<A2a>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let Some(agent) = exposed(&a, &agent) else { return not_served() };
    let caller = match caller_of(&a, &headers).await {
        Ok(c) => c,
        Err(refused) => return refused,
    };
    let body = match crate::server::http::bounded_body(body, a.max_body_bytes).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let mut request: JsonRpcRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return failure(None, &A2aError::parse_error(format!("the body is not a JSON-RPC request: {e}"))),
    };
    let id = request.id.to_response_id();
    let legacy = v03::v1_method(&request.method);
    if let Some(v1) = legacy {
        request.method = v1.to_string();
        if let Err(e) = v03::blocking_as_v1(&mut request.params) {
            return failure(id, &e);
        }
    }
    match dispatch(&a, caller, agent, request).await {
        Ok(Answer::One(result)) if legacy.is_some() => success(id, v03::result(result)),
        Ok(Answer::One(result)) => success(id, result),
        Ok(Answer::Stream(watched)) => stream(id, a, *watched, legacy.is_some()),
        Err(e) => failure(id, &e),
    }
}

/// What a method answers: one result, or a stream of a task's events.
enum Answer {
    One(serde_json::Value),
    Stream(Box<Watched>),
}

/// A stream to open: the caller, the agent and the task it follows.
struct Watched {
    caller: Caller,
    agent: AgentId,
    view: crate::engine::a2a::TaskView,
}

fn params<T: DeserializeOwned>(raw: Option<serde_json::Value>) -> Result<T, A2aError> {
    let raw = raw.ok_or_else(|| A2aError::invalid_params("params are required"))?;
    serde_path_to_error::deserialize(raw)
        .map_err(|e| A2aError::invalid_params(format!("params.{}: {}", e.path(), e.inner())))
}

fn json<T: Serialize>(value: &T) -> Result<serde_json::Value, A2aError> {
    serde_json::to_value(value).map_err(|e| A2aError::internal(e.to_string()))
}

async fn dispatch(a: &A2a, caller: Caller, agent: AgentId, request: JsonRpcRequest) -> Result<Answer, A2aError> {
    let method = Method::from_wire_name(&request.method).ok_or_else(|| {
        A2aError::new(ErrorCode::MethodNotFound, format!("{:?} is not an A2A v1.0 method", request.method))
    })?;
    match method {
        Method::SendMessage => {
            let p: MessageSendParams = params(request.params)?;
            let view = a.send(&caller, &agent, &p)?;
            let immediately = p.configuration.as_ref().and_then(|c| c.return_immediately).unwrap_or(false);
            let view = if immediately { view } else { a.settled(&caller, &agent, view).await? };
            Ok(Answer::One(json(&SendMessageResponse::Task(task_of(&view)))?))
        }
        Method::SendStreamingMessage => {
            let p: MessageSendParams = params(request.params)?;
            let view = a.send(&caller, &agent, &p)?;
            Ok(Answer::Stream(Box::new(Watched { caller, agent, view })))
        }
        Method::GetTask => {
            let p: TaskQueryParams = params(request.params)?;
            Ok(Answer::One(json(&task_of(&a.view(&caller, &agent, &p.id)?))?))
        }
        Method::CancelTask => {
            let p: CancelTaskParams = params(request.params)?;
            Ok(Answer::One(json(&task_of(&a.cancel(&caller, &agent, &p.id).await?))?))
        }
        Method::SubscribeToTask => {
            let p: TaskIdParams = params(request.params)?;
            let view = a.subscribable(&caller, &agent, &p.id)?;
            Ok(Answer::Stream(Box::new(Watched { caller, agent, view })))
        }
        other => Err(super::tasks::not_offered(other)),
    }
}

fn success(id: JsonRpcId, result: serde_json::Value) -> Response {
    axum::Json(JsonRpcResponse::Success(JsonRpcSuccessResponse::new(id, result))).into_response()
}

fn error_body(id: JsonRpcId, e: &A2aError) -> JsonRpcResponse<serde_json::Value> {
    let details = e.error_info_data(None);
    let error = match details {
        serde_json::Value::Null => JsonRpcError::new(e.code.as_i32(), e.message.clone()),
        d => JsonRpcError::with_data(e.code.as_i32(), e.message.clone(), d),
    };
    JsonRpcResponse::Error(JsonRpcErrorResponse::new(id, error))
}

pub(super) fn failure(id: JsonRpcId, e: &A2aError) -> Response {
    axum::Json(error_body(id, e)).into_response()
}

/// The task's events as SSE; in v0.3's shapes for a v0.3 method, ending where v0.3 ends a stream.
fn stream(id: JsonRpcId, a: A2a, w: Watched, legacy: bool) -> Response {
    let events = a.watch(w.caller, w.agent, w.view).map(move |item| {
        let event = item.and_then(|e| serde_json::to_value(&e).map_err(|e| A2aError::internal(e.to_string())));
        match event.map(|v| if legacy { v03::result(v) } else { v }) {
            Ok(v) => {
                (legacy && v03::ends_stream(&v), JsonRpcResponse::Success(JsonRpcSuccessResponse::new(id.clone(), v)))
            }
            Err(e) => (false, error_body(id.clone(), &e)),
        }
    });
    // Ends right after the last event, without waiting for the task's next one.
    let events = futures::stream::unfold((Box::pin(events), false), |(mut events, ended)| async move {
        let (last, body) = if ended { None } else { events.next().await }?;
        Some((Event::default().json_data(body), (events, last)))
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_a2a_error_is_a_json_rpc_error_with_its_code_and_error_info() {
        let body = serde_json::to_value(error_body(Some(7.into()), &A2aError::task_not_found("r1"))).unwrap();
        assert_eq!(body["id"], 7);
        assert_eq!(body["error"]["code"], -32001, "{body}");
        assert_eq!(body["error"]["data"][0]["reason"], "TASK_NOT_FOUND", "{body}");
        let parse = serde_json::to_value(error_body(None, &A2aError::parse_error("bad"))).unwrap();
        assert_eq!((&parse["id"], &parse["error"]["code"]), (&serde_json::Value::Null, &json!(-32700)), "{parse}");
    }
}
