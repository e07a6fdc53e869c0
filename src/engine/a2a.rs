//! The engine's half of serving our agents over A2A (docs/A2A.md): a peer's message starts a run
//! — its task — in the session that its caller and its `contextId` name (`agent:<id>:a2a:direct:
//! <hash>`, so a context needs no table and no caller can name another's); a task is seen as its
//! run plus the open asks of its session's tree; the peer's next message on an `input-required`
//! task answers the oldest of them.

use serde_json::{Value, json};

use super::chain::ChannelUser;
use super::inject::{InjectError, Injected, Origin};
use super::scheduler::Scheduler;
use crate::access::ToolError;
use crate::keys::{AgentId, SessionKey};
use crate::store::{Answer, AnsweredVia, AskDecision, AskRow, AskState, CancelRequest, RunRow, SessionRow, StoreError};

/// The channel of the sessions A2A peers talk to (the send policy matches it).
pub const CHANNEL: &str = "a2a";

/// The session one caller's A2A context talks to: the caller and the context are hashed so that
/// the key says nothing of either and no caller can reach another's context by naming it.
pub fn session_key(agent: &AgentId, caller: &SessionKey, context_id: &str) -> SessionKey {
    let hash = crate::store::sha256_hex(&format!("{}\n{context_id}", caller.as_str()));
    SessionKey::from_canonical(format!("agent:{agent}:{CHANNEL}:direct:{}", &hash[..32]))
}

/// One message of an A2A peer.
#[derive(Debug, Clone)]
pub struct PeerMessage<'a> {
    /// The peer's identity: the session key its bearer token acts as.
    pub caller: &'a SessionKey,
    pub context_id: &'a str,
    pub message_id: &'a str,
    pub text: &'a str,
}

/// A task as its peer sees it: the run, the context it belongs to, and the ask it waits on.
#[derive(Debug, Clone)]
pub struct TaskView {
    pub run: RunRow,
    pub context_id: String,
    /// The oldest open ask of the run's tree while the run is running.
    pub ask: Option<AskRow>,
}

/// Whether `child`'s tree is rooted in an A2A session (its peer is a person route for its asks).
pub fn in_a2a_tree(rt: &Scheduler, child: &SessionRow) -> Result<bool, StoreError> {
    let mut row = child.clone();
    while let Some(up) = row.spawned_by.clone() {
        let Some(parent) = rt.store.session_by_key(&up)? else { return Ok(false) };
        row = parent;
    }
    Ok(crate::keys::channel_in_key(&row.key) == Some(CHANNEL))
}

/// The route event an ask of an A2A tree records: its task shows it to the peer.
pub fn route_event() -> Value {
    json!({"route": CHANNEL, "outcome": "shown", "at": crate::store::now_ms()})
}

/// Where a person sees `ask` when it was shown to an A2A peer, in words.
pub fn shown_to_peer(ask: &AskRow) -> Option<String> {
    ask.routes.iter().any(|e| e["route"] == CHANNEL).then(|| "A2A (its peer's task is input-required)".to_string())
}

/// The provenance of a run that makes it `caller`'s task, and that task's context.
fn context_of(run: &RunRow, caller: &SessionKey) -> Option<String> {
    let p = run.provenance.as_ref()?;
    let mine = p["sourceTool"] == "a2a" && p["senderId"].as_str() == Some(caller.as_str());
    let in_channel = crate::keys::channel_in_key(&run.session_key) == Some(CHANNEL);
    (mine && in_channel).then(|| p["threadId"].as_str().map(String::from)).flatten()
}

