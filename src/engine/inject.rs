//! Messages from outside into a session, each starting a new chain (hop 0): the operator's
//! (`sessions-mcp inject`) and a channel user's, posted by the channel's bridge
//! (`POST /channels/<name>/messages`). An external session gets the message in its inbox; a
//! driven one runs it (mode `inject`), and its reply goes out through the session's channel
//! deliverer (the steps after the run).

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::chain::{ChannelUser, Provenance, SourceTool};
use crate::access::Access;
use crate::config::{Config, key_scope};
use crate::keys::{self, SessionKey};
use crate::store::{NewMessage, NewRun, NewSession, Route, RunMode, Store, StoreError};

/// Who a message from outside comes from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// The operator, at the command line.
    Operator,
    /// A user on a channel, as its bridge tells it, and where a reply to them goes.
    Channel(Box<(ChannelUser, Route)>),
    /// An A2A peer (`channel: "a2a"`, `senderId`: its caller key, `threadId`: its contextId,
    /// `messageId`: its message's); the reply is read back from the run (its task), not delivered.
    A2a(Box<ChannelUser>),
}

/// What became of a message from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injected {
    /// Appended to an external session's inbox.
    Appended,
    /// Queued as a run of a driven session.
    Queued(String),
    /// The bridge posted this message id before: nothing new happened (the first run's id).
    Duplicate(Option<String>),
}

/// Why a message from outside was not taken: the send policy, the session's agent has no runner,
/// the channel's users already have their most runs queued, or the store (or the runtime) failed.
/// Each says what to change.
#[derive(Debug, Clone)]
pub enum InjectError {
    Policy(String),
    NoRunner(String),
    /// `limit` is the config key that sets `max`.
    QueueFull {
        message: String,
        limit: String,
        max: u32,
    },
    Store(String),
}

impl std::fmt::Display for InjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (InjectError::Policy(m)
        | InjectError::NoRunner(m)
        | InjectError::QueueFull { message: m, .. }
        | InjectError::Store(m)) = self;
        f.write_str(m)
    }
}

impl From<StoreError> for InjectError {
    fn from(e: StoreError) -> Self {
        InjectError::Store(e.to_string())
    }
}

/// Refuses a channel user's message while the channel's users have
/// `channels.<name>.bridge.maxQueuedRuns` runs waiting: read in the transaction that would queue
/// one more, so concurrent posts cannot overshoot it.
fn check_channel_queue(tx: &crate::store::Tx, config: &Config, channel: &str) -> Result<(), InjectError> {
    let max = config.bridge_max_queued_runs(channel);
    let queued = tx.queued_channel_runs(channel)?;
    let limit = format!("channels.{channel}.bridge.maxQueuedRuns");
    check_queue(queued, max, limit, &format!("channel {channel:?}"), "its users' messages")
}

/// [`check_channel_queue`] for an A2A peer (`server.a2a.maxQueuedRuns`).
fn check_peer_queue(tx: &crate::store::Tx, config: &Config, peer: &str) -> Result<(), InjectError> {
    let max = config.server.a2a.max_queued_runs();
    let queued = tx.queued_peer_runs(peer)?;
    check_queue(queued, max, "server.a2a.maxQueuedRuns".into(), &format!("A2A peer {peer}"), "its messages")
}

fn check_queue(queued: i64, max: u32, limit: String, who: &str, what: &str) -> Result<(), InjectError> {
    if queued < i64::from(max) {
        return Ok(());
    }
    let message =
        format!("{who} already has {queued} runs queued for {what}; {limit} is {max}: retry once they have started");
    Err(InjectError::QueueFull { message, limit, max })
}

