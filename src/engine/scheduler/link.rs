//! The owner's changes as events, across the processes of one state dir. Beside MCP, the owner's
//! run socket serves two internal endpoints (`server::owner_link`), open only to holders of the
//! owner's key, which each new owner writes to `<stateDir>/run/owner.key` (0600, in the 0700 state
//! dir: whoever may read it may read the store too):
//!
//! - `POST /owner/wake`: another process committed work (a queued run, a cancel, an inbox
//!   append); the owner looks at its queue at once instead of at its next tick, and tells its
//!   followers.
//! - `GET /owner/events`: one JSON line per change until ownership ends — `"runs"` after each wake
//!   of the owner (a run queued, claimed, ended or cancelled), `"written"` after each change of its
//!   store. Changes made while a line is on its way fold into the next line.
//!
//! Every process that does not own the runtime follows the owner: it keeps an events stream open
//! and turns each line into the wakes an in-process change gives (waiters read their run rows
//! again, transcript subscriptions read the store again), and it posts a wake after each of its own
//! [`Scheduler::wake`]s. The events are hints only: a waiter always decides on the row it reads,
//! and the store poll stays underneath for when the owner is gone (a stream that ends wakes every
//! waiter, which reads its row, and the scheduler, which tries to take the runtime over).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tokio_util::bytes::BytesMut;
use tokio_util::codec::{Decoder, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use super::Scheduler;

/// Where the owner's wakes are posted.
pub const WAKE_PATH: &str = "/owner/wake";
/// Where the owner's events stream.
pub const EVENTS_PATH: &str = "/owner/events";
/// How soon a follower tries the owner again after its stream ended or could not be opened; the
/// pause doubles up to [`RETRY_MAX`] while no owner answers.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// The longest events line read (the longest event is a few bytes).
const MAX_LINE: usize = 1024;
/// How often the owner looks whether it stopped owning (and should follow the new owner).
const OWNER_RECHECK: Duration = Duration::from_millis(200);

/// What changed at the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerEvent {
    /// The owner was woken: a run was queued, claimed, ended or cancelled.
    Runs,
    /// The owner's store changed: a transcript may have grown.
    Written,
}

impl OwnerEvent {
    /// The event as one line of the stream.
    pub fn line(self) -> Bytes {
        let json = serde_json::to_string(&self).expect("a unit variant serializes");
        Bytes::from(format!("{json}\n"))
    }
}

/// The secret that admits a process of this state dir to the owner's internal endpoints, and its
/// digest (what an offered key is compared with).
#[derive(Clone)]
pub struct OwnerKey {
    secret: String,
    digest: String,
}

impl OwnerKey {
    /// A new key (the owner writes it with [`OwnerKey::publish`]).
    pub(super) fn generate() -> OwnerKey {
        OwnerKey::from_secret(format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple()))
    }

    fn from_secret(secret: String) -> OwnerKey {
        OwnerKey { digest: crate::store::sha256_hex(&secret), secret }
    }

    /// `<stateDir>/run/owner.key`.
    fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("run").join("owner.key")
    }

    /// A new key, written (0600, replaced in one rename) for the followers to read.
    pub(super) fn publish(state_dir: &Path) -> std::io::Result<OwnerKey> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let key = OwnerKey::generate();
        let path = OwnerKey::path(state_dir);
        let dir = path.parent().expect("the key lives in run/");
        crate::privacy::create_private_dir(dir)?;
        let staged = dir.join(format!("owner.key.{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&staged)?;
        file.write_all(key.secret.as_bytes())?;
        std::fs::rename(&staged, &path)?;
        Ok(key)
    }

    /// The key the owner published, if any.
    fn read(state_dir: &Path) -> Result<OwnerKey, LinkError> {
        let text = std::fs::read_to_string(OwnerKey::path(state_dir)).map_err(LinkError::NoKey)?;
        Ok(OwnerKey::from_secret(text.trim().to_string()))
    }

    /// Whether an `Authorization` header carries this key (compared as digests, so the time
    /// taken says nothing of the key).
    pub fn admits(&self, authorization: Option<&header::HeaderValue>) -> bool {
        let offered = authorization.and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        offered.is_some_and(|k| crate::store::sha256_hex(k.trim()) == self.digest)
    }
}

/// Why a follower could not reach the owner (it then relies on the store until it can).
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("no owner key to read: {0}")]
    NoKey(std::io::Error),
    #[error("cannot connect to the run socket: {0}")]
    Connect(std::io::Error),
    #[error("HTTP on the run socket: {0}")]
    Http(#[from] hyper::Error),
    #[error("the owner answered {0}")]
    Refused(StatusCode),
    #[error("a bad events line: {0}")]
    Line(#[from] LinesCodecError),
}

/// The owner's events for one follower, until `until` fires (ownership ended).
pub fn events(rt: &Scheduler, until: CancellationToken) -> impl Stream<Item = OwnerEvent> + Send + 'static {
    let state = (rt.woken.subscribe(), rt.store.changes(), until);
    futures::stream::unfold(state, |(mut runs, mut written, until)| async move {
        let event = tokio::select! {
            biased;
            _ = until.cancelled() => return None,
            Ok(()) = runs.changed() => OwnerEvent::Runs,
            Ok(()) = written.changed() => OwnerEvent::Written,
            else => return None,
        };
        Some((event, (runs, written, until)))
    })
}

