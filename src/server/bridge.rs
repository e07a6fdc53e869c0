//! The inbound side of channels (docs/CHANNELS.md, Channel bridges): `POST /channels/<name>/messages`, where
//! a channel's bridge (a bot process the operator runs) posts its users' messages. The bridge's
//! bearer token is bound to its channel in config (`channels.<name>.bridge.tokens`); the message
//! goes into the session its chat names (`agent:<id>:<name>:group:<id>[:thread:<id>]`), runs
//! there, and the reply goes back out through the channel's deliverer. What a bridge says — the
//! text, the sender, the thread — is data: it is recorded as the message's provenance and decides
//! no permission; the token alone decides which channel's sessions it may reach. A message
//! `allow <code>` / `deny <code> [why]` answers an approval posted to that chat instead
//! ([`crate::engine::ask_chat`]).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::access::{Access, ErrorStatus};
use crate::config::Config;
use crate::engine::Engine;
use crate::engine::ask_chat::{ChatAnswer, ChatAnswered};
use crate::engine::chain::ChannelUser;
use crate::engine::inject::{InjectError, Injected};
use crate::engine::scheduler::Scheduler;
use crate::keys::{AgentId, SessionKey};

/// The path bridges post to.
pub const PATH: &str = "/channels/{channel}/messages";
/// Longest message text, in bytes (the same as a spawn's task).
const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Longest id a bridge may give (sender, chat, thread, message, account).
const MAX_ID_BYTES: usize = 256;

#[derive(Clone)]
struct Bridges {
    access: Access,
    runtime: Option<Arc<Scheduler>>,
}

/// The bridge endpoint, authenticated by bridge tokens only (never by the MCP bearer tokens).
pub fn router(access: Access, runtime: Option<Arc<Scheduler>>) -> axum::Router {
    axum::Router::new().route(PATH, axum::routing::post(post_message)).with_state(Bridges { access, runtime })
}

fn refuse(status: StatusCode, error: String) -> Response {
    (status, axum::Json(json!({"error": error}))).into_response()
}

/// The channel whose bridge holds this bearer token, if any.
fn channel_of_token(config: &Config, headers: &HeaderMap) -> Option<String> {
    config.channels.iter().find_map(|(name, ch)| {
        let bridge = ch.bridge.as_ref()?;
        super::http::bears_one_of(headers, &bridge.tokens).then(|| name.clone())
    })
}

async fn post_message(
    State(b): State<Bridges>,
    Path(channel): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let config = b.access.config().clone();
    let Some(own) = channel_of_token(&config, &headers) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "a bridge token is required: Authorization: Bearer <token>, whose sha256 is in channels.<name>.bridge.tokens"
                .into(),
        );
    };
    if own != channel {
        return refuse(
            StatusCode::FORBIDDEN,
            format!("this token is the bridge token of channel {own:?}; it cannot post to channel {channel:?}"),
        );
    }
    let post = match parse(&config, &channel, &body) {
        Ok(p) => p,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    if let Err(e) = reachable(&config, &channel, &post.key) {
        return refuse(StatusCode::FORBIDDEN, e);
    }
    let engine = Engine::new(&b.access, b.runtime.as_ref());
    if let Some(answer) = crate::engine::ask_chat::parse_answer(&post.text) {
        return answer_ask(&engine, &post, &answer);
    }
    let (key, origin) = match engine.route_bridged(&post.key, post.user, post.account_id) {
        Ok(routed) => routed,
        Err(e) => {
            let status = match e.status {
                ErrorStatus::Forbidden => StatusCode::FORBIDDEN,
                ErrorStatus::Invalid | ErrorStatus::NotFound => StatusCode::UNPROCESSABLE_ENTITY,
                ErrorStatus::Error => StatusCode::SERVICE_UNAVAILABLE,
            };
            return refuse(status, e.message);
        }
    };
    match engine.inject(&key, &post.text, &origin) {
        Ok(Injected::Queued(run_id)) => accepted("accepted", &key, Some(run_id)),
        Ok(Injected::Appended) => accepted("appended", &key, None),
        Ok(Injected::Duplicate(run_id)) => accepted("duplicate", &key, run_id),
        Err(InjectError::QueueFull { message, limit, max }) => {
            let body = json!({"error": message, "limit": limit, "max": max});
            (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response()
        }
        Err(InjectError::Policy(m)) => refuse(StatusCode::FORBIDDEN, m),
        Err(InjectError::NoRunner(m)) => refuse(StatusCode::UNPROCESSABLE_ENTITY, m),
        Err(InjectError::Store(m)) => refuse(StatusCode::SERVICE_UNAVAILABLE, m),
    }
}

/// A person's answer to an approval posted to this chat: `200 {"status": "answered" |
/// "duplicate", requestId, decision}`, `409` when it was closed before (and by whom), `404` when
/// no approval with that code was posted to this chat.
fn answer_ask(engine: &Engine, post: &Post, answer: &ChatAnswer) -> Response {
    let answered = |status: &str, ask: &crate::store::AskRow| {
        let decision = ask.decision.map(crate::store::AskDecision::as_str);
        let body = json!({"status": status, "requestId": ask.id, "decision": decision});
        (StatusCode::OK, axum::Json(body)).into_response()
    };
    match engine.answer_in_chat(&post.key, &post.user, answer) {
        Ok(ChatAnswered::Answered(ask)) => answered("answered", &ask),
        Ok(ChatAnswered::Duplicate(ask)) => answered("duplicate", &ask),
        Ok(ChatAnswered::Closed(how)) => refuse(StatusCode::CONFLICT, format!("request {} {how}", answer.code)),
        Err(e) => {
            let status = match e.status {
                ErrorStatus::NotFound => StatusCode::NOT_FOUND,
                ErrorStatus::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
                ErrorStatus::Forbidden => StatusCode::FORBIDDEN,
                ErrorStatus::Error => StatusCode::SERVICE_UNAVAILABLE,
            };
            refuse(status, e.message)
        }
    }
}

fn accepted(status: &str, key: &SessionKey, run_id: Option<String>) -> Response {
    (StatusCode::ACCEPTED, axum::Json(json!({"status": status, "sessionKey": key.as_str(), "runId": run_id})))
        .into_response()
}

/// A bridge's post, checked field by field.
#[derive(Debug)]
struct Post {
    key: SessionKey,
    user: ChannelUser,
    account_id: Option<String>,
    text: String,
}

const FIELDS: [&str; 8] = ["chat", "threadId", "sessionKey", "agentId", "sender", "text", "messageId", "accountId"];

fn parse(config: &Config, channel: &str, body: &[u8]) -> Result<Post, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let Value::Object(fields) = value else { return Err("the body must be a JSON object".into()) };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!("{unknown} is not a field of a bridge message; allowed: {}", FIELDS.join(", ")));
    }
    let text = string(&fields, "text", MAX_TEXT_BYTES)?.ok_or("text is required")?;
    let sender = fields.get("sender").and_then(Value::as_object).ok_or("sender is required: {id, name?}")?;
    let sender_id =
        string(sender, "id", MAX_ID_BYTES).map_err(|e| format!("sender.{e}"))?.ok_or("sender.id is required")?;
    let sender_name = string(sender, "name", MAX_ID_BYTES).map_err(|e| format!("sender.{e}"))?;
    let thread_id = string(&fields, "threadId", MAX_ID_BYTES)?;
    let key = target(config, channel, &fields, thread_id.as_deref())?;
    let user = ChannelUser {
        channel: channel.to_string(),
        sender_id,
        sender_name,
        thread_id,
        message_id: string(&fields, "messageId", MAX_ID_BYTES)?,
    };
    Ok(Post { key, user, account_id: string(&fields, "accountId", MAX_ID_BYTES)?, text })
}

