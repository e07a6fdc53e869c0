//! Runs as A2A tasks, for both bindings: the state mapping, the task object, and the operations
//! (send, get, cancel, watch). A task is one run of the caller's context session (task id = run
//! id); a run that is not the caller's task is answered exactly as one that does not exist.

use std::time::Duration;

use a2a_protocol_types::artifact::Artifact;
use a2a_protocol_types::error::{A2aError, ErrorCode};
use a2a_protocol_types::events::{StreamResponse, TaskStatusUpdateEvent};
use a2a_protocol_types::message::{Message, MessageRole, Part};
use a2a_protocol_types::method::Method;
use a2a_protocol_types::params::MessageSendParams;
use a2a_protocol_types::task::{Task, TaskState, TaskStatus};
use futures::Stream;
use serde_json::json;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::A2a;
use crate::access::ToolError;
use crate::access::caller::Caller;
use crate::engine::Engine;
use crate::engine::a2a::{PeerMessage, TaskView};
use crate::engine::inject::{InjectError, Injected};
use crate::engine::scheduler::Waited;
use crate::keys::AgentId;
use crate::store::{AskDecision, AskKind, RunStatus, iso};

/// Longest a `SendMessage` holds its answer for the task to end or ask (then it answers the task
/// as it is; `GetTask` / `SubscribeToTask` follow it).
const SEND_WAIT: Duration = Duration::from_secs(120);
/// Longest a cancel waits for the run to stop before answering the task as it is.
const CANCEL_WAIT: Duration = Duration::from_secs(15);
/// How long one wait of a watcher lasts before it waits again (the stream's keep-alive is the
/// SSE layer's).
const WATCH_ROUND: Duration = Duration::from_secs(60);
/// When a peer whose runs fill its queue is told to try again.
const QUEUE_FULL_RETRY: Duration = Duration::from_secs(10);
/// Longest message text, in bytes (a spawn's task's).
const MAX_TEXT_BYTES: usize = 64 * 1024;

/// The A2A state of a run: its status, and whether it waits on an ask.
pub(super) fn state_of(status: RunStatus, asking: bool) -> TaskState {
    match status {
        RunStatus::Queued => TaskState::Submitted,
        RunStatus::Running if asking => TaskState::InputRequired,
        RunStatus::Running => TaskState::Working,
        RunStatus::Ok => TaskState::Completed,
        RunStatus::Cancelled => TaskState::Canceled,
        RunStatus::Error | RunStatus::Timeout | RunStatus::Interrupted | RunStatus::BudgetExceeded => TaskState::Failed,
    }
}

/// The task a view is, as A2A shows it.
pub(super) fn task_of(view: &TaskView) -> Task {
    let run = &view.run;
    let state = state_of(run.status, view.ask.is_some());
    let artifacts = (run.status == RunStatus::Ok).then(|| {
        let reply = run.reply.clone().unwrap_or_default();
        vec![Artifact::new("reply", vec![Part::text(reply)])]
    });
    Task {
        id: run.run_id.clone().into(),
        context_id: view.context_id.clone().into(),
        status: status_of(view, state),
        artifacts,
        history: None,
        metadata: Some(json!({"sessionKey": run.session_key.as_str(), "runStatus": run.status.as_str()})),
    }
}

fn status_of(view: &TaskView, state: TaskState) -> TaskStatus {
    let run = &view.run;
    let words = match state {
        TaskState::InputRequired => view.ask.as_ref().map(|ask| {
            let w = crate::sanitize::ask_words(&ask.text, ask.options.as_ref(), ask.details.as_ref());
            let how = match ask.kind {
                AskKind::Approval => "Answer \"allow\" or \"deny <why>\".",
                AskKind::Question => "Answer in words.",
            };
            let details = w.details.map(|d| format!("\nDetails: {d}")).unwrap_or_default();
            format!("{} asks: {}{details}\n{how}", ask.child, w.text)
        }),
        TaskState::Completed => run.reply.clone(),
        TaskState::Failed | TaskState::Canceled => {
            Some(run.error.clone().unwrap_or_else(|| format!("the run ended {}", run.status.as_str())))
        }
        _ => None,
    };
    let message = words.map(|text| {
        let mut parts = vec![Part::text(text)];
        if let Some(ask) = view.ask.as_ref().filter(|_| state == TaskState::InputRequired) {
            parts.push(Part::data(json!({"requestId": ask.id, "kind": ask.kind.as_str(), "options": ask.options})));
        }
        Message::new(format!("{}:{}", run.run_id, state_label(state)), MessageRole::Agent, parts)
            .with_task_id(run.run_id.clone())
            .with_context_id(view.context_id.clone())
    });
    let at = run.ended_at.or(run.started_at).unwrap_or(run.created_at);
    TaskStatus { state, message, timestamp: Some(iso(at)) }
}

