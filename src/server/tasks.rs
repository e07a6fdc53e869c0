//! MCP Tasks (SEP-2663) over the runs table. A task *is* a run: the task id is the run id and the
//! task's state is the run's row, so a task outlives the process that created it and every server
//! on the state dir answers for it. `sessions_spawn`, and `sessions_send` when it asks to wait,
//! become tasks when the client declared the extension. Only the session that requested the run
//! sees or cancels it: for anyone else its id is unknown, exactly like an id that never existed.

use std::sync::Arc;

use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask, GetTaskResult, InputResponses, JsonObject, Task,
    TaskPayload, TaskStatus,
};
use serde_json::{Map, Value};

use crate::access::Access;
use crate::access::caller::Caller;
use crate::engine::scheduler::Scheduler;
use crate::policy::ToolName;
use crate::store::{RunMode, RunRow, RunStatus, iso};
use crate::tools::{self, sessions_send, sessions_spawn};

/// What a client is asked to wait between two `tasks/get`.
const POLL_INTERVAL_MS: u64 = 1000;

/// Whether a call runs as a task: a spawn always; a send when it asks to wait (a fire-and-forget
/// send, or one whose timeout is malformed, takes the ordinary path and gets its ordinary answer).
pub fn runs_as_task(tool: &str, args: Option<&Map<String, Value>>) -> Option<ToolName> {
    let tool = ToolName::parse(tool)?;
    let timeout = args.and_then(|a| a.get("timeoutSeconds").or_else(|| a.get("timeout_seconds")));
    match tool {
        ToolName::SessionsSpawn => Some(tool),
        ToolName::SessionsSend if timeout.is_none_or(|t| t.as_f64().is_some_and(|s| s > 0.0)) => Some(tool),
        _ => None,
    }
}

/// The arguments of a call that runs as a task: the run's end is awaited through `tasks/get`, so
/// a send must not also wait in the call.
pub fn without_wait(tool: ToolName, args: Option<Map<String, Value>>) -> Option<Map<String, Value>> {
    if tool != ToolName::SessionsSend {
        return args;
    }
    let mut args = args.unwrap_or_default();
    args.remove("timeout_seconds");
    args.insert("timeoutSeconds".into(), 0.into());
    Some(args)
}

/// The answer to a call that runs as a task: the task when the tool started a run, else the
/// tool's own result (an error, or a send into an external session's inbox: no run to wait for).
pub fn answer(access: &Access, result: CallToolResult) -> CallToolResponse {
    let run_id = match (&result.is_error, &result.structured_content) {
        (Some(true), _) | (_, None) => None,
        (_, Some(out)) => out.get("runId").and_then(Value::as_str),
    };
    match run_id.and_then(|id| access.run(id).ok().flatten()) {
        Some(run) => CallToolResponse::Task(CreateTaskResult::new(task_of(&run))),
        None => CallToolResponse::Complete(result),
    }
}

/// `tasks/get`: the run's state; once it ended, the tool's final result. A run that waits on a
/// question or approval the caller may answer is `input_required`, with those asks as elicitation
/// requests (answered by `tasks/update`), for a client that can show them (`elicits`).
pub fn get(access: &Access, caller: &Caller, task_id: &str, elicits: bool) -> Result<GetTaskResult, McpError> {
    let run = owned_run(access, caller, task_id)?;
    let asks = match run.status {
        RunStatus::Running if elicits => {
            access.open_asks_of_run(caller, &run.run_id).map_err(|e| internal(e.message))?
        }
        _ => Vec::new(),
    };
    if !asks.is_empty() {
        let requests = super::elicit::input_requests(access, caller, &asks);
        let payload = TaskPayload::InputRequired { input_requests: requests };
        return Ok(GetTaskResult::new(DetailedTask::new(task_of(&run), payload)));
    }
    let payload = match run.status {
        RunStatus::Queued | RunStatus::Running => TaskPayload::Working,
        RunStatus::Cancelled => TaskPayload::Cancelled,
        _ => TaskPayload::Completed { result: final_result(access, caller, &run) },
    };
    Ok(GetTaskResult::new(DetailedTask::new(task_of(&run), payload)))
}