impl super::Engine<'_> {
    /// Starts a turn of `agent` for the peer's message (or finds the one its message id started).
    pub fn a2a_start(&self, agent: &AgentId, msg: &PeerMessage) -> Result<Injected, InjectError> {
        let key = session_key(agent, msg.caller, msg.context_id);
        let peer = ChannelUser {
            channel: CHANNEL.into(),
            sender_id: msg.caller.as_str().into(),
            sender_name: None,
            thread_id: Some(msg.context_id.into()),
            message_id: Some(msg.message_id.into()),
        };
        self.inject(&key, msg.text, &Origin::A2a(Box::new(peer)))
    }

    /// `run_id` as `caller`'s task of `agent`; None for a run that is not one (another caller's
    /// looks exactly like one that does not exist).
    pub fn a2a_task(&self, agent: &AgentId, caller: &SessionKey, run_id: &str) -> Result<Option<TaskView>, ToolError> {
        let rt = self.runtime("A2A")?;
        let Some(run) = rt.store.run(run_id)? else { return Ok(None) };
        let Some(context_id) = context_of(&run, caller).filter(|_| run.agent_id == *agent) else { return Ok(None) };
        let ask = match run.status {
            crate::store::RunStatus::Running => oldest_open_ask(rt, &run)?,
            _ => None,
        };
        Ok(Some(TaskView { run, context_id, ask }))
    }

    /// The peer's answer to `ask`; false when someone answered it first.
    pub fn a2a_answer(
        &self,
        caller: &SessionKey,
        ask: &AskRow,
        decision: AskDecision,
        text: Option<&str>,
    ) -> Result<bool, ToolError> {
        let rt = self.runtime("A2A")?;
        let answer = Answer { decision, text, by: caller.as_str(), via: AnsweredVia::A2a, host: Some(CHANNEL) };
        Ok(super::ask::close(rt, &ask.id, AskState::Answered, &answer)?)
    }

    /// Asks the task's run to stop (see [`Scheduler::cancel_run`]).
    pub fn a2a_cancel(&self, run_id: &str) -> Result<CancelRequest, ToolError> {
        Ok(self.runtime("A2A")?.cancel_run(run_id)?)
    }
}

/// The oldest open ask of `run` itself or of a session below its session.
fn oldest_open_ask(rt: &Scheduler, run: &RunRow) -> Result<Option<AskRow>, StoreError> {
    let own =
        rt.store.asks_of_runs(std::slice::from_ref(&run.run_id))?.into_iter().filter(|a| a.state == AskState::Open);
    let below = rt.store.open_asks_below(&run.session_key)?;
    Ok(own.chain(below).min_by_key(|a| a.created_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_key_is_per_caller_and_context_and_names_neither() {
        let main = AgentId::main();
        let a = SessionKey::from_canonical("agent:main:alice");
        let b = SessionKey::from_canonical("agent:main:bob");
        let key = session_key(&main, &a, "ctx-1");
        assert_eq!(key, session_key(&main, &a, "ctx-1"));
        assert_ne!(key, session_key(&main, &b, "ctx-1"));
        assert_ne!(key, session_key(&main, &a, "ctx-2"));
        assert!(key.as_str().starts_with("agent:main:a2a:direct:"), "{key}");
        assert!(!key.as_str().contains("alice") && !key.as_str().contains("ctx"), "{key}");
        assert_eq!(crate::keys::channel_in_key(&key), Some(CHANNEL));
    }

    #[test]
    fn a_run_is_a_task_only_of_the_peer_that_started_it() {
        let alice = SessionKey::from_canonical("agent:main:alice");
        let bob = SessionKey::from_canonical("agent:main:bob");
        let mut run = RunRow::for_test("r1", crate::store::RunMode::Inject, crate::store::RunStatus::Running);
        run.session_key = session_key(&AgentId::main(), &alice, "c1");
        run.provenance = Some(json!({"sourceTool": "a2a", "senderId": "agent:main:alice", "threadId": "c1"}));
        assert_eq!(context_of(&run, &alice).as_deref(), Some("c1"));
        assert_eq!(context_of(&run, &bob), None);
        // A channel bridge's run with the same sender id is no A2A task.
        run.provenance =
            Some(json!({"sourceTool": "channel_bridge", "senderId": "agent:main:alice", "threadId": "c1"}));
        assert_eq!(context_of(&run, &alice), None);
    }
}
