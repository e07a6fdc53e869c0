//! Thread-bound sub-agents (`sessions_spawn {thread: true}`): before the spawn's transaction the
//! requester's channel deliverer opens a thread (`kind: "thread_open"` on stdin, `{"threadId"}`
//! on stdout); the child is bound to it in the transaction, its replies go there, and with
//! `mode: "session"` later messages a bridge posts in that thread are its next turns. A spawn
//! refused after its thread opened closes it again (`kind: "thread_close"`, best effort).

use std::time::Duration;

use serde_json::{Value, json};

use super::deliver::{Ran, address, run_deliverer};
use crate::access::ToolError;
use crate::access::caller::Caller;
use crate::store::{BindingMode, ThreadBinding, now_ms};

/// How long a deliverer may take to open a thread.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest thread id a deliverer may answer.
const MAX_THREAD_ID: usize = 256;

impl super::Engine<'_> {
    /// Opens a thread on the requester's channel for a child spawned with `thread: true`.
    pub async fn open_thread(
        &self,
        caller: &Caller,
        mode: BindingMode,
        label: Option<&str>,
        task: &str,
    ) -> Result<ThreadBinding, ToolError> {
        let rt = self.runtime("sessions_spawn")?;
        let row = self.access.own_row(caller)?;
        let channel = super::channel_of_row(&caller.key, row.as_ref(), rt);
        let refused = |what: String| {
            ToolError::forbidden(format!(
                "thread=true is unavailable: {what}; nothing was created. Leave thread out to have the result announced to you"
            ))
        };
        let Some(settings) = rt.config.thread_settings(&channel) else {
            return Err(refused(format!(
                "your channel {channel:?} has no thread-capable deliverer (channels.{channel}.deliver with channels.{channel}.threads: true, or channels.{channel}.threadBindings.enabled: true)"
            )));
        };
        let (to, parent_thread) = address(&caller.key, row.as_ref());
        let Some(to) = to else {
            return Err(refused(format!("your session has no address on channel {channel:?} to open a thread at")));
        };
        let argv = rt.config.channels[&channel].deliver.clone().unwrap_or_default();
        let excerpt: String = task.chars().take(200).collect();
        let payload = json!({"kind": "thread_open", "channel": channel, "to": to, "threadId": parent_thread,
            "accountId": row.as_ref().and_then(|r| r.last_account_id.clone()), "label": label, "task": excerpt,
            "mode": mode.as_str(), "requesterSessionKey": caller.key.as_str()});
        let thread_id = match run_deliverer(&argv, &payload, OPEN_TIMEOUT).await {
            Ok(stdout) => thread_id_of(&stdout),
            Err(Ran::NotRun(e)) => Err(e),
            Err(Ran::Exited(code, tail)) => Err(format!("it exited with {code:?}: {}", tail.trim())),
        }
        .map_err(|e| {
            ToolError::error(format!(
                "the deliverer of channel {channel:?} did not open a thread: {e}; nothing was created"
            ))
        })?;
        Ok(ThreadBinding {
            channel,
            to,
            thread_id,
            mode,
            idle_ms: settings.idle_ms,
            max_age_ms: settings.max_age_ms,
            created_at: now_ms(),
        })
    }

    /// Closes a thread whose spawn was refused after it opened (best effort: logged, not failed).
    pub async fn close_thread(&self, binding: &ThreadBinding, why: &str) {
        let Ok(rt) = self.runtime("sessions_spawn") else { return };
        let argv = rt.config.channels.get(&binding.channel).and_then(|c| c.deliver.clone()).unwrap_or_default();
        let payload = json!({"kind": "thread_close", "channel": binding.channel, "to": binding.to,
            "threadId": binding.thread_id, "text": why});
        if run_deliverer(&argv, &payload, OPEN_TIMEOUT).await.is_err() {
            tracing::warn!(channel = %binding.channel, thread = %binding.thread_id, "closing an unused thread failed");
        }
    }
}

/// The thread id a deliverer printed: `{"threadId": "<non-empty id>"}`.
fn thread_id_of(stdout: &[u8]) -> Result<String, String> {
    let shown = String::from_utf8_lossy(stdout).chars().take(200).collect::<String>();
    let value: Value =
        serde_json::from_slice(stdout).map_err(|_| format!("it printed {shown:?}, not {{\"threadId\": \"<id>\"}}"))?;
    match value.get("threadId") {
        Some(Value::String(id))
            if !id.trim().is_empty() && id.len() <= MAX_THREAD_ID && !id.chars().any(char::is_control) =>
        {
            Ok(id.clone())
        }
        Some(Value::Number(n)) => Ok(n.to_string()),
        _ => Err(format!(
            "it printed {shown:?}, without a usable threadId (a non-empty string of at most {MAX_THREAD_ID} bytes)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::thread_id_of;

    #[test]
    fn a_thread_id_must_be_a_usable_string_or_number() {
        assert_eq!(thread_id_of(br#"{"threadId": "t-1"}"#), Ok("t-1".into()));
        assert_eq!(thread_id_of(br#"{"threadId": 1234567890123}"#), Ok("1234567890123".into()));
        for bad in [&b"garbage"[..], br#"{"threadId": ""}"#, br#"{"id": "x"}"#, br#"{"threadId": "a\nb"}"#, b""] {
            assert!(thread_id_of(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
