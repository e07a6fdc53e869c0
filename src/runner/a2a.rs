//! One turn of a remote agent (`runner.kind: "a2a"`, docs/A2A.md) as an A2A v1.0 task:
//! the card is read from its configured URL, the turn's input is sent as a message in the
//! session's remote context (streamed where the card says so, else sent and the task followed
//! by `GetTask` polling), `input-required` / `auth-required` become the turn's input requests
//! (answered by a message into the same task), our cancel and deadline send `CancelTask`, and
//! the task's artifacts, final message and terminal state make the [`Outcome`].
//!
//! A run that already started its task (a restart of the server) only follows it again
//! (`SubscribeToTask`, else `GetTask`): a message that may have started a task is never sent
//! twice. Calls go only to the card's own origin, over TLS unless loopback (checked when the
//! config loads), each with a bounded timeout.
//!
//! What a peer says is untrusted input: the text kept of it (artifacts, status messages, a direct
//! reply) and the text streamed from it are bounded by the agent's `runner.maxStdoutBytes`, as a
//! local agent's stdout is. The card is cached per card URL and token ([`cards`]).

use std::time::Duration;

mod cards;

use a2a_protocol_client::auth::{AuthInterceptor, InMemoryCredentialsStore, SessionId};
use a2a_protocol_client::discovery::CardFetchOptions;
use a2a_protocol_client::streaming::EventStream;
use a2a_protocol_client::{A2aClient, ClientBuilder, ClientError, CredentialsStore};
use a2a_protocol_types::{
    AgentCard, Artifact, Message, MessageSendParams, PartContent, SendMessageConfiguration, SendMessageResponse,
    StreamResponse, Task, TaskState, TaskStatus,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Decision, Hooks, InputAnswer, InputKind, InputRequest, Outcome, RunStatus, Steer};
use crate::config::remote::RemoteAgent;
use crate::store::NewMessage;

/// Connecting to the peer, and reading the card: past this the peer is unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// One unary call (card, send, get, cancel).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a task is polled when the peer does not stream.
const POLL_EVERY: Duration = Duration::from_millis(500);
/// A broken stream (or poll) is followed again this many times before the run gives up (counted
/// afresh after each answered question).
const FOLLOW_ATTEMPTS: u32 = 5;
/// The longest task or context id taken from a peer.
const MAX_ID_BYTES: usize = 1024;
/// Room for a response's JSON beyond its text (ids, states, metadata).
const WIRE_OVERHEAD: usize = 64 * 1024;

/// One remote turn.
pub struct RemoteTurn<'a> {
    pub agent: &'a RemoteAgent,
    pub run_id: &'a str,
    /// The turn's new message.
    pub text: String,
    /// The remote context of the session, from its earlier turns.
    pub context_id: Option<String>,
    /// The task this run already started (after a restart): followed, never sent again.
    pub started_task: Option<String>,
    pub timeout: Duration,
    pub cancel_grace: Duration,
    /// The most text of the peer's kept and streamed (`runner.maxStdoutBytes`), each.
    pub max_output_bytes: usize,
    /// Whether a cancel is this server stopping: a started task is then left running for the
    /// next owner to follow (the outcome is `Interrupted`), not cancelled.
    pub hand_over: &'a (dyn Fn() -> bool + Send + Sync),
}

/// Why a remote turn stopped before its task ended.
enum Stop {
    Cancelled,
    Timeout,
    Failed(String),
}

/// What the task has said so far.
#[derive(Default)]
struct Seen {
    task_id: Option<String>,
    context_id: Option<String>,
    state: Option<TaskState>,
    /// The last status message's text (the question of an interrupted task, the final word).
    status_text: Option<String>,
    /// The peer marked its question an approval (a data part `{"kind": "approval"}`, as our own
    /// A2A endpoint does): answered `allow …` / `deny …`, the words such a peer takes.
    asks_approval: bool,
    /// The artifacts in arrival order, by id (an update appends to or replaces its artifact).
    artifacts: Vec<(String, String)>,
    /// A reply the peer gave as a message, with no task.
    direct_reply: Option<String>,
    usage: Option<Value>,
    reported: crate::policy::usage::UsageSoFar,
    /// The text handed on to the run's stream so far, in bytes.
    streamed: usize,
    /// What the peer broke (its output past `max_output_bytes`, an id past [`MAX_ID_BYTES`]): the
    /// run's error; nothing more is taken.
    broken_rule: Option<String>,
}