fn state_label(state: TaskState) -> &'static str {
    match state {
        TaskState::InputRequired => "input-required",
        TaskState::Completed => "completed",
        TaskState::Failed => "failed",
        TaskState::Canceled => "canceled",
        _ => "status",
    }
}

fn phase(view: &TaskView) -> Phase {
    (state_of(view.run.status, view.ask.is_some()), view.ask.as_ref().map(|a| a.id.clone()))
}

fn internal(e: ToolError) -> A2aError {
    A2aError::internal(e.message)
}

fn not_found(id: &str) -> A2aError {
    A2aError::task_not_found(id)
}

/// The text of a peer's message: its text parts, joined.
fn text_of(message: &Message) -> Result<String, A2aError> {
    if message.role != MessageRole::User {
        return Err(A2aError::invalid_params("message.role must be ROLE_USER"));
    }
    let text = message.texts().collect::<Vec<_>>().join("\n");
    if text.trim().is_empty() {
        return Err(A2aError::new(
            ErrorCode::ContentTypeNotSupported,
            "the message has no text part: this agent takes text (text/plain)",
        ));
    }
    if text.len() > MAX_TEXT_BYTES {
        return Err(A2aError::invalid_params(format!(
            "the message's text is {} bytes; at most {MAX_TEXT_BYTES}",
            text.len()
        )));
    }
    Ok(text)
}