/// The session a post names: `sessionKey`, or the key its `chat` (and thread) make.
fn target(config: &Config, channel: &str, f: &Map<String, Value>, thread: Option<&str>) -> Result<SessionKey, String> {
    let raw = match (string(f, "sessionKey", 600)?, f.get("chat")) {
        (Some(_), Some(_)) => return Err("give chat or sessionKey, not both".into()),
        (Some(key), None) => key,
        (None, Some(chat)) => {
            let chat = chat.as_object().ok_or("chat must be {type: group|channel|direct, id}")?;
            let kind = string(chat, "type", 16).map_err(|e| format!("chat.{e}"))?.unwrap_or_default();
            if !matches!(kind.as_str(), "group" | "channel" | "direct") {
                return Err(format!("chat.type must be group, channel or direct, got {kind:?}"));
            }
            let id = string(chat, "id", MAX_ID_BYTES).map_err(|e| format!("chat.{e}"))?.ok_or("chat.id is required")?;
            let agent = match string(f, "agentId", 128)? {
                Some(a) => a,
                None => config.bridge_agents(channel).0.to_string(),
            };
            AgentId::parse(&agent).map_err(|e| format!("agentId: {e}"))?;
            let thread = thread.map(|t| format!(":thread:{t}")).unwrap_or_default();
            format!("agent:{agent}:{channel}:{kind}:{id}{thread}")
        }
        (None, None) => return Err("chat is required: {type: group|channel|direct, id} (or a sessionKey)".into()),
    };
    let scope = crate::config::key_scope(config, &config.default_agent());
    match crate::keys::parse_ref(&raw, &scope) {
        Ok(crate::keys::SessionRef::Key(key)) => Ok(key),
        Ok(_) => Err(format!("{raw:?} is not a session key")),
        Err(e) => Err(format!("the session key {raw:?} {e}")),
    }
}

/// Whether the session a post names belongs to an agent its channel's bridge reaches
/// (`channels.<name>.bridge.allowAgents`): checked before anything is created, so an invented id
/// makes no session, workspace or run.
fn reachable(config: &Config, channel: &str, key: &SessionKey) -> Result<(), String> {
    let (default, allowed) = config.bridge_agents(channel);
    let agent = key.agent_id(&default);
    if allowed.contains(&agent) {
        return Ok(());
    }
    let names = allowed.iter().map(AgentId::as_str).collect::<Vec<_>>().join(", ");
    Err(format!(
        "the post names agent {:?} (by agentId or sessionKey), which channel {channel:?} is not configured for: \
         its bridge reaches only {names} (channels.{channel}.bridge.allowAgents)",
        agent.as_str()
    ))
}

/// An optional string field of at most `max` bytes, without control characters.
fn string(f: &Map<String, Value>, name: &str, max: usize) -> Result<Option<String>, String> {
    match f.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Err(format!("{name} must not be empty")),
        Some(Value::String(s)) if s.len() > max => Err(format!("{name} is longer than {max} bytes")),
        Some(Value::String(s)) if name != "text" && s.chars().any(char::is_control) => {
            Err(format!("{name} must not contain control characters"))
        }
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{name} must be a string, got {other}")),
    }
}