/// Executes one remote turn; `on_task` is told the remote task id once it is known (the runtime
/// stores it, so a restart follows the task instead of losing it).
pub async fn execute(
    turn: RemoteTurn<'_>,
    cancel: CancellationToken,
    hooks: &Hooks<'_>,
    on_task: &(dyn Fn(&str) + Send + Sync),
    steers: Option<tokio::sync::mpsc::UnboundedReceiver<Steer>>,
) -> Outcome {
    if let Some(mut rx) = steers {
        // A2A has no way into a working turn but the task's own input requests.
        super::stdin::refuse(&mut rx);
    }
    let deadline = tokio::time::Instant::now() + turn.timeout;
    let token = match token_of(turn.agent) {
        Ok(t) => t,
        Err(e) => return Outcome::failed(e),
    };
    let mut seen =
        Seen { task_id: turn.started_task.clone(), context_id: turn.context_id.clone(), ..Default::default() };
    let mut fresh = false;
    let (client, stop) = loop {
        let (client, card, reused) = match connect(turn.agent, token.as_deref(), turn.max_output_bytes).await {
            Ok(c) => c,
            Err(e) => return Outcome::failed(e),
        };
        let mut following = Following {
            turn: &turn,
            client: &client,
            card: &card,
            hooks,
            on_task,
            seen: &mut seen,
            deadline,
            endpoint_gone: false,
        };
        let stop = following.run(&cancel).await;
        if following.endpoint_gone && reused && !fresh {
            // The endpoint an earlier run's card named is gone before anything was taken: the
            // peer may have moved. Its card is read afresh, once.
            tracing::info!(run = turn.run_id, card = %turn.agent.card_url, "the cached card's endpoint is gone; reading the card again");
            cards::forget(&turn.agent.card_url, token.as_deref());
            fresh = true;
            continue;
        }
        break (client, stop);
    };
    if matches!(stop, Some(Stop::Cancelled)) && seen.task_id.is_some() && (turn.hand_over)() {
        let mut left = outcome(seen, stop, &turn);
        left.status = RunStatus::Interrupted;
        return left;
    }
    if stop.is_some() && !seen.state.is_some_and(TaskState::is_terminal) {
        // Cancelled, out of time, or given up on: the peer must not go on working for nobody.
        cancel_task(&client, &seen, turn.cancel_grace).await;
    }
    outcome(seen, stop, &turn)
}

/// The bearer token of the agent's `tokenEnv`, read at each run (a rotated token needs no restart).
fn token_of(agent: &RemoteAgent) -> Result<Option<String>, String> {
    let Some(name) = agent.token_env.as_deref() else { return Ok(None) };
    match std::env::var(name) {
        Ok(t) if !t.is_empty() => Ok(Some(t)),
        _ => Err(format!("the remote agent's token variable {name} (runner.tokenEnv) is not set on the server")),
    }
}

/// Reads the card (cached, [`cards`]) and builds a client for it with the bearer token, bound to
/// the card's origin and to the output bound; also whether the card may be an earlier run's.
async fn connect(
    agent: &RemoteAgent,
    token: Option<&str>,
    max_output_bytes: usize,
) -> Result<(A2aClient, AgentCard, bool), String> {
    let mut options = CardFetchOptions::default().with_timeout(CALL_TIMEOUT);
    if let Some(t) = token {
        options = options.with_header("authorization", format!("Bearer {t}"));
    }
    let url = agent.card_url.as_str();
    let (mut card, reused) = cards::card(&agent.card_url, token, options).await?;
    own_origin_only(&mut card, &agent.card_url)?;
    if let Some(skill) = agent.skill.as_deref().filter(|s| !card.skills.iter().any(|k| k.id == *s)) {
        let offered: Vec<&str> = card.skills.iter().map(|k| k.id.as_str()).collect();
        return Err(format!(
            "the remote agent at {url} has no skill {skill:?} (runner.skill); its card offers: {}",
            offered.join(", ")
        ));
    }
    // The wire may carry the bound's text JSON-escaped; past that, the text is over it anyway.
    let wire_bound = max_output_bytes.saturating_mul(2).saturating_add(WIRE_OVERHEAD);
    let mut builder = ClientBuilder::from_card(&card)
        .map_err(|e| format!("the remote agent's card at {url} names no endpoint this server can call: {e}"))?
        .with_connection_timeout(CONNECT_TIMEOUT)
        .with_timeout(CALL_TIMEOUT)
        .with_stream_connect_timeout(CONNECT_TIMEOUT)
        .with_max_response_size(wire_bound)
        .with_max_event_size(wire_bound)
        .require_https_credentials();
    if let Some(t) = token {
        let store = std::sync::Arc::new(InMemoryCredentialsStore::new());
        let session = SessionId::new("runner");
        store.set(session.clone(), "bearer", t.to_string());
        builder = builder.with_interceptor(AuthInterceptor::new(store, session));
    }
    let client = builder.build().map_err(|e| format!("cannot call the remote agent at {url}: {e}"))?;
    Ok((client, card, reused))
}

