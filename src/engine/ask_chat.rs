//! Approvals posted to a chat (docs/APPROVALS.md, "A chat's people"): when a sub-agent's tree is
//! bound to a channel — the child or an ancestor is bound to a thread, or the tree's root is a
//! session of that channel — and the channel is two-way (a deliverer and a bridge), its approvals
//! are posted to that chat through the deliverer (a delivery of kind `ask`, one per ask) and the
//! chat's people are a route to a person. A person answers with a message `allow <code>` or
//! `deny <code> [why]` (the code: the first 8 characters of the request id, or more of it), which
//! the bridge posts like any message; the first answer wins and records the person and the
//! channel. From a chat, only the asks posted to that chat are seen: any other code is unknown
//! there, whether or not it names an ask elsewhere.

use serde_json::{Value, json};

use super::ask::{close, closed_how};
use super::chain::ChannelUser;
use super::deliver::address;
use super::scheduler::Scheduler;
use crate::access::ToolError;
use crate::config::Config;
use crate::keys::SessionKey;
use crate::store::{
    Answer, AnsweredVia, AskDecision, AskRow, AskState, DeliveryKind, NewAsk, RunRow, SessionRow, StoreError, Tx,
    now_ms,
};

/// How many characters of a request id the chat is shown (and must give at least).
pub const CODE_LEN: usize = 8;

/// The chat an approval is posted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chat {
    pub channel: String,
    /// The chat's address on the channel (`channel:<id>`, `user:<id>`), as deliveries use it.
    pub to: String,
    pub thread_id: Option<String>,
    pub account_id: Option<String>,
}

/// The chat `child`'s tree is bound to, if its channel is two-way: the thread of the nearest
/// thread-bound session from the child up, else the root's own chat.
pub(super) fn chat_of(rt: &Scheduler, child: &SessionRow) -> Result<Option<Chat>, StoreError> {
    let mut row = child.clone();
    loop {
        if let Some(b) = rt.store.thread_binding(row.id)? {
            let chat = Chat { channel: b.channel, to: b.to, thread_id: Some(b.thread_id), account_id: None };
            return Ok(two_way(&rt.config, chat));
        }
        let Some(up) = row.spawned_by.clone() else { break };
        let Some(parent) = rt.store.session_by_key(&up)? else { return Ok(None) };
        row = parent;
    }
    let channel = super::channel_of_row(&row.key, Some(&row), rt);
    let (to, thread_id) = address(&row.key, Some(&row));
    Ok(to.and_then(|to| two_way(&rt.config, Chat { channel, to, thread_id, account_id: row.last_account_id.clone() })))
}

/// The chat, when its channel can both show an ask (a deliverer) and bring the answer back (a
/// bridge).
fn two_way(config: &Config, chat: Chat) -> Option<Chat> {
    let settings = config.channels.get(&chat.channel)?;
    let delivers = settings.deliver.as_ref().is_some_and(|argv| !argv.is_empty());
    (delivers && settings.bridge.is_some()).then_some(chat)
}

/// The outcome of a chat route that ends it: the deliverer could not post the ask.
const UNDELIVERED: &str = "undelivered";

/// Posts approval `ask` of `run` to `chat` (in the transaction that records the ask): queues its
/// delivery and records the route.
pub(super) fn post(tx: &Tx, run: &RunRow, ask: &NewAsk, chat: &Chat) -> Result<(), StoreError> {
    let payload = json!({
        "kind": DeliveryKind::Ask.as_str(), "channel": chat.channel, "to": chat.to, "accountId": chat.account_id,
        "threadId": chat.thread_id, "text": chat_text(run, ask), "sessionKey": run.session_key.as_str(),
        "runId": run.run_id, "chainId": run.chain_id, "requestId": ask.id, "code": code(ask.id),
        "idempotencyKey": format!("{}:ask", ask.id),
    });
    tx.queue_channel_delivery(&run.run_id, DeliveryKind::Ask, run.session_key.as_str(), &chat.channel, &payload)?;
    let event = json!({"route": "channel", "outcome": "posted", "channel": chat.channel, "to": chat.to,
                       "threadId": chat.thread_id, "at": now_ms()});
    tx.add_ask_route(ask.id, &event)?;
    Ok(())
}

fn code(id: &str) -> &str {
    id.get(..CODE_LEN).unwrap_or(id)
}

/// What the chat reads: the ask's words masked (as everywhere), and how to answer.
fn chat_text(run: &RunRow, ask: &NewAsk) -> String {
    let words = crate::sanitize::ask_words(ask.text, ask.options, ask.details);
    let details = words.details.map(|d| format!("\nDetails: {d}")).unwrap_or_default();
    let code = code(ask.id);
    format!(
        "Sub-agent {child} asks for approval: {text}{details}\nReply \"allow {code}\" or \"deny {code} <why>\" to answer (request {id}).",
        child = run.session_key,
        text = words.text,
        id = ask.id
    )
}

/// The channel `ask` is posted to while that route is open (posted, not failed).
pub fn posted_to(ask: &AskRow) -> Option<&str> {
    let of_chat = |e: &&Value| e["route"] == "channel";
    if ask.routes.iter().filter(of_chat).any(|e| e["outcome"] == UNDELIVERED) {
        return None;
    }
    ask.routes.iter().filter(of_chat).find(|e| e["outcome"] == "posted").and_then(|e| e["channel"].as_str())
}

/// Whether `ask` was posted to the chat `to` of `channel` (whatever became of it since).
fn posted_in(ask: &AskRow, channel: &str, to: &str) -> bool {
    ask.routes.iter().any(|e| e["route"] == "channel" && e["channel"] == channel && e["to"] == to)
}

