//! The state a run carries to the steps after it (`runs.extra`): what a send's exchange, a
//! spawn and a completion need to know from run to run. One typed shape, written and read here
//! only; rows written before this type existed read back the same (the JSON keys are unchanged).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::context::Parties;
use crate::keys::SessionKey;

/// A run's flow state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Flow {
    Tagged(Tagged),
    /// A send's exchange: its primary run, the reply steps, the announce step.
    Exchange(Exchange),
}

/// The flows that name themselves in the `flow` key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "flow", rename_all = "lowercase")]
pub enum Tagged {
    /// A child's spawn run (and its Notes step, which carries the same state).
    Spawn(Box<SpawnFlow>),
    /// A completion run in a driven requester.
    Completion { child: String },
}

/// Between the two sessions of a send, from the primary run to the announce step.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Exchange {
    pub requester: String,
    pub target: String,
    /// The message that started the exchange.
    pub request: String,
    /// The reply step this is (0: the primary run).
    pub turn: u32,
    /// `maxPingPongTurns` when the exchange started.
    pub max: u32,
    pub parties: Parties,
    /// The target's first reply (set after the primary run; none when it stayed silent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_one: Option<String>,
    /// The latest reply of either side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest: Option<String>,
}

impl Exchange {
    pub fn target_key(&self) -> SessionKey {
        SessionKey::from_canonical(&self.target)
    }

    pub fn requester_key(&self) -> SessionKey {
        SessionKey::from_canonical(&self.requester)
    }
}

/// What a spawn's runs carry: who to announce to, what to do after, the child's context.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpawnFlow {
    pub requester: String,
    pub cleanup: Cleanup,
    /// The sub-agent context, the `system` text of the child's runs.
    pub system: String,
    /// The attachments as the child's request lists them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<Value>,
    /// Where the attachments lie (removed with a deleted child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments_path: Option<String>,
    /// The spawn's `attachAs` hint, as given (reserved: recorded, not acted on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach_as: Option<Value>,
    /// The requester's project the child works in (`workspace: "project"`); none: the agent's
    /// own workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The child's own git worktree of the project (`workspace: "worktree"`), settled at its
    /// announce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::runner::worktree::Worktree>,
    /// The child runs a CLI started per turn: its notes are the `Notes:` section of its final
    /// reply (asked for in [`SpawnFlow::system`] while announceStep is on), never a Notes step,
    /// which would start the CLI, and call its model, a second time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notes_in_reply: bool,
}

/// What happens to a child session after its announce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cleanup {
    Delete,
    Keep,
}

impl Flow {
    /// The flow state of a run (None for runs that carry none, or an unreadable one).
    pub fn of(extra: Option<&Value>) -> Option<Flow> {
        Flow::deserialize(extra?).ok()
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a flow state serialises")
    }

    pub fn exchange(&self) -> Option<&Exchange> {
        match self {
            Flow::Exchange(e) => Some(e),
            Flow::Tagged(_) => None,
        }
    }

    pub fn into_exchange(self) -> Option<Exchange> {
        match self {
            Flow::Exchange(e) => Some(e),
            Flow::Tagged(_) => None,
        }
    }

    pub fn spawn(&self) -> Option<&SpawnFlow> {
        match self {
            Flow::Tagged(Tagged::Spawn(s)) => Some(s),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Rows written before the type existed (the keys the flows wrote by hand) read back.
    #[test]
    fn stored_flow_states_read_back_and_keep_their_keys() {
        let exchange = json!({"requester": "agent:main:main", "target": "agent:main:b", "request": "hi",
            "turn": 0, "max": 5, "parties": {"requester": "agent:main:main", "requesterChannel": "webchat",
            "target": "agent:main:b", "targetChannel": "discord"}, "roundOne": null, "latest": "yo"});
        let flow = Flow::of(Some(&exchange)).expect("exchange");
        let e = flow.exchange().expect("an exchange");
        assert_eq!((e.turn, e.max, e.round_one.as_deref(), e.latest.as_deref()), (0, 5, None, Some("yo")));
        assert_eq!(e.parties.target_channel, "discord");
        let spawn = json!({"flow": "spawn", "requester": "agent:main:main", "cleanup": "delete", "system": "ctx",
            "attachmentsPath": "/w/a"});
        let flow = Flow::of(Some(&spawn)).expect("spawn");
        let s = flow.spawn().expect("a spawn");
        assert_eq!(
            (s.cleanup, s.attachments_path.as_deref(), s.system.as_str()),
            (Cleanup::Delete, Some("/w/a"), "ctx")
        );
        assert_eq!(flow.to_json(), spawn, "the same keys are written back");
        let completion = json!({"flow": "completion", "child": "agent:main:subagent:1"});
        assert!(matches!(Flow::of(Some(&completion)), Some(Flow::Tagged(Tagged::Completion { .. }))));
        assert_eq!(Flow::of(Some(&completion)).unwrap().to_json(), completion);
    }
}