/// Keeps only the card's endpoints on the card URL's own origin: a card must not send our
/// messages and token to a host nobody configured.
fn own_origin_only(card: &mut AgentCard, card_url: &url::Url) -> Result<(), String> {
    let origin = card_url.origin();
    let same = |u: &str| url::Url::parse(u).is_ok_and(|u| u.origin() == origin);
    card.supported_interfaces.retain(|i| same(&i.url));
    if card.supported_interfaces.is_empty() {
        return Err(format!(
            "the remote agent's card at {card_url} names no endpoint on {} (only the configured card's origin is called)",
            origin.ascii_serialization()
        ));
    }
    Ok(())
}

/// Following one task to its end.
struct Following<'a, 'h> {
    turn: &'a RemoteTurn<'a>,
    client: &'a A2aClient,
    card: &'a AgentCard,
    hooks: &'a Hooks<'h>,
    on_task: &'a (dyn Fn(&str) + Send + Sync),
    seen: &'a mut Seen,
    deadline: tokio::time::Instant,
    /// The first call failed as if the card's endpoint were gone (404, refused connection, another
    /// binding): nothing was started, and a fresher card may name where the peer went.
    endpoint_gone: bool,
}

/// Where the next events of the task come from.
enum Source {
    Stream(Box<EventStream>),
    /// The peer answered a unary send: what it returned, then (if unfinished) a follow.
    Response(Box<SendMessageResponse>),
}

impl Following<'_, '_> {
    /// Sends (or, after a restart, follows) and reads until the task ends; `None` when it did.
    async fn run(&mut self, cancel: &CancellationToken) -> Option<Stop> {
        let first = match self.seen.task_id.clone() {
            Some(task) => self.follow(&task).await,
            None => self.send(self.turn.text.clone()).await,
        };
        let mut source = match first {
            Ok(s) => s,
            Err(e) => return Some(Stop::Failed(e)),
        };
        let mut broken = 0;
        loop {
            let read = tokio::select! {
                _ = cancel.cancelled() => return Some(Stop::Cancelled),
                _ = tokio::time::sleep_until(self.deadline) => return Some(Stop::Timeout),
                read = self.read(source) => read,
            };
            let next = match read {
                Read::Ended => return None,
                Read::BrokeRule(why) => return Some(Stop::Failed(why)),
                Read::Interrupted => {
                    broken = 0;
                    // A person reading is not the run's time: the deadline moves by the wait.
                    let asked = tokio::time::Instant::now();
                    let answer = self.ask(cancel).await;
                    self.deadline += asked.elapsed();
                    match answer {
                        Ok(answer) => self.send(answer).await,
                        Err(stop) => return Some(stop),
                    }
                }
                Read::Broken(why) => {
                    broken += 1;
                    let Some(task) = self.seen.task_id.clone().filter(|_| broken <= FOLLOW_ATTEMPTS) else {
                        return Some(Stop::Failed(why));
                    };
                    tracing::warn!(
                        run = self.turn.run_id,
                        task,
                        "the remote task's stream broke ({why}); following it again"
                    );
                    tokio::time::sleep(POLL_EVERY * broken).await;
                    self.follow(&task).await
                }
            };
            source = match next {
                Ok(s) => s,
                Err(e) => {
                    // Only the first call's failure may be retried with a fresher card: by now the
                    // peer has a task of ours, which a new card would not make any less started.
                    self.endpoint_gone = false;
                    return Some(Stop::Failed(e));
                }
            };
        }
    }

    /// Sends `text` into the session's context (and into the task, when one waits for input).
    /// Never retried by us: the client retries only what cannot have started a task.
    async fn send(&mut self, text: String) -> Result<Source, String> {
        let mut message = Message::user_text(uuid::Uuid::new_v4().to_string(), text);
        message.context_id = self.seen.context_id.clone().map(Into::into);
        message.task_id = self.seen.task_id.clone().filter(|_| self.is_interrupted()).map(Into::into);
        let metadata = self.turn.agent.skill.as_ref().map(|s| json!({ "skillId": s }));
        let streaming = self.card.capabilities.streaming == Some(true);
        // Unary: the task comes back at once and is polled, so no call waits on the work itself
        // (a send that outlived its call timeout would leave a task nobody follows).
        let configuration = SendMessageConfiguration {
            accepted_output_modes: Vec::new(),
            return_immediately: Some(!streaming),
            ..Default::default()
        };
        let params = MessageSendParams { tenant: None, message, configuration: Some(configuration), metadata };
        let sent = match streaming {
            true => self.client.stream_message(params).await.map(|s| Source::Stream(Box::new(s))),
            false => self.client.send_message(params).await.map(|r| Source::Response(Box::new(r))),
        };
        sent.map_err(|e| {
            self.endpoint_gone = endpoint_gone(&e);
            format!("the remote agent did not take the message: {e}")
        })
    }