/// An ask delivery that failed for good: the chat's route ends (recorded, and said in the asking
/// session), so the ask falls to the next way to answer.
pub(super) fn undelivered(rt: &Scheduler, payload: &Value, error: &str) {
    let Some(id) = payload["requestId"].as_str() else { return };
    let Ok(Some(ask)) = rt.store.ask(id) else { return };
    let channel = payload["channel"].as_str().unwrap_or("its channel");
    let event = json!({"route": "channel", "outcome": UNDELIVERED, "channel": channel, "at": now_ms()});
    let line = format!(
        "[input request {id}: it could not be posted to {channel} ({error}); it goes to the next way to answer]"
    );
    // The asking session's row before the ask's (`add_ask_route`), as every writer of both.
    let noted = rt.store.write_row_locked(|tx| -> Result<(), StoreError> {
        tx.lock_sessions(&[ask.session])?;
        if tx.add_ask_route(id, &event)? {
            tx.append_message(ask.session, &super::ask::route_message(&ask, &line))?;
        }
        Ok(())
    });
    if let Err(e) = noted {
        tracing::error!(ask = %id, error = %e, "recording an undelivered ask failed");
    }
    rt.wake();
}

/// A chat message that answers an approval: `allow <code> [why]` or `deny <code> [why]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatAnswer {
    pub decision: AskDecision,
    /// The request id or its first [`CODE_LEN`] or more characters, lowercase.
    pub code: String,
    pub text: Option<String>,
}

/// The answer a chat message gives, if it is one (else it is an ordinary message): the first word
/// `allow` or `deny` (any case, a leading `/` allowed), then a code of at least [`CODE_LEN`] hex
/// digits (dashes as in the id), then the person's words.
pub fn parse_answer(message: &str) -> Option<ChatAnswer> {
    let message = message.trim();
    let message = message.strip_prefix('/').unwrap_or(message);
    let (verb, rest) = message.split_once(char::is_whitespace)?;
    let decision = match verb.to_ascii_lowercase().as_str() {
        "allow" => AskDecision::Allow,
        "deny" => AskDecision::Deny,
        _ => return None,
    };
    let rest = rest.trim_start();
    let (code, words) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let is_code = code.len() >= CODE_LEN
        && code.len() <= 36
        && code.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && code.chars().take(CODE_LEN).all(|c| c.is_ascii_hexdigit());
    if !is_code {
        return None;
    }
    let words = words.trim();
    Some(ChatAnswer { decision, code: code.to_ascii_lowercase(), text: (!words.is_empty()).then(|| words.to_string()) })
}

/// What a chat's answer did.
#[derive(Debug)]
pub enum ChatAnswered {
    /// It answered the ask.
    Answered(AskRow),
    /// The same person's answer was already recorded (the bridge posted it again).
    Duplicate(AskRow),
    /// Closed before: why the answer was not used.
    Closed(String),
}

/// Who answered from a chat, as recorded (`answered_by`).
fn person(user: &ChannelUser) -> String {
    format!("{}:{}", user.channel, user.sender_id)
}

impl super::Engine<'_> {
    /// Answers, as `user`, the approval that `answer.code` names among those posted to the chat
    /// of `key` (a session key of `user.channel`, as the bridge's post names it). An ask not
    /// posted to that chat is not found, as one that does not exist.
    pub fn answer_in_chat(
        &self,
        key: &SessionKey,
        user: &ChannelUser,
        answer: &ChatAnswer,
    ) -> Result<ChatAnswered, ToolError> {
        let rt = self.runtime("a channel answer")?;
        let channel = user.channel.as_str();
        let row = rt.store.session_by_key(key)?;
        let to = address(key, row.as_ref()).0.unwrap_or_default();
        let mut here = rt.store.asks_with_prefix(&answer.code, 16)?;
        here.retain(|a| posted_in(a, channel, &to));
        let ask = match here.as_slice() {
            [] => {
                return Err(ToolError::not_found(format!(
                    "no approval {} was asked in this chat; answer with the code its message shows",
                    answer.code
                )));
            }
            [one] => one.clone(),
            _ => {
                return Err(ToolError::invalid(format!(
                    "{} names several approvals asked in this chat; give more of the request id",
                    answer.code
                )));
            }
        };
        let by = person(user);
        if ask.state != AskState::Open {
            let same = ask.answered_via == Some(AnsweredVia::Channel) && ask.answered_by.as_deref() == Some(&by);
            return Ok(if same { ChatAnswered::Duplicate(ask) } else { ChatAnswered::Closed(closed_how(&ask)) });
        }
        let recorded = Answer {
            decision: answer.decision,
            text: answer.text.as_deref(),
            by: &by,
            via: AnsweredVia::Channel,
            host: Some(channel),
        };
        let closed = close(rt, &ask.id, AskState::Answered, &recorded)?;
        let now = rt.store.ask(&ask.id)?.unwrap_or(ask);
        Ok(match closed {
            true => ChatAnswered::Answered(now),
            false => ChatAnswered::Closed(closed_how(&now)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_names_a_decision_and_a_code_and_anything_else_is_a_message() {
        let a = parse_answer("allow 1a2b3c4d").unwrap();
        assert_eq!((a.decision, a.code.as_str(), a.text), (AskDecision::Allow, "1a2b3c4d", None));
        let d = parse_answer("  /Deny 1A2B3C4D-99 not on main  ").unwrap();
        assert_eq!(
            (d.decision, d.code.as_str(), d.text.as_deref()),
            (AskDecision::Deny, "1a2b3c4d-99", Some("not on main"))
        );
        for message in [
            "allow me to explain",
            "deny 1a2b3c",
            "allow",
            "denyall 1a2b3c4d",
            "please allow 1a2b3c4d",
            "allow -1a2b3c4d",
        ] {
            assert_eq!(parse_answer(message), None, "{message}");
        }
    }
}
