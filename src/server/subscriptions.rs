//! Transcript subscriptions (`resources/subscribe` and `subscriptions/listen`): what each MCP
//! session watches, the per-caller cap `server.maxSubscriptions`, and one change feed per
//! listener ([`Hub`]).
//!
//! The feed reads the store each time it changed — which sessions gained messages since the newest
//! message id it saw — and broadcasts that list; every watcher looks its own transcripts up in it.
//! A change is a commit of this process ([`crate::store::Store::changes`]), or one the owner of the runtime
//! announced to this process (its appends, and those other processes woke it for); a slow poll
//! underneath catches writers that announce nothing (the operator's commands, a process whose
//! link to the owner is down). Watching costs the same for one subscription as for thousands, and
//! nothing is read while nobody watches. A transcript is watched once per MCP
//! session whatever form its URI took (keyed by the canonical session key).
//!
//! A session's subscriptions live in its rmcp service: when the MCP session ends (stdio EOF, HTTP
//! `DELETE` or expiry, SSE disconnect) rmcp drops the service, which gives the caller's slots back
//! and stops its watcher. A watcher never keeps its session's subscriptions alive.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rmcp::model::ResourceUpdatedNotificationParam;
use rmcp::service::Peer;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::json;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::Access;
use crate::keys::SessionKey;

/// How often the feed looks for new messages when no change was announced.
const POLL: Duration = Duration::from_millis(250);
/// Ticks a busy watcher may fall behind before it re-reads its transcripts instead.
const BACKLOG: usize = 64;

/// The sessions that grew in one tick: (canonical key, last seq).
pub(super) type Batch = Arc<Vec<(String, i64)>>;

/// What the MCP sessions of one listener share: the caller counts, the feed, the watchers.
#[derive(Clone)]
pub struct Hub(Arc<HubInner>);

struct HubInner {
    access: Access,
    cap: usize,
    /// Subscriptions held per caller (its canonical key), over all its MCP sessions.
    per_caller: Mutex<HashMap<String, usize>>,
    feed: broadcast::Sender<Batch>,
    /// Whether the feed task runs; it stops when no watcher is left.
    feed_running: Mutex<bool>,
    watchers: TaskTracker,
}

impl Hub {
    pub fn new(access: Access, cap: u32) -> Hub {
        Hub(Arc::new(HubInner {
            access,
            cap: cap as usize,
            per_caller: Mutex::new(HashMap::new()),
            feed: broadcast::channel(BACKLOG).0,
            feed_running: Mutex::new(false),
            watchers: TaskTracker::new(),
        }))
    }

    /// Watchers still running: MCP sessions that subscribed, and open `subscriptions/listen`s.
    pub fn watchers(&self) -> usize {
        self.0.watchers.len()
    }

    /// Subscriptions held, over all callers.
    pub fn subscriptions(&self) -> usize {
        self.0.per_caller.lock().expect("subscription counts").values().sum()
    }

    /// A receiver of the feed, which starts if it was not running. Taken before any last seq is
    /// read, so an append between that read and the next tick is in a batch this receiver gets.
    pub(super) fn receiver(&self) -> broadcast::Receiver<Batch> {
        let mut running = self.0.feed_running.lock().expect("feed state");
        let rx = self.0.feed.subscribe();
        if !*running {
            *running = true;
            // Watched before the first read, so that a commit after it is a change the feed sees.
            let changes = self.0.access.changes();
            // An unreadable store starts from 0: the first tick reports every session, and
            // watchers ignore what is not newer than what they know.
            let from = self.0.access.newest_message_id().unwrap_or(0);
            tokio::spawn(feed(Arc::downgrade(&self.0), from, changes));
        }
        rx
    }

    fn take_slot(&self, caller: &SessionKey) -> Result<(), McpError> {
        let mut counts = self.0.per_caller.lock().expect("subscription counts");
        let held = counts.entry(caller.to_string()).or_default();
        if *held >= self.0.cap {
            let cap = self.0.cap;
            return Err(McpError::invalid_params(
                format!(
                    "subscription limit reached: session {caller} already watches {cap} transcripts \
                     (server.maxSubscriptions = {cap}); unsubscribe from one first, or raise \
                     server.maxSubscriptions in the config"
                ),
                Some(json!({"limit": cap, "configKey": "server.maxSubscriptions"})),
            ));
        }
        *held += 1;
        Ok(())
    }

    fn give_back(&self, caller: &str) {
        let mut counts = self.0.per_caller.lock().expect("subscription counts");
        if let Some(held) = counts.get_mut(caller) {
            *held -= 1;
            if *held == 0 {
                counts.remove(caller);
            }
        }
    }
}

/// Broadcasts the sessions that grew, one store read per change (changes during a read fold into
/// the next), while anyone listens.
async fn feed(hub: Weak<HubInner>, mut after: i64, mut changes: watch::Receiver<u64>) {
    loop {
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
        let Some(hub) = hub.upgrade() else { return };
        {
            // Under the lock `receiver` takes, so a new receiver either sees the feed run or
            // starts a new one.
            let mut running = hub.feed_running.lock().expect("feed state");
            if hub.feed.receiver_count() == 0 {
                *running = false;
                return;
            }
        }
        match hub.access.grown_since(after) {
            Ok((top, grown)) => {
                after = top;
                if !grown.is_empty() {
                    let _ = hub.feed.send(Arc::new(grown));
                }
            }
            Err(e) => tracing::warn!(error = %e, "the transcript change feed could not read the store"),
        }
    }
}