/// One HTTP/1.1 connection to the owner's socket, with the key it was opened with.
struct OwnerConnection {
    key: OwnerKey,
    sender: SendRequest<Full<Bytes>>,
}

impl OwnerConnection {
    async fn open(rt: &Scheduler) -> Result<OwnerConnection, LinkError> {
        let key = OwnerKey::read(&rt.state_dir)?;
        let stream = tokio::net::UnixStream::connect(rt.socket_path()).await.map_err(LinkError::Connect)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(OwnerConnection { key, sender })
    }

    /// Sends one request; the response when the owner accepted it.
    async fn send(&mut self, method: Method, path: &str) -> Result<hyper::Response<hyper::body::Incoming>, LinkError> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "localhost")
            .header(header::AUTHORIZATION, format!("Bearer {}", self.key.secret))
            .body(Full::default())
            .expect("a request of constant parts");
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        match response.status() {
            s if s.is_success() => Ok(response),
            s => Err(LinkError::Refused(s)),
        }
    }

    async fn wake(&mut self) -> Result<(), LinkError> {
        // Read to the end, so that the connection can carry the next wake.
        self.send(Method::POST, WAKE_PATH).await?.into_body().collect().await?;
        Ok(())
    }
}

/// Posts a wake to the owner after each wake of this process while it does not own the runtime.
/// `woken` was taken before the runtime started, so that no wake is lost to a late start.
pub(super) async fn forward_wakes(rt: Arc<Scheduler>, mut woken: watch::Receiver<u64>) {
    let mut kept: Option<OwnerConnection> = None;
    while woken.changed().await.is_ok() {
        if rt.is_owner() {
            kept = None;
            continue;
        }
        if let Err(e) = wake_owner(&rt, &mut kept).await {
            tracing::debug!(error = %e, "could not wake the owner; it sees the queue at its next look");
        }
    }
}

async fn wake_owner(rt: &Scheduler, kept: &mut Option<OwnerConnection>) -> Result<(), LinkError> {
    if let Some(connection) = kept.as_mut()
        && connection.wake().await.is_ok()
    {
        return Ok(());
    }
    // No connection yet, or the kept one went with its owner: a new one, with the key as it is now.
    let mut connection = OwnerConnection::open(rt).await?;
    let woke = connection.wake().await;
    *kept = woke.is_ok().then_some(connection);
    woke
}

/// Follows the owner while this process does not own the runtime: keeps its events stream open
/// and hears each event as this process's own change.
pub(super) async fn follow(rt: Arc<Scheduler>) {
    let mut retry = RETRY_MIN;
    loop {
        if rt.is_owner() {
            tokio::time::sleep(OWNER_RECHECK).await;
            continue;
        }
        match stream_events(&rt).await {
            Ok(()) => retry = RETRY_MIN,
            Err(e) => tracing::debug!(error = %e, "not following the owner's events; the store is watched instead"),
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(RETRY_MAX);
    }
}

/// Reads the owner's events until its stream ends. Once the stream is open, and again when it
/// ends, everything is looked at anew: a change may have come while no stream was open.
async fn stream_events(rt: &Scheduler) -> Result<(), LinkError> {
    let mut connection = OwnerConnection::open(rt).await?;
    let mut body = connection.send(Method::GET, EVENTS_PATH).await?.into_body();
    heard_everything(rt);
    let (mut lines, mut buffer) = (LinesCodec::new_with_max_length(MAX_LINE), BytesMut::new());
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else { continue };
            buffer.extend_from_slice(&data);
            while let Some(line) = lines.decode(&mut buffer)? {
                match serde_json::from_str(&line) {
                    Ok(event) => heard(rt, event),
                    Err(_) => tracing::debug!(%line, "an owner event this version does not know"),
                }
            }
        }
        Ok::<(), LinkError>(())
    };
    let ended = read.await;
    heard_everything(rt);
    ended
}

/// An owner's event, heard as the same change in this process.
fn heard(rt: &Scheduler, event: OwnerEvent) {
    match event {
        OwnerEvent::Runs => rt.changed.notify_waiters(),
        OwnerEvent::Written => rt.store.announce_change(),
    }
}

fn heard_everything(rt: &Scheduler) {
    heard(rt, OwnerEvent::Runs);
    heard(rt, OwnerEvent::Written);
}