    /// Follows the task this run started: subscribed when the peer streams, else polled.
    async fn follow(&mut self, task: &str) -> Result<Source, String> {
        let streaming = self.card.capabilities.streaming == Some(true);
        if streaming && let Ok(stream) = self.client.subscribe_to_task(task).await {
            return Ok(Source::Stream(Box::new(stream)));
        }
        // One GetTask stands for a poll: the loop reads it and follows on while it is not done.
        let task = self.client.get_task(a2a_protocol_types::TaskQueryParams::new(task)).await.map_err(|e| {
            self.endpoint_gone = endpoint_gone(&e);
            format!("cannot read the remote task {task}: {e}")
        })?;
        Ok(Source::Response(Box::new(SendMessageResponse::Task(task))))
    }

    fn is_interrupted(&self) -> bool {
        self.seen.state.is_some_and(TaskState::is_interrupted)
    }

    /// Reads `source` until the task ends, waits for input, or the source breaks.
    async fn read(&mut self, source: Source) -> Read {
        match source {
            Source::Stream(mut stream) => {
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(event) => self.take(event),
                        Err(e) if too_large(&e) => self.cut(),
                        Err(e) => return Read::Broken(e.to_string()),
                    }
                    if let Some(read) = self.settled() {
                        return read;
                    }
                }
                self.settled().unwrap_or_else(|| Read::Broken("the stream ended before the task did".into()))
            }
            Source::Response(response) => {
                match *response {
                    SendMessageResponse::Message(m) => self.take(StreamResponse::Message(m)),
                    SendMessageResponse::Task(t) => self.take(StreamResponse::Task(t)),
                    // A later protocol's kind of answer: nothing this version can read.
                    _ => {}
                }
                match self.settled() {
                    Some(read) => read,
                    None => self.poll().await,
                }
            }
        }
    }

    /// Polls `GetTask` until the task ends or waits for input.
    async fn poll(&mut self) -> Read {
        let Some(task) = self.seen.task_id.clone() else {
            return Read::Broken("the remote agent answered with neither a task nor a message".into());
        };
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            match self.client.get_task(a2a_protocol_types::TaskQueryParams::new(&task)).await {
                Ok(t) => self.take(StreamResponse::Task(t)),
                Err(e) if too_large(&e) => self.cut(),
                Err(e) => return Read::Broken(format!("cannot read the remote task {task}: {e}")),
            }
            if let Some(read) = self.settled() {
                return read;
            }
        }
    }

    /// Whether the task is over (or the peer replied without one), or waits for input.
    fn settled(&self) -> Option<Read> {
        if let Some(why) = &self.seen.broken_rule {
            return Some(Read::BrokeRule(why.clone()));
        }
        if self.seen.direct_reply.is_some() {
            return Some(Read::Ended);
        }
        match self.seen.state {
            Some(s) if s.is_terminal() => Some(Read::Ended),
            Some(s) if s.is_interrupted() => Some(Read::Interrupted),
            _ => None,
        }
    }

    /// Takes one event of the task; past the output bound, none.
    fn take(&mut self, event: StreamResponse) {
        if self.seen.broken_rule.is_some() {
            return;
        }
        self.take_event(event);
        if self.seen.kept_bytes() > self.turn.max_output_bytes {
            self.cut();
        }
    }

    /// Hands `text` on to the run's stream, unless that takes the streamed text past the bound.
    fn stream(&mut self, text: &str) {
        self.seen.streamed = self.seen.streamed.saturating_add(text.len());
        match self.seen.streamed > self.turn.max_output_bytes {
            true => self.cut(),
            false => (self.hooks.on_delta)(text),
        }
    }

    /// The peer's output went past the bound: the run ends saying so, as a local run's stdout does.
    fn cut(&mut self) {
        let why =
            format!("protocol: the remote agent's output exceeded maxStdoutBytes ({})", self.turn.max_output_bytes);
        self.seen.broken_rule.get_or_insert(why);
    }

    fn take_event(&mut self, event: StreamResponse) {
        match event {
            StreamResponse::Task(task) => self.take_task(task),
            StreamResponse::StatusUpdate(update) => {
                self.know_task(update.task_id.as_ref(), update.context_id.as_ref());
                self.take_usage(update.metadata.as_ref());
                self.take_status(update.status);
            }
            StreamResponse::ArtifactUpdate(update) => {
                self.know_task(update.task_id.as_ref(), update.context_id.as_ref());
                let text = artifact_text(&update.artifact);
                self.stream(&text);
                self.seen.take_artifact(update.artifact.id.as_ref(), text, update.append == Some(true));
            }
            StreamResponse::Message(message) => {
                if let Some(c) = &message.context_id {
                    self.know_task("", c.as_ref());
                }
                let text = message.texts().collect::<Vec<_>>().join("\n");
                self.seen.direct_reply = Some(text);
            }
            // A later protocol's kind of event: nothing this version can read.
            _ => {}
        }
    }

    fn take_task(&mut self, task: Task) {
        self.know_task(task.id.as_ref(), task.context_id.as_ref());
        self.take_usage(task.metadata.as_ref());
        for artifact in task.artifacts.iter().flatten() {
            self.seen.take_artifact(artifact.id.as_ref(), artifact_text(artifact), false);
        }
        self.take_status(task.status);
    }

    fn take_status(&mut self, status: TaskStatus) {
        let text = status.message.as_ref().map(|m| m.texts().collect::<Vec<_>>().join("\n")).filter(|t| !t.is_empty());
        if let (Some(t), TaskState::Working) = (&text, status.state) {
            self.stream(t);
        }
        if text.is_some() || status.state.is_terminal() {
            self.seen.status_text = text;
            self.seen.asks_approval = status.message.as_ref().is_some_and(marked_approval);
        }
        self.seen.state = Some(status.state);
    }

    /// The task's and context's ids, the task's told to the runtime the first time it is seen.
    fn know_task(&mut self, task: &str, context: &str) {
        if let Some(why) = overlong_id(task, context) {
            self.seen.broken_rule.get_or_insert(why);
            return;
        }
        if !context.is_empty() {
            self.seen.context_id = Some(context.to_string());
        }
        if self.seen.task_id.as_deref() != Some(task) && !task.is_empty() {
            self.seen.task_id = Some(task.to_string());
            (self.on_task)(task);
        }
    }

    /// Usage the peer reports in the task's metadata (`usage`), checked like any agent's report.
    fn take_usage(&mut self, metadata: Option<&Value>) {
        let Some(report) = metadata.and_then(|m| m.get("usage")).and_then(usage_report) else { return };
        if let Some(usage) = self.seen.reported.take(&report) {
            if let Some(on_usage) = self.hooks.on_usage {
                on_usage(&usage);
            }
            self.seen.usage = Some(usage);
        }
    }

    /// Puts the interrupted task's question to the run's asker and waits for the answer: the text
    /// to send into the task.
    async fn ask(&mut self, cancel: &CancellationToken) -> Result<String, Stop> {
        let Some(asks) = self.hooks.on_input else {
            return Err(Stop::Failed("the remote agent asked for input, and this run cannot ask".into()));
        };
        let auth = self.seen.state == Some(TaskState::AuthRequired);
        let asked = match (auth, self.seen.asks_approval) {
            (true, _) => Asked::Authorization,
            (false, true) => Asked::Approval,
            (false, false) => Asked::Question,
        };
        let question = self.seen.status_text.clone().unwrap_or_else(|| "the remote agent asks for input".into());
        let text = match auth {
            true => format!("the remote agent asks for authorization: {question}"),
            false => question,
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        let id = format!("{}-{}", self.seen.task_id.as_deref().unwrap_or("task"), uuid::Uuid::new_v4().simple());
        let kind = if asked == Asked::Question { InputKind::Question } else { InputKind::Approval };
        let request = InputRequest { id, kind, text, options: None, details: self.details(), answer };
        if asks.send(request).is_err() {
            return Err(Stop::Failed("the remote agent asked for input, and nobody can answer it".into()));
        }
        let waiting = |on: bool| self.hooks.on_waiting.inspect(|w| w(on));
        waiting(true);
        let answer = tokio::select! {
            _ = cancel.cancelled() => Err(Stop::Cancelled),
            a = answered => Ok(a.unwrap_or(InputAnswer { decision: Decision::Deny, text: Some("the request was dropped unanswered".into()) })),
        };
        waiting(false);
        answer.map(|a| answer_text(asked, a))
    }

    fn details(&self) -> Option<Value> {
        let task = self.seen.task_id.as_deref()?;
        Some(json!({ "a2a": { "taskId": task, "state": self.seen.state.map(|s| s.to_string()) } }))
    }
}