/// Appends the message to an external session, or queues an `inject` run. The send policy gates
/// it; the session is created (driven) when it does not exist.
pub fn start(
    store: &Store,
    config: &Arc<Config>,
    state_dir: &Path,
    key: &SessionKey,
    text: &str,
    origin: &Origin,
) -> Result<Injected, InjectError> {
    let agent = key.agent_id(&config.default_agent());
    let row = store.session_by_key(key).map_err(|e| InjectError::Store(e.to_string()))?;
    let decision = Access::new(store.clone(), config.clone()).send_decision(key, row.as_ref());
    if !decision.allowed() {
        return Err(InjectError::Policy(decision.refusal(config.session.send_policy.as_ref())));
    }
    let external = row.as_ref().is_some_and(|r| r.external);
    if !external {
        let exe = std::env::current_exe().map_err(|e| InjectError::Store(e.to_string()))?;
        crate::runner::resolve_runner(config, &agent, state_dir, &exe).map_err(InjectError::NoRunner)?;
    }
    let chain = uuid::Uuid::new_v4().to_string();
    let (tool, user, route) = match origin {
        Origin::Operator => (SourceTool::Inject, None, None),
        Origin::Channel(channel) => (SourceTool::ChannelBridge, Some(channel.0.clone()), Some(&channel.1)),
        Origin::A2a(peer) => (SourceTool::A2a, Some(peer.as_ref().clone()), None),
    };
    let message_id = user.as_ref().and_then(|u| u.message_id.clone());
    let provenance = Provenance::ExternalUser { tool, chain: Some(chain.clone()), user }.to_json();
    let scope = key_scope(config, &agent);
    let run_id = uuid::Uuid::new_v4().to_string();
    // A sub-agent's later turns (a thread's follow-up) keep its sub-agent context.
    let spawn_flow = match row.as_ref().and_then(|r| r.spawn_run.as_deref()) {
        Some(spawn_run) => store.run(spawn_run).map_err(|e| InjectError::Store(e.to_string()))?.and_then(|r| r.extra),
        None => None,
    };
    // No global lock on a shared database: the bridge's message id is taken first (a second post
    // of it waits for this commit and is answered with its run), then the source's queue bound
    // (its key held from the count to the commit), then the rows of the session it writes in.
    store.write_row_locked(|tx| -> Result<Injected, InjectError> {
        if let Some(message_id) = &message_id
            && let Some(hit) = tx.claim_bridge_message(key, message_id, &run_id)?
        {
            return Ok(Injected::Duplicate(hit.run_id));
        }
        if let Some(route) = route.filter(|_| !external) {
            check_channel_queue(tx, config, &route.channel)?;
        }
        if let Origin::A2a(peer) = origin {
            check_peer_queue(tx, config, &peer.sender_id)?;
        }
        tx.insert_session(&NewSession::new(key.clone(), agent.clone(), keys::kind_of(key, &scope, None), false))?;
        let id: i64 = tx.session_id(key)?;
        if let Some(route) = route {
            tx.set_route(id, route)?;
        }
        let injected = if external {
            let m = NewMessage {
                role: "user".into(),
                content: json!(text),
                provenance: Some(provenance.clone()),
                chain_id: Some(chain.clone()),
                ..Default::default()
            };
            tx.append_message(id, &m)?;
            Injected::Appended
        } else {
            tx.enqueue(&NewRun {
                provenance: Some(provenance.clone()),
                chain_id: Some(chain.clone()),
                extra: spawn_flow.clone(),
                ..NewRun::new(run_id.clone(), id, RunMode::Inject, json!({"role": "user", "content": text}))
            })?;
            Injected::Queued(run_id.clone())
        };
        Ok(injected)
    })
}

/// A channel user's message for `key`, checked against the bridge's channel: the key must name
/// that channel (a bridge cannot post into another channel's sessions, nor into a session that is
/// on no channel). A reply goes to the key's thread and, in a direct chat, to the sender.
pub fn channel_origin(key: &SessionKey, user: ChannelUser, account_id: Option<String>) -> Result<Origin, String> {
    let Some(channel) = keys::channel_in_key(key) else {
        return Err(format!(
            "{key} is not a session of a channel; a bridge posts to keys like agent:<id>:{}:group:<id>",
            user.channel
        ));
    };
    if channel != user.channel {
        return Err(format!("{key} is a session of channel {channel:?}, not of {:?}", user.channel));
    }
    let (_, in_key) = super::deliver::address(key, None);
    if let (Some(a), Some(b)) = (&in_key, &user.thread_id)
        && a != b
    {
        return Err(format!("threadId {b:?} does not match the thread of {key} ({a:?})"));
    }
    let direct = keys::chat_type_of(key, None) == Some(keys::ChatType::Direct);
    let route = Route {
        channel: channel.to_string(),
        to: direct.then(|| format!("user:{}", user.sender_id)),
        thread_id: in_key.or_else(|| user.thread_id.clone()),
        account_id,
    };
    Ok(Origin::Channel(Box::new((user, route))))
}

