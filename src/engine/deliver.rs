//! Channel delivery through deliverers (docs/BEHAVIOUR.md, Deliveries): a command per channel
//! (`channels.<name>.deliver`, an argv array) gets the delivery as JSON on stdin; exit 0 =
//! delivered, 75 = retry (backoff 1 s doubling to 60 s, until a 30-minute deadline, then
//! `expired`), anything else = failed with the stderr tail. No deliverer → `undeliverable`, kept.
//! The built-in `webchat` channel is the session itself: its transcript already holds the text.

use std::time::Duration;

use serde_json::{Value, json};

use crate::engine::scheduler::Scheduler;
use crate::keys::SessionKey;
use crate::store::{DeliveryKind, DeliveryMode, DeliveryStatus, NewDelivery, RunRow, SessionRow, StoreError, now_ms};

const DELIVER_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_RETRY: i32 = 75;

/// Records a delivery that is already decided (skipped, delivered, undeliverable), once per run
/// and kind; no global lock (`Tx::add_delivery` locks the run's row for its check).
pub fn record(
    rt: &Scheduler,
    run: &RunRow,
    kind: DeliveryKind,
    channel: &str,
    status: DeliveryStatus,
    why: Option<&str>,
    mode: Option<DeliveryMode>,
) -> Result<(), StoreError> {
    rt.store.write_row_locked(|tx| -> Result<(), StoreError> {
        tx.add_delivery(&NewDelivery {
            run_id: &run.run_id,
            kind,
            mode: mode.unwrap_or(DeliveryMode::Channel),
            status,
            target_key: run.session_key.as_str(),
            channel: Some(channel),
            last_error: why,
        })?;
        Ok(())
    })
}

/// Where a key's channel delivers: `to` and `threadId` from the key, else the delivery context
/// (the route of the session's last inbound message).
pub(super) fn address(key: &SessionKey, row: Option<&SessionRow>) -> (Option<String>, Option<String>) {
    let parts: Vec<&str> = key.rest().split(':').collect();
    let in_key = parts.windows(2).find(|w| w[0] == "thread" || w[0] == "topic").map(|w| w[1].to_string());
    let thread = in_key.or_else(|| row.and_then(|r| r.last_thread_id.clone()));
    if parts.len() >= 3 && matches!(parts[1], "group" | "channel") {
        let kind = if matches!(parts[0], "discord" | "slack") { "channel" } else { parts[1] };
        return (Some(format!("{kind}:{}", parts[2])), thread);
    }
    let dc_to = row.and_then(|r| r.delivery_context.as_ref()).and_then(|d| d.get("to")).and_then(Value::as_str);
    (dc_to.map(String::from).or_else(|| row.and_then(|r| r.last_to.clone())), thread)
}

/// Delivers an announce reply to the target's channel.
pub fn channel_delivery(
    rt: &Scheduler,
    run: &RunRow,
    row: Option<&SessionRow>,
    channel: &str,
    text: &str,
    kind: DeliveryKind,
) -> Result<(), StoreError> {
    let deliverer = rt.config.channels.get(channel).and_then(|c| c.deliver.clone()).filter(|a| !a.is_empty());
    if deliverer.is_none() {
        if matches!(channel, "internal" | "unknown") {
            let why = "no channel to deliver to (the session has no external channel)";
            return record(rt, run, kind, channel, DeliveryStatus::Skipped, Some(why), None);
        }
        if channel == "webchat" {
            return record(rt, run, kind, channel, DeliveryStatus::Delivered, None, Some(DeliveryMode::Inbox));
        }
        let why = format!("no deliverer for channel {channel:?} (channels.{channel}.deliver)");
        return record(rt, run, kind, channel, DeliveryStatus::Undeliverable, Some(&why), None);
    }
    let (to, thread_id) = address(&run.session_key, row);
    let account = row.and_then(|r| r.last_account_id.clone());
    let payload = json!({
        "kind": kind.as_str(), "channel": channel, "to": to, "accountId": account, "threadId": thread_id,
        "text": text, "sessionKey": run.session_key.as_str(), "runId": run.run_id, "chainId": run.chain_id,
        "idempotencyKey": format!("{}:{}", run.run_id, kind.as_str()),
    });
    rt.store.queue_channel_delivery(&run.run_id, kind, run.session_key.as_str(), channel, &payload)?;
    rt.wake();
    Ok(())
}