/// What reading a source came to.
enum Read {
    Ended,
    Interrupted,
    Broken(String),
    /// The peer broke a rule of ours (its output past the bound, an overlong id): the error.
    BrokeRule(String),
}

impl Seen {
    fn take_artifact(&mut self, id: &str, text: String, append: bool) {
        match self.artifacts.iter_mut().find(|(a, _)| a == id) {
            Some((_, kept)) if append => kept.push_str(&text),
            Some((_, kept)) => *kept = text,
            None => self.artifacts.push((id.to_string(), text)),
        }
    }

    /// The bytes of the peer's text kept: artifacts (with their ids), status message, direct reply.
    fn kept_bytes(&self) -> usize {
        let artifacts: usize = self.artifacts.iter().map(|(id, text)| id.len() + text.len()).sum();
        let said = |t: &Option<String>| t.as_ref().map_or(0, String::len);
        artifacts + said(&self.status_text) + said(&self.direct_reply)
    }

    /// The turn's reply: the artifacts' text, then the final status message (or the direct reply).
    fn reply(&self) -> Option<String> {
        let mut parts: Vec<&str> = self.artifacts.iter().map(|(_, t)| t.as_str()).filter(|t| !t.is_empty()).collect();
        if let Some(last) = self.direct_reply.as_deref().or(self.status_text.as_deref())
            && !parts.contains(&last)
        {
            parts.push(last);
        }
        (!parts.is_empty()).then(|| parts.join("\n\n"))
    }
}