impl super::Engine<'_> {
    /// Where a bridge's message for `key` goes: the session-mode child bound to the key's thread
    /// when there is one (its follow-up), else `key` itself; with the origin to record.
    pub fn route_bridged(
        &self,
        key: &SessionKey,
        user: ChannelUser,
        account_id: Option<String>,
    ) -> Result<(SessionKey, Origin), crate::access::ToolError> {
        let rt = self.runtime("a channel message")?;
        let channel = user.channel.clone();
        if let (Some(to), Some(thread)) = super::deliver::address(key, None)
            && let Some(child) = rt.store.bound_session(&channel, &to, &thread)?
        {
            let route = Route { channel, to: Some(to), thread_id: Some(thread), account_id };
            return Ok((child, Origin::Channel(Box::new((user, route)))));
        }
        let origin = channel_origin(key, user, account_id).map_err(crate::access::ToolError::forbidden)?;
        Ok((key.clone(), origin))
    }

    /// A message from outside into `key` (see [`start`]), on this runtime; the run starts at once.
    pub fn inject(&self, key: &SessionKey, text: &str, origin: &Origin) -> Result<Injected, InjectError> {
        let rt = self.runtime("a channel message").map_err(|e| InjectError::Store(e.message))?;
        let injected = start(&rt.store, &rt.config, &rt.state_dir, key, text, origin)?;
        rt.wake();
        Ok(injected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::AgentId;

    /// Eight posts at once from two nodes to a channel whose bridge queues at most three runs,
    /// each counting and queueing as `start` does, without the global write lock: three are
    /// queued and the other five refused (the channel's queue-bound key orders the counts).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_posts_to_one_channel_from_two_nodes_at_once_never_queue_past_its_bound() {
        let sha = "0".repeat(64);
        let text = format!(
            "{{ channels: {{ discord: {{ bridge: {{ tokens: [{{ sha256: '{sha}' }}], maxQueuedRuns: 3 }} }} }} }}"
        );
        let config = Arc::new(crate::config::parse(&text).unwrap().0);
        crate::store::postgres::with_test_database(async |target| {
            let dirs = [(); 2].map(|_| tempfile::tempdir().unwrap());
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            let start = Arc::new(std::sync::Barrier::new(8));
            let posts: Vec<_> = (0..8)
                .map(|i| {
                    let (store, config, start) = (nodes[i % 2].clone(), config.clone(), start.clone());
                    std::thread::spawn(move || {
                        let key = SessionKey::from_canonical(format!("agent:main:discord:group:g{i}"));
                        let provenance = json!({"sourceTool": "channel_bridge", "sourceChannel": "discord"});
                        start.wait();
                        store.write_row_locked(|tx| -> Result<bool, InjectError> {
                            match check_channel_queue(tx, &config, "discord") {
                                Err(InjectError::QueueFull { .. }) => return Ok(false),
                                checked => checked?,
                            }
                            let new = NewSession::new(key.clone(), AgentId::main(), keys::SessionKind::Other, false);
                            tx.insert_session(&new)?;
                            tx.enqueue(&NewRun {
                                provenance: Some(provenance.clone()),
                                ..NewRun::new(format!("post-{i}"), tx.session_id(&key)?, RunMode::Inject, json!({}))
                            })?;
                            Ok(true)
                        })
                    })
                })
                .collect();
            let queued = posts.into_iter().map(|p| p.join().unwrap().expect("a post failed")).filter(|q| *q).count();
            assert_eq!(queued, 3, "as many posts queued as the bound lets");
            let counted = nodes[1].write(|tx| tx.queued_channel_runs("discord")).unwrap();
            assert_eq!(counted, 3);
        })
        .await;
    }
}
