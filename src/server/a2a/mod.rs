//! Our agents as A2A agents (docs/A2A.md): for each agent `server.a2a.agents` names, an agent card
//! at `/a2a/<agentId>/.well-known/agent-card.json` and the A2A v1.0 JSON-RPC (`POST
//! /a2a/<agentId>`) and HTTP+JSON (`/a2a/<agentId>/message:send`, `/tasks/<id>`, …) bindings.
//! Every wire type is `a2a_protocol_types`'; the tasks are our runs ([`tasks`]). Callers sign in
//! with the client bearer tokens of `/mcp` (docs/TOKENS.md): each is an external caller, whose
//! tasks only it sees. v0.3 clients are served on the JSON-RPC binding too ([`v03`]).

mod jsonrpc;
mod rest;
mod tasks;
mod v03;

use std::sync::Arc;

use a2a_protocol_types::agent_card::{AgentCapabilities, AgentCard, AgentInterface, AgentSkill};
use a2a_protocol_types::security::{HttpAuthSecurityScheme, SecurityRequirement, SecurityScheme, StringList};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::http::{Credential, Open};
use crate::access::Access;
use crate::access::caller::Caller;
use crate::engine::scheduler::Scheduler;
use crate::keys::AgentId;

/// The name of the bearer scheme in the cards.
const SCHEME: &str = "bearer";

#[derive(Clone)]
struct A2a {
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    /// The largest request body read, as on `/mcp` (413 above it).
    max_body_bytes: usize,
}

/// The A2A routes; an empty router when no agent is exposed. Each request and stream holds one of
/// its bearer token's places (`server.maxStreamsPerCredential`, shared with `/mcp` and the
/// dashboard on this listener). Request bodies are bounded by `max_body_bytes`, as `/mcp`'s are.
pub(super) fn router(
    access: Access,
    runtime: Option<Arc<Scheduler>>,
    open: Open<Credential>,
    max_body_bytes: usize,
) -> axum::Router {
    if access.config().server.a2a.agents.is_empty() {
        return axum::Router::new();
    }
    use axum::routing::{get, post};
    let state = A2a { access, runtime, max_body_bytes };
    let card = axum::Router::new().route("/a2a/{agent}/.well-known/agent-card.json", get(card));
    let bindings = axum::Router::new()
        .route("/a2a/{agent}", post(jsonrpc::handle))
        .route("/a2a/{agent}/{action}", post(rest::message))
        .route("/a2a/{agent}/tasks/{task}", get(rest::task_get).post(rest::task_action))
        .layer(axum::middleware::from_fn_with_state(open, super::http::within_cap_of_bearer));
    card.merge(bindings).with_state(state)
}

/// The banner line `serve` prints when agents are exposed.
pub fn banner(config: &crate::config::Config) -> Option<String> {
    let agents = &config.server.a2a.agents;
    (!agents.is_empty()).then(|| {
        format!(
            "A2A: agents {} at /a2a/<agentId> (cards at /a2a/<agentId>/.well-known/agent-card.json)",
            agents.join(", ")
        )
    })
}

/// The exposed agent a path names; None for any other (answered as a plain 404).
fn exposed(a: &A2a, raw: &str) -> Option<AgentId> {
    AgentId::parse(raw).ok().filter(|id| a.access.config().server.a2a.exposes(id))
}

fn not_served() -> Response {
    (StatusCode::NOT_FOUND, axum::Json(serde_json::json!({"error": "no agent is served over A2A here"})))
        .into_response()
}

/// The bearer token's caller: an external caller by a client token; anything else is refused
/// with 401 and the card's scheme.
async fn caller_of(a: &A2a, headers: &HeaderMap) -> Result<Caller, Response> {
    let Some(token) = crate::server::http::bearer_token(headers).map(String::from) else {
        return Err(unauthorized("missing bearer token"));
    };
    let access = a.access.clone();
    match tokio::task::spawn_blocking(move || access.caller_by_token(&token)).await {
        Ok(Ok(Some(caller))) if caller.run.is_none() && caller.external && !caller.read_only => Ok(caller),
        // A client token acting as one of our driven sessions may only read (docs/TOKENS.md).
        Ok(Ok(Some(caller))) if caller.run.is_none() => Err(forbidden(&format!(
            "this client token acts as {}, a session one of our agents drives: it may only read; an A2A peer needs a token of its own session",
            caller.key
        ))),
        _ => Err(unauthorized("token not recognised: an A2A caller signs in with a client token (docs/TOKENS.md)")),
    }
}

fn forbidden(why: &str) -> Response {
    let body = serde_json::json!({"error": {"code": 403, "status": "PERMISSION_DENIED", "message": why}});
    (StatusCode::FORBIDDEN, axum::Json(body)).into_response()
}

fn unauthorized(why: &str) -> Response {
    let body = serde_json::json!({"error": {"code": 401, "status": "UNAUTHENTICATED", "message": why}});
    (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer realm=\"sessions-mcp\"")], axum::Json(body))
        .into_response()
}

/// `GET /a2a/<agent>/.well-known/agent-card.json`: public, as A2A discovery expects.
async fn card(State(a): State<A2a>, Path(agent): Path<String>, headers: HeaderMap) -> Response {
    let Some(agent) = exposed(&a, &agent) else { return not_served() };
    let config = a.access.config();
    let base = match &config.server.a2a.public_url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
            let scheme = if config.server.tls.is_some() { "https" } else { "http" };
            format!("{scheme}://{host}")
        }
    };
    let url = format!("{base}/a2a/{agent}");
    match serde_json::to_value(agent_card(config, &agent, &url)) {
        Ok(card) => axum::Json(v03::with_v03_card_fields(card, &url)).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The card of `agent` served at `url`: its description makes its one skill.
fn agent_card(config: &crate::config::Config, agent: &AgentId, url: &str) -> AgentCard {
    let description = config
        .agent(agent)
        .and_then(|e| e.description.clone())
        .unwrap_or_else(|| format!("The sessions-mcp agent {agent}: give it a task in words."));
    let skill = AgentSkill::new(agent.as_str(), agent.as_str(), description.clone()).with_tags(["sessions-mcp"]);
    let bearer = HttpAuthSecurityScheme {
        description: Some("a sessions-mcp client token (sessions-mcp token create --client KEY)".into()),
        scheme: "Bearer".into(),
        bearer_format: None,
    };
    let requirement = SecurityRequirement { schemes: [(SCHEME.to_string(), StringList { list: Vec::new() })].into() };
    AgentCard::new(agent.as_str(), env!("CARGO_PKG_VERSION"), AgentInterface::jsonrpc(url))
        .with_interface(AgentInterface::rest(url))
        .with_description(description)
        .with_skill(skill)
        .with_capabilities(AgentCapabilities::none().with_streaming(true).with_push_notifications(false))
        .with_security_schemes([(SCHEME.to_string(), SecurityScheme::Http(bearer))].into())
        .with_security_requirements(vec![requirement])
}