/// The error for a task or context id past [`MAX_ID_BYTES`]: ids are stored with the run and the
/// session, and sent back, so they must stay small.
fn overlong_id(task: &str, context: &str) -> Option<String> {
    let (what, _) = [("task", task), ("context", context)].into_iter().find(|(_, id)| id.len() > MAX_ID_BYTES)?;
    Some(format!("protocol: the remote agent's {what} id is longer than {MAX_ID_BYTES} bytes"))
}

/// Whether a call failed as if the endpoint the card names were gone: not there (404, 405, 410),
/// refusing connections, or speaking another binding. Such a call started nothing.
fn endpoint_gone(e: &ClientError) -> bool {
    match e {
        ClientError::UnexpectedStatus { status, .. } => matches!(status, 404 | 405 | 410),
        // hyper-util's connect failure: "client error (Connect)".
        ClientError::HttpClient(what) => what.contains("(Connect)"),
        ClientError::ProtocolBindingMismatch(_) => true,
        _ => false,
    }
}

/// Whether the client refused a response or stream event over its size caps (which the output
/// bound sets): the crate says so only in the error's words.
fn too_large(e: &ClientError) -> bool {
    matches!(e, ClientError::Transport(what) if what.contains("too large"))
}

/// An artifact's text parts, concatenated: a peer that streamed the artifact in `append` pieces
/// keeps them as its parts, and a `GetTask` of it must read as the stream did.
fn artifact_text(artifact: &Artifact) -> String {
    artifact.texts().collect()
}

/// A usage object from a peer, in our field names or the snake_case ones, as a usage report.
fn usage_report(usage: &Value) -> Option<Value> {
    let obj = usage.as_object()?;
    let mut report = serde_json::Map::new();
    for (ours, theirs) in [
        ("inputTokens", "input_tokens"),
        ("outputTokens", "output_tokens"),
        ("cacheReadTokens", "cache_read_tokens"),
        ("cacheWriteTokens", "cache_write_tokens"),
        ("costUsd", "cost_usd"),
    ] {
        if let Some(v) = obj.get(ours).or_else(|| obj.get(theirs)) {
            report.insert(ours.into(), whole(v));
        }
    }
    (!report.is_empty()).then_some(Value::Object(report))
}

/// A count that came as a float with nothing after the point (metadata travels as a protobuf
/// `Struct`, whose numbers are all doubles) as the whole number it is; anything else as it was.
fn whole(v: &Value) -> Value {
    match v.as_f64() {
        Some(f) if v.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => Value::from(f as i64),
        _ => v.clone(),
    }
}

/// What an interrupted task asks, which decides the words of its answer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Asked {
    /// `auth-required`: an approval, answered `yes` or `declined[: why]`.
    Authorization,
    /// An `input-required` the peer marked an approval: answered `allow [words]` or `deny [why]`.
    Approval,
    /// An `input-required` in words: answered with the words, or `declined[: why]`.
    Question,
}

/// Whether a status message carries the approval mark: a data part whose `kind` is `approval`.
fn marked_approval(message: &a2a_protocol_types::Message) -> bool {
    message.parts.iter().any(
        |p| matches!(&p.content, PartContent::Data(d) if d.get("kind").and_then(Value::as_str) == Some("approval")),
    )
}

/// The message an answer sends into the task: the answer's text, or the refusal.
fn answer_text(asked: Asked, answer: InputAnswer) -> String {
    let text = answer.text.filter(|t| !t.is_empty());
    match (asked, answer.decision, text) {
        (Asked::Approval, Decision::Allow, t) => t.map_or("allow".into(), |t| format!("allow {t}")),
        (Asked::Approval, Decision::Deny, t) => t.map_or("deny".into(), |t| format!("deny {t}")),
        (_, Decision::Allow, Some(t)) => t,
        (_, Decision::Allow, None) => "yes".into(),
        (_, Decision::Deny, Some(t)) => format!("declined: {t}"),
        (_, Decision::Deny, None) => "declined".into(),
    }
}