/// Attempts every channel delivery that is due (the owner calls this from its loop).
pub async fn deliver_due(rt: &Scheduler) {
    let due = match rt.store.claim_due_deliveries(8) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "reading due deliveries failed");
            return;
        }
    };
    for d in due {
        let argv = rt.config.channels.get(&d.channel).and_then(|c| c.deliver.clone()).unwrap_or_default();
        let (status, error, next) = match attempt(&argv, &d.payload).await {
            Ok(()) => (DeliveryStatus::Delivered, None, None),
            Err(Attempt::Retry(e)) => {
                let backoff = 1000i64.saturating_mul(1 << d.attempts.clamp(0, 6)).min(60_000);
                if now_ms() + backoff > d.deadline_at {
                    (DeliveryStatus::Expired, Some(format!("gave up at the deadline; last error: {e}")), None)
                } else {
                    (DeliveryStatus::Queued, Some(e), Some(now_ms() + backoff))
                }
            }
            Err(Attempt::Failed(e)) => (DeliveryStatus::Failed, Some(e), None),
        };
        if let Err(e) = rt.store.delivery_attempted(d.id, status, error.as_deref(), next) {
            tracing::error!(error = %e, "recording a delivery attempt failed");
        }
        let final_failure = matches!(status, DeliveryStatus::Failed | DeliveryStatus::Expired);
        if final_failure && d.payload["kind"] == DeliveryKind::Ask.as_str() {
            super::ask_chat::undelivered(rt, &d.payload, error.as_deref().unwrap_or("it failed"));
        }
    }
}

enum Attempt {
    Retry(String),
    Failed(String),
}

/// Runs the deliverer once. The text is data on stdin, never interpolated into argv.
async fn attempt(argv: &[String], payload: &Value) -> Result<(), Attempt> {
    match run_deliverer(argv, payload, DELIVER_TIMEOUT).await {
        Err(Ran::NotRun(e)) => Err(Attempt::Retry(e)),
        Err(Ran::Exited(Some(EXIT_RETRY), tail)) => {
            Err(Attempt::Retry(format!("the deliverer asked to retry: {}", tail.trim())))
        }
        Err(Ran::Exited(code, tail)) => {
            Err(Attempt::Failed(format!("the deliverer exited with {code:?}: {}", tail.trim())))
        }
        Ok(_) => Ok(()),
    }
}

/// How a deliverer run went wrong: it did not run (or not to the end), or exited non-zero with
/// this stderr tail.
pub(super) enum Ran {
    NotRun(String),
    Exited(Option<i32>, String),
}

/// Runs a deliverer with `payload` on stdin and returns its stdout when it exits 0.
pub(super) async fn run_deliverer(argv: &[String], payload: &Value, timeout: Duration) -> Result<Vec<u8>, Ran> {
    use tokio::io::AsyncWriteExt;
    let Some((program, args)) = argv.split_first() else {
        return Err(Ran::NotRun("no deliverer configured".into()));
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // Registered, so the server never takes it for an orphan of a run (it may leave our session).
    let (mut child, _started) = crate::runner::orphans::spawn(&mut cmd)
        .map_err(|e| Ran::NotRun(format!("cannot start the deliverer {program:?}: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(payload.to_string().as_bytes()).await;
    }
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Err(_) => Err(Ran::NotRun(format!("the deliverer timed out after {} s", timeout.as_secs()))),
        Ok(Err(e)) => Err(Ran::NotRun(format!("the deliverer failed: {e}"))),
        Ok(Ok(out)) if out.status.code() == Some(0) => Ok(out.stdout),
        Ok(Ok(out)) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: String = stderr.chars().rev().take(500).collect::<String>().chars().rev().collect();
            Err(Ran::Exited(out.status.code(), tail))
        }
    }
}

/// Takes a run's steps and attempts its deliveries until none is left on its way, up to
/// `timeout`: for a short-lived owner (`inject`) that must not exit with a reply undelivered.
pub async fn settle_run(rt: &Scheduler, run_id: &str, timeout: Duration) -> Result<(), StoreError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        crate::engine::catch_up(rt, 0);
        deliver_due(rt).await;
        if rt.store.run_settled(run_id)? || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl super::Engine<'_> {
    /// Queues a failed or expired channel delivery again (the dashboard's retry); the deliverer
    /// attempts it at once.
    pub fn retry_delivery(&self, id: i64, by: &str) -> Result<crate::store::LedgerAct, crate::access::ToolError> {
        let rt = self.runtime("retry")?;
        let act = rt.store.retry_delivery(id, by)?;
        rt.wake();
        Ok(act)
    }

    /// Closes a failed, expired or undeliverable delivery for good (the dashboard's dismiss).
    pub fn dismiss_delivery(&self, id: i64, by: &str) -> Result<crate::store::LedgerAct, crate::access::ToolError> {
        Ok(self.runtime("dismiss")?.store.dismiss_delivery(id, by)?)
    }
}
