//! What rmcp's streamable-HTTP session manager does not know: who opened an MCP session, and
//! which request ids are in flight on it. A middleware in front of `/mcp`:
//!
//! - **Bound sessions.** The [`Credential`] (set by the bearer middleware; the legacy `/message`
//!   checks the same one) that opened a session with `initialize` is recorded against its
//!   `Mcp-Session-Id`. A request of any method carrying that id with another credential is handed
//!   to rmcp with an id no session has, so it gets exactly the answer an unknown session gets
//!   (404): another token holder can neither act on the session (stream its notifications,
//!   `DELETE` it, post into it) nor learn that it is live.
//! - **One request per id.** rmcp routes a response by its request id, so a second POST with an
//!   id still in flight on the same session would take the first one's place and one of them would
//!   never be answered. The duplicate is refused at once with a JSON-RPC error naming the id; the
//!   id is free again when the first request's response stream ends.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::http::{Credential, hold_until_sent};

/// rmcp's header naming the MCP session.
const SESSION_HEADER: &str = "mcp-session-id";
/// An id no session has (rmcp's are UUIDs): a foreign request is answered as for a missing session.
const NO_SUCH_SESSION: HeaderValue = HeaderValue::from_static("not-a-session");
/// Past this many bound sessions, those rmcp has forgotten (expired, closed) are dropped.
const PRUNE_ABOVE: usize = 1024;

use rmcp::transport::streamable_http_server::session::{SessionManager, local::LocalSessionManager};

#[derive(Default)]
struct Tables {
    /// Mcp-Session-Id → the credential that opened it.
    owners: HashMap<String, Credential>,
    /// (session, JSON-encoded request id) of the requests whose response has not ended.
    in_flight: HashSet<(String, String)>,
}

/// The middleware's state, shared by every request of one router: the tables, rmcp's session
/// manager (to forget sessions it closed), and the body limit.
#[derive(Clone)]
pub struct SessionGuard {
    tables: Arc<Mutex<Tables>>,
    manager: Arc<LocalSessionManager>,
    max_body_bytes: usize,
}

impl SessionGuard {
    pub fn new(manager: Arc<LocalSessionManager>, max_body_bytes: usize) -> Self {
        SessionGuard { tables: Default::default(), manager, max_body_bytes }
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().expect("session tables")
    }

    /// Drops the bindings of sessions rmcp no longer has (closed, or expired while idle).
    async fn forget_closed_sessions(&self) {
        let ids: Vec<String> = self.tables().owners.keys().cloned().collect();
        let mut closed = Vec::new();
        for id in ids {
            if !self.manager.has_session(&id.as_str().into()).await.unwrap_or(false) {
                closed.push(id);
            }
        }
        let mut tables = self.tables();
        for id in closed {
            tables.owners.remove(&id);
        }
    }
}

/// The axum middleware (see the module docs).
pub async fn guard(State(sessions): State<SessionGuard>, mut req: Request, next: Next) -> Response {
    let credential = credential_of(&req);
    let Some(session) = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(String::from) else {
        let response = next.run(req).await;
        return record_new_session(&sessions, credential, response).await;
    };
    // Every live session was opened through here, so one not bound to this credential is
    // someone else's or none at all: both get rmcp's answer for a missing session.
    let owner = sessions.tables().owners.get(&session).cloned();
    if owner.is_none_or(|o| o != credential) {
        req.headers_mut().insert(SESSION_HEADER, NO_SUCH_SESSION);
        return next.run(req).await;
    }
    let (req, slot) = match req.method() {
        &Method::POST => match claim_request_id(&sessions, &session, req).await {
            Ok(claimed) => claimed,
            Err(refusal) => return refusal,
        },
        _ => (req, None),
    };
    let deleting = req.method() == Method::DELETE;
    let response = next.run(req).await;
    if response.status() == StatusCode::NOT_FOUND || (deleting && response.status().is_success()) {
        sessions.tables().owners.remove(&session);
    }
    match slot {
        // The id stays claimed until its answer (JSON or an SSE stream) has been sent.
        Some(slot) => hold_until_sent(response, slot),
        None => response,
    }
}

/// An `initialize` answered with a new session id: bind it to the credential that opened it.
async fn record_new_session(sessions: &SessionGuard, credential: Credential, response: Response) -> Response {
    let Some(id) = response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()) else { return response };
    let bound = {
        let mut tables = sessions.tables();
        tables.owners.insert(id.to_string(), credential);
        tables.owners.len()
    };
    if bound > PRUNE_ABOVE {
        sessions.forget_closed_sessions().await;
    }
    response
}

/// The id of a JSON-RPC request (a response or notification has none that can collide).
#[derive(Deserialize)]
struct Envelope {
    id: Option<Value>,
    method: Option<serde::de::IgnoredAny>,
}

/// A request id held while its response is being sent.
struct Slot {
    sessions: SessionGuard,
    key: (String, String),
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.sessions.tables().in_flight.remove(&self.key);
    }
}

/// Reads the body (bounded like rmcp does), and claims its request id on this session; a
/// duplicate is refused with a JSON-RPC error for that id.
async fn claim_request_id(
    sessions: &SessionGuard,
    session: &str,
    req: Request,
) -> Result<(Request, Option<Slot>), Response> {
    let (parts, body) = req.into_parts();
    let bytes = super::http::bounded_body(body, sessions.max_body_bytes).await?;
    let id = match serde_json::from_slice::<Envelope>(&bytes) {
        Ok(Envelope { id: Some(id), method: Some(_) }) if !id.is_null() => Some(id),
        _ => None,
    };
    let slot = match id {
        Some(id) => {
            let key = (session.to_string(), id.to_string());
            if !sessions.tables().in_flight.insert(key.clone()) {
                return Err(duplicate_id(&id));
            }
            Some(Slot { sessions: sessions.clone(), key })
        }
        None => None,
    };
    Ok((Request::from_parts(parts, Body::from(bytes)), slot))
}

fn duplicate_id(id: &Value) -> Response {
    let message =
        format!("request id {id} is already in flight on this MCP session; wait for its answer or use a new id");
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": message}});
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// The request's credential, set by the bearer middleware that runs before this one.
pub fn credential_of(req: &Request) -> Credential {
    req.extensions().get::<Credential>().cloned().expect("the bearer middleware sets the credential")
}
