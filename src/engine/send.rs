//! The start of a send: one transaction that either appends the message to an external target's
//! inbox, or queues the primary run in a driven target with its reply delivery and the caller's
//! idempotency key. `accepted` is answered only after it commits (`synchronous=FULL`).

use serde_json::{Value, json};

use crate::access::caller::Caller;
use crate::config::key_scope;
use crate::keys::{self, SessionKey};
use crate::store::{
    DeliveryKind, DeliveryMode, DeliveryStatus, NewDelivery, NewMessage, NewRun, NewSession, RunMode, Store,
    StoreError, add_delivery, append_message, enqueue, insert_session, remember_key,
};

/// What the send did.
#[derive(Debug, Clone)]
pub enum Started {
    /// The primary run was queued in a driven target.
    Run { run_id: String },
    /// The target is external: the message sits in its inbox; no reply will come.
    Inbox,
}

/// Everything a send commits.
pub struct SendPlan<'a> {
    pub caller: &'a Caller,
    pub caller_channel: String,
    pub target: &'a SessionKey,
    pub target_channel: String,
    pub target_external: bool,
    pub message: &'a str,
    pub chain_id: String,
    pub hop: i64,
    pub max_turns: u32,
    pub idempotency: Option<(&'a str, &'a str)>,
}

impl SendPlan<'_> {
    fn provenance(&self) -> Value {
        json!({"kind": "inter_session", "sourceSessionKey": self.caller.key.as_str(),
               "sourceChannel": self.caller_channel, "sourceTool": "sessions_send", "chainId": self.chain_id})
    }

    fn flow(&self) -> Value {
        json!({
            "requester": self.caller.key.as_str(), "target": self.target.as_str(), "request": self.message,
            "turn": 0, "max": self.max_turns,
            "parties": {"requester": self.caller.key.as_str(), "requesterChannel": self.caller_channel,
                        "target": self.target.as_str(), "targetChannel": self.target_channel},
        })
    }
}

/// Commits the send. A configured agent's main session that exists only virtually is written now.
pub fn start(store: &Store, config: &crate::config::Config, plan: &SendPlan) -> Result<Started, StoreError> {
    store.write(|tx| -> Result<Started, StoreError> {
        let agent = plan.target.agent_id(&config.default_agent());
        let scope = key_scope(config, &agent);
        let new = NewSession::new(plan.target.clone(), agent, keys::kind_of(plan.target, &scope, None), false);
        insert_session(tx, &new)?;
        let target_id: i64 = crate::store::session_id(tx, plan.target)?;
        let run_id = uuid::Uuid::new_v4().to_string();
        let started = if plan.target_external {
            append_message(
                tx,
                target_id,
                &NewMessage {
                    role: "user".into(),
                    content: json!([{"type": "text", "text": plan.message}]),
                    provenance: Some(plan.provenance()),
                    chain_id: Some(plan.chain_id.clone()),
                    run_id: Some(run_id.clone()),
                    ..Default::default()
                },
            )?;
            add_delivery(
                tx,
                &NewDelivery {
                    run_id: &run_id,
                    kind: DeliveryKind::Inbox,
                    mode: DeliveryMode::Inbox,
                    status: DeliveryStatus::Delivered,
                    target_key: plan.target.as_str(),
                    channel: Some("webchat"),
                    last_error: None,
                },
            )?;
            Started::Inbox
        } else {
            enqueue(
                tx,
                &NewRun {
                    run_id: run_id.clone(),
                    session: target_id,
                    mode: RunMode::Send,
                    input: json!({"role": "user", "content": plan.message}),
                    provenance: Some(plan.provenance()),
                    requester_key: Some(plan.caller.key.clone()),
                    chain_id: Some(plan.chain_id.clone()),
                    hop: plan.hop,
                    announce_kind: None,
                    model: None,
                    thinking: None,
                    timeout_ms: None,
                    extra: Some(plan.flow()),
                },
            )?;
            add_delivery(
                tx,
                &NewDelivery {
                    run_id: &run_id,
                    kind: DeliveryKind::Reply,
                    mode: DeliveryMode::Inbox,
                    status: DeliveryStatus::Queued,
                    target_key: plan.caller.key.as_str(),
                    channel: None,
                    last_error: None,
                },
            )?;
            Started::Run { run_id: run_id.clone() }
        };
        if let Some((key, hash)) = plan.idempotency {
            remember_key(
                tx,
                plan.caller.key.as_str(),
                key,
                "sessions_send",
                hash,
                &run_id,
                &json!({"inbox": matches!(started, Started::Inbox)}),
            )?;
        }
        Ok(started)
    })
}