impl A2a {
    fn engine(&self) -> Engine<'_> {
        Engine::new(&self.access, self.runtime.as_ref())
    }

    /// `caller`'s task `id` of `agent`, or TaskNotFound.
    pub(super) fn view(&self, caller: &Caller, agent: &AgentId, id: &str) -> Result<TaskView, A2aError> {
        self.engine().a2a_task(agent, &caller.key, id).map_err(internal)?.ok_or_else(|| not_found(id))
    }

    /// `SubscribeToTask`'s task: one that has not ended.
    pub(super) fn subscribable(&self, caller: &Caller, agent: &AgentId, id: &str) -> Result<TaskView, A2aError> {
        let view = self.view(caller, agent, id)?;
        if view.run.is_finished() {
            return Err(A2aError::unsupported_operation(format!("task {id} has ended: GetTask reads it")));
        }
        Ok(view)
    }

    /// `SendMessage` / `SendStreamingMessage`: a new turn of the context's session, or — with the
    /// `taskId` of a task waiting on an ask — the answer to that ask. Answers the task.
    pub(super) fn send(
        &self,
        caller: &Caller,
        agent: &AgentId,
        params: &MessageSendParams,
    ) -> Result<TaskView, A2aError> {
        let message = &params.message;
        let text = text_of(message)?;
        if let Some(task_id) = &message.task_id {
            return self.answer(caller, agent, &task_id.0, message.context_id.as_ref().map(|c| c.0.as_str()), &text);
        }
        let context_id = match &message.context_id {
            Some(c) if c.0.is_empty() || c.0.len() > 256 => {
                return Err(A2aError::invalid_params("message.contextId must be 1-256 characters"));
            }
            Some(c) => c.0.clone(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        let peer = PeerMessage { caller: &caller.key, context_id: &context_id, message_id: &message.id.0, text: &text };
        let run_id = match self.engine().a2a_start(agent, &peer) {
            Ok(Injected::Queued(id) | Injected::Duplicate(Some(id))) => id,
            Ok(other) => {
                return Err(A2aError::internal(format!("the message was taken but started no task ({other:?})")));
            }
            Err(InjectError::Policy(m)) => return Err(A2aError::permission_denied(m)),
            Err(InjectError::NoRunner(m)) => return Err(A2aError::unsupported_operation(m)),
            Err(InjectError::QueueFull { message, .. }) => {
                return Err(A2aError::rate_limited(message, QUEUE_FULL_RETRY));
            }
            Err(e) => return Err(A2aError::internal(e.to_string())),
        };
        self.view(caller, agent, &run_id)
    }

    /// The peer's message on task `id`: it answers the ask the task waits on.
    fn answer(
        &self,
        caller: &Caller,
        agent: &AgentId,
        id: &str,
        context_id: Option<&str>,
        text: &str,
    ) -> Result<TaskView, A2aError> {
        let view = self.view(caller, agent, id)?;
        if context_id.is_some_and(|c| c != view.context_id) {
            return Err(A2aError::invalid_params(format!("task {id} is not of context {context_id:?}")));
        }
        let Some(ask) = &view.ask else {
            let state = state_of(view.run.status, false);
            return Err(A2aError::unsupported_operation(format!(
                "task {id} is {state:?} and waits for no input; send without taskId (same contextId) to start the next turn"
            )));
        };
        let (decision, words) = match ask.kind {
            AskKind::Question => (AskDecision::Allow, Some(text)),
            AskKind::Approval => approval_answer(text)?,
        };
        self.engine().a2a_answer(&caller.key, ask, decision, words).map_err(internal)?;
        self.view(caller, agent, id)
    }

    /// Waits until the task ends or asks, up to [`SEND_WAIT`], and answers it as it then is.
    pub(super) async fn settled(&self, caller: &Caller, agent: &AgentId, view: TaskView) -> Result<TaskView, A2aError> {
        let Some(rt) = self.runtime.clone() else { return Ok(view) };
        let id = view.run.run_id.clone();
        let check = || -> Result<Option<TaskView>, A2aError> {
            let now = self.view(caller, agent, &id)?;
            let (state, _) = phase(&now);
            Ok((state.is_terminal() || state == TaskState::InputRequired).then_some(now))
        };
        match rt.wait_for(SEND_WAIT, &CancellationToken::new(), check).await? {
            Waited::Finished(now) => Ok(now),
            _ => self.view(caller, agent, &id),
        }
    }

    /// `CancelTask`: stops the run; TaskNotCancelable once it has ended.
    pub(super) async fn cancel(&self, caller: &Caller, agent: &AgentId, id: &str) -> Result<TaskView, A2aError> {
        let view = self.view(caller, agent, id)?;
        if view.run.is_finished() {
            return Err(A2aError::task_not_cancelable(id));
        }
        self.engine().a2a_cancel(id).map_err(internal)?;
        let Some(rt) = self.runtime.clone() else { return self.view(caller, agent, id) };
        let check = || -> Result<Option<TaskView>, A2aError> {
            let now = self.view(caller, agent, id)?;
            Ok(now.run.is_finished().then_some(now))
        };
        match rt.wait_for(CANCEL_WAIT, &CancellationToken::new(), check).await? {
            Waited::Finished(now) => Ok(now),
            _ => self.view(caller, agent, id),
        }
    }

    /// The task's events from now until it ends: the task first, then a status update at each
    /// change of state (or of the ask it waits on), the reply as an artifact before `completed`.
    pub(super) fn watch(
        self,
        caller: Caller,
        agent: AgentId,
        first: TaskView,
    ) -> impl Stream<Item = Result<StreamResponse, A2aError>> + Send + 'static {
        let (id, context_id) = (first.run.run_id.clone(), first.context_id.clone());
        let start = Watch {
            a: self,
            caller,
            agent,
            id,
            context_id,
            pending: Some(first),
            last: None,
            done: false,
            deltas: None,
            typed: false,
        };
        futures::stream::unfold(start, |mut w| async move {
            if w.done {
                return None;
            }
            let now = match w.pending.take() {
                Some(view) if w.last.is_none() => {
                    w.last = Some(phase(&view));
                    w.done = phase(&view).0.is_terminal();
                    return Some((Ok(StreamResponse::Task(task_of(&view))), w));
                }
                Some(view) => view,
                None => match w.next().await {
                    Ok(Step::Typed(text)) => {
                        let chunk = chunk_event(&w.id, &w.context_id, text, w.typed);
                        w.typed = true;
                        return Some((Ok(chunk), w));
                    }
                    Ok(Step::Changed(now)) if now.run.status == RunStatus::Ok => {
                        let now = *now;
                        // The reply whole (replacing what was typed); the final status at the
                        // stream's next turn.
                        let artifact = artifact_event(&now);
                        w.pending = Some(now);
                        return Some((Ok(artifact), w));
                    }
                    Ok(Step::Changed(now)) => *now,
                    Err(e) => {
                        w.done = true;
                        return Some((Err(e), w));
                    }
                },
            };
            w.last = Some(phase(&now));
            w.done = phase(&now).0.is_terminal();
            Some((Ok(status_event(&now)), w))
        })
    }

    /// The task once its phase differs from `last`.
    async fn next_change(
        &self,
        caller: &Caller,
        agent: &AgentId,
        id: &str,
        last: Option<Phase>,
    ) -> Result<TaskView, A2aError> {
        let rt = self.runtime.clone().ok_or_else(|| A2aError::internal("this server runs no runs"))?;
        loop {
            let check = || -> Result<Option<TaskView>, A2aError> {
                let now = self.view(caller, agent, id)?;
                Ok((Some(phase(&now)) != last).then_some(now))
            };
            if let Waited::Finished(now) = rt.wait_for(WATCH_ROUND, &CancellationToken::new(), check).await? {
                return Ok(now);
            }
        }
    }
}

