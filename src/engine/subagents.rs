//! What the `subagents` tool asks of the engine: wait for children to finish, cancel a subtree.
//! Both act on rows the façade resolved among the caller's descendants (`Access::subagent`).
//!
//! A wait is event-driven (the scheduler's wakes, the owner's events in a follower) and reads only
//! the store, so any number of waits run side by side and a wait that a client abandons loses
//! nothing: the outcome stays in the announce's ledger row until a wait or a read consumes it.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ask::{Host, Pending};
use super::scheduler::Waited;
use super::{Engine, TurnResult, spawn, take_steps};
use crate::access::caller::Caller;
use crate::access::{Child, RunStatus, ToolError};
use crate::keys::SessionKey;
use crate::policy::Answerer;
use crate::store::SessionRow;

/// When a wait over several children returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// As soon as one of them finished.
    Any,
    /// Once all of them finished.
    All,
}

/// What a wait saw when it returned.
#[derive(Debug)]
pub struct WaitOutcome {
    pub finished: Vec<Child>,
    pub unfinished: Vec<Child>,
    /// Questions and approvals from the caller's tree put to the caller, with who may answer
    /// each: one the caller was not told of as it stands ends a wait at once.
    pub attention: Vec<Pending>,
    /// The timeout passed before the condition held.
    pub timed_out: bool,
}

/// What a cancel did.
#[derive(Debug)]
pub struct CancelOutcome {
    /// The child as it is after the cancel (and the wait for its processes to stop).
    pub child: Child,
    /// The sessions whose unfinished work this cancel stopped, the child first.
    pub cancelled: Vec<SessionKey>,
    /// The child had ended before: nothing changed.
    pub already_ended: bool,
}

/// How long a cancel waits for the runs it flagged to stop before it answers: the agent's grace
/// after the cancel line, the supervisor's escalation, and a tick of the owner's scheduler.
const CANCEL_SETTLE_EXTRA: Duration = Duration::from_secs(10);

impl Engine<'_> {
    /// Waits until `until` holds for `children`, up to `timeout`, or an ask put to the caller
    /// (at `host`) is the caller's to answer, or changed who may answer it since the caller was
    /// last told (an approval that waits for a person wakes a wait once, not until answered). None when `cancel`
    /// fired (the client cancelled the request or left): nothing was consumed.
    pub async fn wait_subagents(
        &self,
        caller: &Caller,
        host: Host<'_>,
        children: &[SessionRow],
        until: Until,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<Option<WaitOutcome>, ToolError> {
        let rt = self.runtime("subagents")?;
        let access = self.access;
        let look = || -> Result<WaitOutcome, ToolError> {
            let (finished, unfinished) = children
                .iter()
                .map(|row| access.subagent_again(row))
                .collect::<Result<Vec<Child>, ToolError>>()?
                .into_iter()
                .partition(|c: &Child| c.state.is_finished() && c.row.announced_at.is_some());
            let attention = access
                .asks_for(caller)?
                .into_iter()
                .map(|ask| super::ask::pending(&rt.config, &caller.key, host, ask))
                .collect();
            Ok(WaitOutcome { finished, unfinished, attention, timed_out: false })
        };
        let holds = |w: &WaitOutcome| {
            w.attention.iter().any(|p| p.who == Answerer::Model)
                || rt.tell(&caller.key, &w.attention, false)
                || match until {
                    Until::Any => !w.finished.is_empty() || w.unfinished.is_empty(),
                    Until::All => w.unfinished.is_empty(),
                }
        };
        let waited = rt
            .wait_for(timeout, cancel, || -> Result<Option<WaitOutcome>, ToolError> {
                let seen = look()?;
                Ok(holds(&seen).then_some(seen))
            })
            .await?;
        let outcome = match waited {
            Waited::Finished(outcome) => outcome,
            Waited::TimedOut => WaitOutcome { timed_out: true, ..look()? },
            Waited::Cancelled => return Ok(None),
        };
        access.mark_read(&outcome.finished.iter().collect::<Vec<_>>())?;
        rt.tell(&caller.key, &outcome.attention, true);
        Ok(Some(outcome))
    }

    /// Cancels the child's unfinished work (with `cascade`, its descendants' too), then waits a
    /// bounded time for the runs it stopped to end, so that the answer says how they ended.
    pub async fn cancel_subagent(
        &self,
        caller: &Caller,
        row: SessionRow,
        cascade: bool,
        cancel: &CancellationToken,
    ) -> Result<CancelOutcome, ToolError> {
        self.access.check_can_act(caller)?;
        self.cancel_tree(row, cascade, cancel).await
    }

    /// [`Self::cancel_subagent`] without a caller to check: the operator's (the dashboard's)
    /// cancel of any session's unfinished work.
    pub async fn cancel_tree(
        &self,
        row: SessionRow,
        cascade: bool,
        cancel: &CancellationToken,
    ) -> Result<CancelOutcome, ToolError> {
        let access = self.access;
        let rt = self.runtime("subagents")?;
        let before = access.child(row)?;
        if before.state.is_finished() {
            return Ok(CancelOutcome { child: before, cancelled: Vec::new(), already_ended: true });
        }
        let done = rt.store.cancel_subtree(&before.row.key, cascade)?;
        let stopped = TurnResult { status: RunStatus::Cancelled, reply: None, silent: false };
        for run in &done.dequeued {
            take_steps(rt, run, &stopped);
        }
        // Sessions with no run left (waiting for their children) announce now; the others when
        // their stopped run ends.
        for session in &done.sessions {
            let fresh = access.subagent_again(&session.clone())?;
            if let Some(spawn_run) = &fresh.spawn_run {
                spawn::announce_cancelled(rt, &fresh.row, spawn_run)?;
            }
        }
        rt.stop_flagged();
        rt.wake();
        let settle = rt.config.longest_cancel_grace() + CANCEL_SETTLE_EXTRA;
        let flagged = &done.flagged;
        rt.wait_for(settle, cancel, || -> Result<Option<()>, ToolError> {
            for run_id in flagged {
                if rt.store.run(run_id)?.is_some_and(|r| !r.is_finished()) {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        })
        .await?;
        Ok(CancelOutcome {
            child: access.subagent_again(&before.row)?,
            cancelled: done.sessions.into_iter().map(|s| s.key).collect(),
            already_ended: false,
        })
    }
}