/// Asks the peer to cancel the task (bounded by the cancel grace); the run ends cancelled
/// whatever it answers.
async fn cancel_task(client: &A2aClient, seen: &Seen, grace: Duration) {
    let Some(task) = seen.task_id.clone() else { return };
    match tokio::time::timeout(grace.max(Duration::from_secs(1)), client.cancel_task(task.clone())).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(task, error = %e, "the remote agent did not cancel its task"),
        Err(_) => tracing::warn!(task, "the remote agent did not answer the cancel in time"),
    }
}

/// Our status and error for the task's terminal state (None: the task is not over).
pub fn status_of(state: TaskState, said: Option<&str>) -> Option<(RunStatus, Option<String>)> {
    let why = |what: &str| Some(said.map_or_else(|| what.to_string(), |s| format!("{what}: {s}")));
    match state {
        TaskState::Completed => Some((RunStatus::Ok, None)),
        TaskState::Failed => Some((RunStatus::Error, why("the remote agent failed the task"))),
        TaskState::Rejected => Some((RunStatus::Error, why("the remote agent rejected the task"))),
        TaskState::Canceled => Some((RunStatus::Cancelled, why("the remote agent cancelled the task"))),
        _ => None,
    }
}

/// The outcome of what was seen; a reply past the output bound is cut at it (the error says so).
fn outcome(seen: Seen, stop: Option<Stop>, turn: &RemoteTurn<'_>) -> Outcome {
    let reply = seen.reply().map(|mut text| {
        text.truncate(text.floor_char_boundary(turn.max_output_bytes));
        text
    });
    let (status, error) = match stop {
        Some(Stop::Cancelled) => (RunStatus::Cancelled, Some("cancelled".to_string())),
        Some(Stop::Timeout) => (RunStatus::Timeout, Some(format!("timed out after {}s", turn.timeout.as_secs()))),
        Some(Stop::Failed(e)) => (RunStatus::Error, Some(e)),
        None if seen.direct_reply.is_some() => (RunStatus::Ok, None),
        None => seen
            .state
            .and_then(|s| status_of(s, seen.status_text.as_deref()))
            .unwrap_or((RunStatus::Error, Some("the remote task ended without a final state".into()))),
    };
    let messages = reply
        .iter()
        .map(|text| NewMessage {
            role: "assistant".into(),
            content: Value::String(text.clone()),
            run_id: Some(turn.run_id.to_string()),
            ..Default::default()
        })
        .collect();
    Outcome {
        status,
        reply,
        messages,
        usage: seen.usage,
        model: None,
        stop_reason: seen.state.map(|s| s.to_string()),
        external_session_id: seen.context_id,
        error,
        exit_status: None,
        stderr_tail: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls `f` with a turn of `timeout` seconds whose output bound is `max` bytes.
    fn with_turn<T>(timeout: u64, max: usize, f: impl FnOnce(&RemoteTurn<'_>) -> T) -> T {
        fn never() -> bool {
            false
        }
        let agent =
            RemoteAgent { card_url: url::Url::parse("http://127.0.0.1:9/card").unwrap(), token_env: None, skill: None };
        let turn = RemoteTurn {
            agent: &agent,
            run_id: "r",
            text: String::new(),
            context_id: None,
            started_task: None,
            timeout: Duration::from_secs(timeout),
            cancel_grace: Duration::from_secs(1),
            max_output_bytes: max,
            hand_over: &never,
        };
        f(&turn)
    }

    #[test]
    fn the_peers_text_is_bounded_and_a_reply_past_the_bound_is_cut_at_it() {
        let mut seen = Seen::default();
        seen.take_artifact("a", "é".repeat(40), false);
        seen.status_text = Some("done".into());
        assert_eq!(seen.kept_bytes(), 1 + 80 + 4);
        seen.state = Some(TaskState::Completed);
        let out = with_turn(1, 41, |t| outcome(seen, Some(Stop::Failed("over".into())), t));
        assert_eq!(out.reply.as_deref(), Some("é".repeat(20).as_str()), "cut at a character's edge");
        assert_eq!((out.status, out.error.as_deref()), (RunStatus::Error, Some("over")));
        let gone = |status| ClientError::UnexpectedStatus { status, body: String::new(), retry_after: None };
        assert!(endpoint_gone(&gone(404)) && !endpoint_gone(&gone(500)));
        assert!(endpoint_gone(&ClientError::HttpClient("client error (Connect)".into())));
        assert!(too_large(&ClientError::Transport("response body too large: exceeds 9 byte limit".into())));
        assert_eq!(overlong_id(&"t".repeat(MAX_ID_BYTES), ""), None);
        let e = overlong_id("t", &"c".repeat(MAX_ID_BYTES + 1));
        assert_eq!(e.as_deref(), Some("protocol: the remote agent's context id is longer than 1024 bytes"));
    }

    #[test]
    fn terminal_states_map_onto_our_statuses() {
        assert_eq!(status_of(TaskState::Completed, Some("done")), Some((RunStatus::Ok, None)));
        let (s, e) = status_of(TaskState::Failed, Some("disk full")).unwrap();
        assert_eq!((s, e.as_deref()), (RunStatus::Error, Some("the remote agent failed the task: disk full")));
        let (s, e) = status_of(TaskState::Rejected, None).unwrap();
        assert_eq!((s, e.as_deref()), (RunStatus::Error, Some("the remote agent rejected the task")));
        assert_eq!(status_of(TaskState::Canceled, None).map(|(s, _)| s), Some(RunStatus::Cancelled));
        for open in [TaskState::Submitted, TaskState::Working, TaskState::InputRequired, TaskState::AuthRequired] {
            assert_eq!(status_of(open, None), None, "{open}");
        }
    }

    #[test]
    fn artifacts_and_the_final_message_make_the_reply() {
        let mut seen = Seen::default();
        seen.take_artifact("a", "part one".into(), false);
        seen.take_artifact("a", ", more".into(), true);
        seen.take_artifact("b", "second".into(), false);
        seen.status_text = Some("all done".into());
        seen.state = Some(TaskState::Completed);
        let out = with_turn(1, 100, |t| outcome(seen, None, t));
        assert_eq!(out.reply.as_deref(), Some("part one, more\n\nsecond\n\nall done"));
        assert_eq!(out.status, RunStatus::Ok);
        assert_eq!(out.messages.len(), 1);
    }

    #[test]
    fn a_task_that_never_ended_is_an_error_and_a_stop_wins() {
        let seen = Seen { state: Some(TaskState::Working), ..Default::default() };
        let out = with_turn(1, 100, |t| outcome(seen, None, t));
        assert_eq!(
            (out.status, out.error.as_deref()),
            (RunStatus::Error, Some("the remote task ended without a final state"))
        );
        let seen = Seen { state: Some(TaskState::Completed), ..Default::default() };
        assert_eq!(with_turn(3, 100, |t| outcome(seen, Some(Stop::Timeout), t)).status, RunStatus::Timeout);
    }

    #[test]
    fn peer_usage_is_read_in_either_spelling_and_answers_become_messages() {
        let report =
            usage_report(&json!({"input_tokens": 10, "outputTokens": 4.0, "cost_usd": 0.5, "other": 1})).unwrap();
        assert_eq!(report, json!({"inputTokens": 10, "outputTokens": 4, "costUsd": 0.5}));
        assert_eq!(usage_report(&json!({"nothing": 1})), None);
        let allow = |t: Option<&str>| InputAnswer { decision: Decision::Allow, text: t.map(String::from) };
        let deny = |t: Option<&str>| InputAnswer { decision: Decision::Deny, text: t.map(String::from) };
        assert_eq!(answer_text(Asked::Question, allow(Some("blue"))), "blue");
        assert_eq!(answer_text(Asked::Authorization, allow(None)), "yes");
        assert_eq!(answer_text(Asked::Question, deny(Some("no"))), "declined: no");
        assert_eq!(answer_text(Asked::Approval, allow(None)), "allow");
        assert_eq!(answer_text(Asked::Approval, allow(Some("once"))), "allow once");
        assert_eq!(answer_text(Asked::Approval, deny(Some("not today"))), "deny not today");
    }

    #[test]
    fn a_status_with_a_data_part_of_kind_approval_marks_an_approval() {
        let status = |data: Value| -> Message {
            serde_json::from_value(json!({"messageId": "m", "role": "ROLE_AGENT",
                "parts": [{"text": "main asks: May I deploy?"}, {"data": data}]}))
            .unwrap()
        };
        assert!(marked_approval(&status(json!({"requestId": "r", "kind": "approval", "options": null}))));
        assert!(!marked_approval(&status(json!({"requestId": "r", "kind": "question"}))));
        assert!(!marked_approval(&status(json!(["approval"]))));
    }

    #[test]
    fn only_the_card_urls_origin_is_called() {
        let mut card: AgentCard = serde_json::from_value(json!({
            "name": "r", "description": "d", "version": "1", "capabilities": {},
            "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"], "skills": [],
            "supportedInterfaces": [
                {"url": "http://127.0.0.1:9/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                {"url": "http://evil.example/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ]
        }))
        .unwrap();
        own_origin_only(&mut card, &url::Url::parse("http://127.0.0.1:9/.well-known/agent-card.json").unwrap())
            .unwrap();
        assert_eq!(card.supported_interfaces.len(), 1);
        let e = own_origin_only(&mut card, &url::Url::parse("https://other.example/card").unwrap()).unwrap_err();
        assert!(e.contains("names no endpoint on https://other.example"), "{e}");
    }
}