/// A task's phase for a watcher: a change of it is an event.
type Phase = (TaskState, Option<String>);

/// What a watcher tells next.
enum Step {
    /// A piece of the reply as the agent typed it.
    Typed(String),
    /// The task in its next phase.
    Changed(Box<TaskView>),
}

/// One `watch` stream's place.
struct Watch {
    a: A2a,
    caller: Caller,
    agent: AgentId,
    id: String,
    /// A view to emit before reading the store again.
    pending: Option<TaskView>,
    last: Option<Phase>,
    done: bool,
    /// The run's typed text, once it runs on this process (only the owner streams).
    deltas: Option<broadcast::Receiver<String>>,
    /// Whether a piece of the reply was told (the next one appends to it).
    typed: bool,
    /// The task's context, for the pieces of its reply.
    context_id: String,
}

impl Watch {
    /// The next piece of the reply, or the task's next phase, whichever comes first.
    async fn next(&mut self) -> Result<Step, A2aError> {
        let Watch { a, caller, agent, id, last, deltas, .. } = self;
        let changed = |view: TaskView| Step::Changed(Box::new(view));
        loop {
            if deltas.is_none() {
                *deltas = a.runtime.as_ref().and_then(|rt| rt.subscribe(id));
            }
            let change = a.next_change(caller, agent, id, last.clone());
            let Some(rx) = deltas.as_mut() else { return change.await.map(changed) };
            tokio::select! {
                view = change => return view.map(changed),
                typed = rx.recv() => match typed {
                    Ok(text) => return Ok(Step::Typed(text)),
                    // A slow reader misses pieces; the whole reply still comes at the end.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    // The run ended here: only its phase is left to tell.
                    Err(broadcast::error::RecvError::Closed) => {
                        return a.next_change(caller, agent, id, last.clone()).await.map(changed);
                    }
                },
            }
        }
    }
}

/// A status-update event of the task as it now is.
fn status_event(view: &TaskView) -> StreamResponse {
    let task = task_of(view);
    StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
        task_id: task.id,
        context_id: task.context_id,
        status: task.status,
        metadata: None,
    })
}

/// A piece of the reply as it is typed: the first starts the `reply` artifact, the next append.
fn chunk_event(task_id: &str, context_id: &str, text: String, appends: bool) -> StreamResponse {
    StreamResponse::ArtifactUpdate(a2a_protocol_types::events::TaskArtifactUpdateEvent {
        task_id: task_id.into(),
        context_id: context_id.into(),
        artifact: Artifact::new("reply", vec![Part::text(text)]),
        append: Some(appends),
        last_chunk: Some(false),
        metadata: None,
    })
}

fn artifact_event(view: &TaskView) -> StreamResponse {
    let task = task_of(view);
    let artifact = task.artifacts.and_then(|a| a.into_iter().next()).unwrap_or_else(|| Artifact::new("reply", vec![]));
    StreamResponse::ArtifactUpdate(a2a_protocol_types::events::TaskArtifactUpdateEvent {
        task_id: task.id,
        context_id: task.context_id,
        artifact,
        append: Some(false),
        last_chunk: Some(true),
        metadata: None,
    })
}

/// The error for a method this server does not offer.
pub(super) fn not_offered(method: Method) -> A2aError {
    if method.requires_push_capability() {
        return A2aError::push_not_supported(
            "push notifications are not offered: SubscribeToTask or GetTask follow a task",
        );
    }
    A2aError::unsupported_operation(format!("{} is not offered by this agent", method.wire_name()))
}