/// One watched transcript.
struct Entry {
    /// The URI notified: the form the client used last.
    uri: String,
    /// The last seq the client was told about; None for a transcript the caller may not read,
    /// which is held (and counted) but never notifies.
    last: Option<i64>,
    /// The caller whose slot this entry takes.
    caller: String,
}

/// The transcripts of one MCP session (or one listen), keyed by canonical session key.
struct Watched {
    hub: Hub,
    entries: Mutex<HashMap<String, Entry>>,
    /// Cancelled when the session's subscriptions are dropped: stops the watcher.
    ended: CancellationToken,
}

impl Drop for Watched {
    fn drop(&mut self) {
        for entry in self.entries.get_mut().expect("subscriptions").values() {
            self.hub.give_back(&entry.caller);
        }
        self.ended.cancel();
    }
}

impl Watched {
    /// The URIs to notify after `received`; None when the feed is gone.
    fn grown(&self, received: Result<Batch, RecvError>) -> Option<Vec<String>> {
        let mut entries = self.entries.lock().expect("subscriptions");
        let mut uris = Vec::new();
        let mut advance = |entry: &mut Entry, seq: i64| {
            if let Some(last) = entry.last.as_mut().filter(|last| seq > **last) {
                *last = seq;
                uris.push(entry.uri.clone());
            }
        };
        match received {
            Ok(batch) => {
                for (key, seq) in batch.iter() {
                    if let Some(entry) = entries.get_mut(key) {
                        advance(entry, *seq);
                    }
                }
            }
            // Batches were missed: read this session's transcripts instead.
            Err(RecvError::Lagged(_)) => {
                let keys: Vec<SessionKey> = entries
                    .iter()
                    .filter(|(_, e)| e.last.is_some())
                    .map(|(k, _)| SessionKey::from_canonical(k.clone()))
                    .collect();
                match self.hub.0.access.last_seqs_of(&keys) {
                    Ok(seqs) => {
                        for (key, seq) in keys.iter().zip(seqs) {
                            advance(entries.get_mut(key.as_str()).expect("read under the lock"), seq);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "re-reading subscribed transcripts failed"),
                }
            }
            Err(RecvError::Closed) => return None,
        }
        Some(uris)
    }
}

/// The transcripts one MCP session watches. Clones share them; the last clone dropped ends them.
#[derive(Clone)]
pub struct Subscriptions {
    hub: Hub,
    watched: Arc<Watched>,
    /// Whether this session's watcher (handshake-era notifications) was started.
    watcher: Arc<Mutex<bool>>,
}

/// A transcript as the caller named it.
pub struct Named {
    /// The canonical session key; for a reference the caller may not resolve, what it typed.
    pub identity: String,
    /// The session, when the caller may read it (None: held, never notified).
    pub readable: Option<SessionKey>,
}

impl Subscriptions {
    pub fn new(hub: Hub) -> Subscriptions {
        let watched = Watched { hub: hub.clone(), entries: Mutex::default(), ended: CancellationToken::new() };
        Subscriptions { hub, watched: Arc::new(watched), watcher: Arc::default() }
    }

    /// The hub these subscriptions count on.
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// A new, empty set on the same hub (one `subscriptions/listen`).
    pub fn fresh(&self) -> Subscriptions {
        Subscriptions::new(self.hub.clone())
    }

    /// Starts this session's watcher unless it runs: it tells `peer` when a watched transcript
    /// grows, until the session's subscriptions are dropped or a notification cannot be sent.
    /// Called before the first `add`, so the watcher hears of every append after it.
    pub fn start_watcher(&self, peer: Peer<RoleServer>) {
        let mut started = self.watcher.lock().expect("watcher state");
        if !*started {
            *started = true;
            let rx = self.hub.receiver();
            let (watched, ended) = (Arc::downgrade(&self.watched), self.watched.ended.clone());
            self.hub.0.watchers.spawn(watch(watched, ended, rx, peer, self.hub.clone()));
        }
    }

    /// Watches `named` for `caller` from its current last seq. Another form of a watched
    /// transcript takes no new slot; it only becomes the URI notified.
    pub fn add(&self, caller: &SessionKey, named: Named, uri: &str) -> Result<(), McpError> {
        let mut entries = self.watched.entries.lock().expect("subscriptions");
        if let Some(entry) = entries.get_mut(&named.identity) {
            entry.uri = uri.to_string();
            return Ok(());
        }
        // Read under the lock: a batch handled after this read is handled after the insert.
        let last = match &named.readable {
            Some(key) => {
                Some(self.hub.0.access.last_seq_of(key).map_err(|e| McpError::internal_error(e.to_string(), None))?)
            }
            None => None,
        };
        self.hub.take_slot(caller)?;
        entries.insert(named.identity, Entry { uri: uri.to_string(), last, caller: caller.to_string() });
        Ok(())
    }