/// `tasks/cancel`: stops the run (a queued run never starts; a running agent gets `cancel`).
/// Cancelling an ended task is an empty acknowledgement, as for a running one.
pub fn cancel(
    runtime: Option<&Arc<Scheduler>>,
    access: &Access,
    caller: &Caller,
    task_id: &str,
) -> Result<(), McpError> {
    let run = owned_run(access, caller, task_id)?;
    let Some(rt) = runtime else {
        return Err(McpError::internal_error("this server was started without the runtime; it cannot stop runs", None));
    };
    rt.cancel_run(&run.run_id).map_err(|e| McpError::internal_error(e.to_string(), None))?;
    Ok(())
}

/// `tasks/update`: answers the task's outstanding input requests (its run's open asks); a key
/// that is not one of them is refused and nothing is answered.
pub fn update(
    runtime: Option<&Arc<Scheduler>>,
    access: &Access,
    caller: &Caller,
    task_id: &str,
    responses: &InputResponses,
    client: Option<&str>,
) -> Result<(), McpError> {
    let run = owned_run(access, caller, task_id)?;
    let open = access.open_asks_of_run(caller, &run.run_id).map_err(|e| internal(e.message))?;
    if let Some(stray) = responses.keys().find(|id| !open.iter().any(|a| &&a.id == id)) {
        let outstanding: Vec<&str> = open.iter().map(|a| a.id.as_str()).collect();
        return Err(McpError::invalid_params(
            format!(
                "inputResponses.{stray}: task {task_id:?} has no outstanding input request with that key; outstanding: {}",
                if outstanding.is_empty() { "none".to_string() } else { outstanding.join(", ") }
            ),
            None,
        ));
    }
    super::elicit::apply_responses(access, runtime, caller, responses, client, None)
}

fn internal(e: impl std::fmt::Display) -> McpError {
    McpError::internal_error(e.to_string(), None)
}

/// The run behind `task_id` if the caller requested it; the same error for every other id.
fn owned_run(access: &Access, caller: &Caller, task_id: &str) -> Result<RunRow, McpError> {
    let run = access.run(task_id).map_err(|e| McpError::internal_error(e.to_string(), None))?;
    match run {
        Some(run)
            if run.requester_key.as_ref() == Some(&caller.key)
                && matches!(run.mode, RunMode::Send | RunMode::Spawn) =>
        {
            Ok(run)
        }
        _ => Err(McpError::invalid_params(
            format!("unknown task {task_id:?}: this session has no task with that id"),
            None,
        )),
    }
}

fn task_of(run: &RunRow) -> Task {
    let status = match run.status {
        RunStatus::Queued | RunStatus::Running => TaskStatus::Working,
        RunStatus::Cancelled => TaskStatus::Cancelled,
        _ => TaskStatus::Completed,
    };
    let updated = run.ended_at.or(run.started_at).unwrap_or(run.created_at);
    Task::new(run.run_id.clone(), status, iso(run.created_at), iso(updated))
        .with_status_message(format!("run {}", run.status))
        .with_poll_interval_ms(POLL_INTERVAL_MS)
}

/// What the tool would have answered had the call waited for the run's end.
fn final_result(access: &Access, caller: &Caller, run: &RunRow) -> JsonObject {
    let budget = access.config().tools.sessions.max_result_bytes;
    let result = match run.mode {
        RunMode::Spawn => tools::final_result(sessions_spawn::task_result(access, run, budget), budget),
        _ => tools::final_result(sessions_send::task_result(access, caller, run), budget),
    };
    match serde_json::to_value(result) {
        Ok(Value::Object(o)) => o,
        _ => JsonObject::new(),
    }
}