/// An approval's answer in words: `allow [words]` or `deny [why]` (also approve/yes, reject/no).
pub(super) fn approval_answer(text: &str) -> Result<(AskDecision, Option<&str>), A2aError> {
    let text = text.trim();
    let (verb, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let rest = Some(rest.trim()).filter(|r| !r.is_empty());
    match verb.to_ascii_lowercase().trim_end_matches(['.', '!', ',']) {
        "allow" | "approve" | "yes" => Ok((AskDecision::Allow, rest)),
        "deny" | "reject" | "no" => Ok((AskDecision::Deny, rest)),
        _ => Err(A2aError::invalid_params("the task waits on an approval: answer \"allow [words]\" or \"deny [why]\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AskRow, RunMode, RunRow};

    fn view(status: RunStatus, ask: Option<AskRow>) -> TaskView {
        let mut run = RunRow::for_test("r1", RunMode::Inject, status);
        run.reply = Some("done".into());
        run.error = Some("the agent failed".into());
        TaskView { run, context_id: "c1".into(), ask }
    }

    fn ask() -> AskRow {
        AskRow { id: "ask-1".into(), ..AskRow::for_test(AskKind::Approval, "May I deploy?") }
    }

    #[test]
    fn every_run_status_maps_to_one_task_state() {
        let cases = [
            (RunStatus::Queued, false, TaskState::Submitted),
            (RunStatus::Running, false, TaskState::Working),
            (RunStatus::Running, true, TaskState::InputRequired),
            (RunStatus::Ok, false, TaskState::Completed),
            (RunStatus::Cancelled, false, TaskState::Canceled),
            (RunStatus::Error, false, TaskState::Failed),
            (RunStatus::Timeout, false, TaskState::Failed),
            (RunStatus::Interrupted, false, TaskState::Failed),
            (RunStatus::BudgetExceeded, false, TaskState::Failed),
        ];
        for (status, asking, state) in cases {
            assert_eq!(state_of(status, asking), state, "{status:?} asking={asking}");
        }
    }

    #[test]
    fn a_task_carries_the_reply_the_failure_or_the_question_in_its_status() {
        let done = task_of(&view(RunStatus::Ok, None));
        assert_eq!(done.status.message.as_ref().and_then(|m| m.text()), Some("done"));
        assert_eq!(done.artifacts.as_ref().map(Vec::len), Some(1));
        assert_eq!((done.id.0.as_str(), done.context_id.0.as_str()), ("r1", "c1"));
        let failed = task_of(&view(RunStatus::Error, None));
        assert_eq!(failed.status.message.as_ref().and_then(|m| m.text()), Some("the agent failed"));
        assert!(failed.artifacts.is_none());
        let asking = task_of(&view(RunStatus::Running, Some(ask())));
        assert_eq!(asking.status.state, TaskState::InputRequired);
        let message = asking.status.message.unwrap();
        let words = message.text().unwrap();
        assert!(words.contains("agent:main:subagent:x asks: May I deploy?") && words.contains("\"allow\""), "{words}");
        let wire = serde_json::to_value(&message.parts).unwrap();
        assert_eq!(wire[1]["data"]["requestId"], "ask-1", "{wire}");
        let working = task_of(&view(RunStatus::Running, None));
        assert!(working.status.message.is_none());
    }

    #[test]
    fn an_approval_is_answered_allow_or_deny_and_anything_else_is_refused() {
        assert_eq!(approval_answer("allow").unwrap(), (AskDecision::Allow, None));
        assert_eq!(approval_answer(" Approve. go on ").unwrap(), (AskDecision::Allow, Some("go on")));
        assert_eq!(approval_answer("deny not on main").unwrap(), (AskDecision::Deny, Some("not on main")));
        assert_eq!(approval_answer("NO").unwrap(), (AskDecision::Deny, None));
        for text in ["maybe", "", "allowed", "please allow"] {
            let e = approval_answer(text).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidParams, "{text}");
        }
    }

    #[test]
    fn methods_not_offered_say_which_kind_of_refusal() {
        assert_eq!(not_offered(Method::ListTasks).code, ErrorCode::UnsupportedOperation);
        assert_eq!(not_offered(Method::CreateTaskPushNotificationConfig).code, ErrorCode::PushNotificationNotSupported);
        assert_eq!(not_offered(Method::GetTaskPushNotificationConfig).code, ErrorCode::PushNotificationNotSupported);
    }
}