    /// Stops watching `identity`, or failing that whatever was subscribed as exactly `uri`.
    pub fn remove(&self, identity: Option<&str>, uri: &str) {
        let mut entries = self.watched.entries.lock().expect("subscriptions");
        let key = identity
            .filter(|i| entries.contains_key(*i))
            .map(str::to_string)
            .or_else(|| entries.iter().find(|(_, e)| e.uri == uri).map(|(k, _)| k.clone()));
        if let Some(entry) = key.and_then(|k| entries.remove(&k)) {
            self.hub.give_back(&entry.caller);
        }
    }

    /// A receiver for [`Subscriptions::next`] (one listen; take it before the first `add`).
    pub fn receiver(&self) -> broadcast::Receiver<Batch> {
        self.hub.receiver()
    }

    /// The watched URIs that grew in the next tick; None when the feed is gone.
    pub async fn next(&self, rx: &mut broadcast::Receiver<Batch>) -> Option<Vec<String>> {
        self.watched.grown(rx.recv().await)
    }

    /// Runs `f` (a listen's loop) as one of the hub's watchers.
    pub async fn tracked<T>(&self, f: impl Future<Output = T>) -> T {
        self.hub.0.watchers.track_future(f).await
    }
}

/// The handshake-era watcher of one MCP session.
async fn watch(
    watched: Weak<Watched>,
    ended: CancellationToken,
    mut rx: broadcast::Receiver<Batch>,
    peer: Peer<RoleServer>,
    hub: Hub,
) {
    loop {
        let received = tokio::select! {
            _ = ended.cancelled() => break,
            r = rx.recv() => r,
        };
        let Some(uris) = watched.upgrade().and_then(|w| w.grown(received)) else { break };
        for uri in uris {
            if peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri)).await.is_err() {
                return tracing::debug!(subscriptions = hub.subscriptions(), "the client is gone: watcher ended");
            }
        }
    }
    tracing::debug!(subscriptions = hub.subscriptions(), "the MCP session ended: watcher ended");
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rmcp::ServiceExt;
    use serde_json::{Value, json};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    use super::Hub;
    use crate::access::Access;
    use crate::access::caller::Caller;
    use crate::server::SessionsServer;
    use crate::store::Store;

    /// Sends one JSON-RPC line; with an id, reads lines until its answer.
    async fn rpc<R, W>(reader: &mut tokio::io::Lines<R>, writer: &mut W, message: Value) -> Option<Value>
    where
        R: tokio::io::AsyncBufRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin,
    {
        writer.write_all(format!("{message}\n").as_bytes()).await.unwrap();
        let id = message.get("id")?;
        while let Some(line) = reader.next_line().await.unwrap() {
            let reply: Value = serde_json::from_str(&line).unwrap();
            if reply.get("id") == Some(id) {
                return Some(reply);
            }
        }
        panic!("the server closed the pipe before answering {message}");
    }

    #[tokio::test]
    async fn the_watcher_and_the_slots_end_when_the_client_goes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Store::path_in(dir.path())).unwrap();
        let world = json!({"sessions": [{"key": "agent:main:main", "messages": [{"role": "user", "content": "hi"}]}]});
        crate::cli::seed::seed_world(&store, &serde_json::from_value(world).unwrap()).unwrap();
        let access = Access::new(store.clone(), Arc::new(crate::config::Config::default()));
        let hub = Hub::new(access.clone(), 10);
        let server = SessionsServer::on_hub(access, Caller::external_main(), None, hub.clone());
        let (client, transport) = tokio::io::duplex(1 << 16);
        let serving = tokio::spawn(async move {
            let running = server.serve(transport).await.expect("handshake");
            let _ = running.waiting().await;
        });
        let (read, mut writer) = tokio::io::split(client);
        let mut reader = BufReader::new(read).lines();
        let hello =
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}});
        rpc(&mut reader, &mut writer, json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}))
            .await;
        rpc(&mut reader, &mut writer, json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        for (id, uri) in [(2, "sessions://history/main"), (3, "sessions://history/AGENT:Main:main")] {
            let subscribe =
                json!({"jsonrpc": "2.0", "id": id, "method": "resources/subscribe", "params": {"uri": uri}});
            let reply = rpc(&mut reader, &mut writer, subscribe).await.unwrap();
            assert!(reply.get("result").is_some(), "{reply}");
        }
        assert_eq!((hub.watchers(), hub.subscriptions()), (1, 1), "one watcher, one subscription for two forms");

        // The client goes away (stdio EOF): the service ends, and with it what it held.
        drop((reader, writer));
        serving.await.unwrap();
        assert_eq!(hub.subscriptions(), 0, "the caller's slots are given back with the session");
        hub.0.watchers.close();
        // Generous: a hang guard only; a watcher that outlives its session never ends.
        let ended = tokio::time::timeout(std::time::Duration::from_secs(60), hub.0.watchers.wait()).await;
        assert!(ended.is_ok() && hub.watchers() == 0, "the watcher outlived its MCP session");
    }
}
