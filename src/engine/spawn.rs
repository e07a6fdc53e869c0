//! Sub-agents (docs/BEHAVIOUR.md, sessions_spawn, Sub-agents): the child session and its run, created in one transaction that
//! checks and reserves admission; and the completion — an optional Notes step in the child, the
//! announce text, its delivery to the requester (an external requester's inbox, or a completion
//! run in a driven requester), then cleanup (delete) or a later archive (keep). A child that still
//! has unfinished children announces only after its last child completed.

use std::path::PathBuf;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::budget::{BudgetRefusal, Reservation};
use super::chain::{self, Provenance, SourceTool};
use super::context::{ANNOUNCE_SKIP, NO_REPLY, is_skip};
use super::flow::{Cleanup, Flow, SpawnFlow, Tagged};
use super::{Engine, TurnResult};
use crate::access::ToolError;
use crate::access::caller::Caller;
use crate::config::{Config, key_scope};
use crate::engine::scheduler::Scheduler;
use crate::keys::{self, AgentId, SessionKey};
use crate::policy::budget::Limits;
pub use crate::store::BindingMode;
use crate::store::{
    AnnounceKind, AttachmentReceipt, DeliveryKind, DeliveryMode, DeliveryStatus, IdempotencyHit, NewDelivery,
    NewMessage, NewRun, NewSession, RememberedKey, RunMode, RunRow, RunStatus, SessionRow, Store, StoreError,
};
use crate::store::{Route, ThreadBinding};

/// Longest Result in an announce, in bytes.
const RESULT_BYTES: usize = 8 * 1024;
pub const NOTES_PROMPT: &str = "Your task has ended (Status: completed successfully). Write short notes for the agent that spawned you: what you did, what is left, where the results are. Reply exactly ANNOUNCE_SKIP to add nothing.";
/// What a CLI child's sub-agent context asks instead of a Notes step (no line of it starts with
/// the label, so a CLI that echoes its prompt does not write notes by accident).
pub const NOTES_IN_REPLY: &str = "End your final answer with a last section that starts on its own line with \"Notes:\", followed by short notes for the agent that spawned you: what you did, what is left, where the results are. It is passed on apart from your answer.";
pub const COMPLETION_PREFIX: &str = "A sub-agent you spawned has finished:";

/// What a caller asks to spawn (its arguments validated by the tool).
pub struct SpawnRequest {
    pub task: String,
    pub label: Option<String>,
    pub agent: AgentId,
    pub model: Option<String>,
    pub thinking: Option<String>,
    pub run_timeout: Option<u64>,
    pub cleanup_delete: bool,
    pub require_sandbox: bool,
    /// `workspace` as asked; none: `agents.defaults.subagents.workspace`.
    pub workspace: Option<crate::config::WorkspaceMode>,
    /// The requester's project as its MCP client declares it (roots); none: the directory this
    /// serving process was started in.
    pub client_project: Option<PathBuf>,
    pub attachments: Vec<super::attachments::Incoming>,
    pub idempotency_key: Option<String>,
    /// The budget asked for (validated); none: the configured default, else a share of the requester's.
    pub budget: Option<crate::config::Budget>,
    /// The thread it is bound to (`thread: true`, opened by `Engine::open_thread` first).
    pub thread: Option<ThreadBinding>,
    /// `thread: true` with this mode.
    pub thread_mode: Option<BindingMode>,
    /// The reserved `attachAs` hint, recorded with the spawn's flow.
    pub attach_as: Option<Value>,
    /// The arguments as given: an idempotency key re-attaches only to the same ones.
    pub raw: Value,
}

/// A spawn the engine accepted (or the earlier one its idempotency key names).
pub struct SpawnAccepted {
    pub spawned: Spawned,
    /// The caller's newest seq before the spawn: the announce lands after it.
    pub inbox_after: i64,
    /// The receipts of the attachments moved into the child's workdir.
    pub attachments: Option<Value>,
    /// An idempotency key named an earlier spawn: this is its answer, nothing new was made.
    pub replayed: bool,
    /// The child runs the built-in echo agent ([`crate::runner::ECHO_WARNING`]).
    pub echo: bool,
    /// Where it works: `{mode: "project", path}` or `{mode: "isolated"}` (none on a replay).
    pub workspace: Option<Value>,
}

impl Engine<'_> {
    /// Admission (attachments enabled, the caller may act, the allowlist, depth, sandbox, send
    /// policy, idempotency replay, chain limits, the child's runner), then the child and its run in one transaction.
    /// Every refusal before the runner needs no runtime, so it is the same without one.
    pub fn spawn(&self, caller: &Caller, req: SpawnRequest) -> Result<SpawnAccepted, ToolError> {
        let access = self.access;
        let config = access.config();
        if !req.attachments.is_empty() && !config.tools.sessions_spawn.attachments.enabled {
            return Err(ToolError::forbidden(
                "attachments are disabled; the operator can enable them with tools.sessions_spawn.attachments.enabled=true",
            ));
        }
        access.check_can_act(caller)?;
        check_allowed(config, caller, &req.agent)?;
        let caller_row = access.own_row(caller)?;
        let depth = caller_row.as_ref().map_or(0, |r| r.spawn_depth) + 1;
        let max_depth = i64::from(config.agents.defaults.subagents.max_spawn_depth);
        if depth > max_depth {
            return Err(ToolError::forbidden(format!(
                "sessions_spawn is not allowed at this depth: a child would be at depth {depth} (agents.defaults.subagents.maxSpawnDepth={max_depth})"
            )));
        }
        let probe = SessionKey::for_agent(&req.agent, "subagent:00000000-0000-4000-8000-000000000000");
        let child_sandboxed = crate::config::configured_sandbox(config, &probe);
        check_sandbox(caller, &req, child_sandboxed)?;
        let decision = access.send_decision(&probe, None);
        if !decision.allowed() {
            return Err(ToolError::forbidden(decision.refusal(config.session.send_policy.as_ref())));
        }
        let args_hash = hex::encode(Sha256::digest(req.raw.to_string().as_bytes()));
        if let Some(hit) = chain::replay(access, caller, req.idempotency_key.as_deref(), &args_hash, "spawn")? {
            return replayed(access, caller, &req, hit);
        }
        let hop = chain::next_hop(access, caller, chain::Limits::Hops)?;
        let rt = self.runtime("sessions_spawn")?;
        let spec = crate::runner::resolve_runner(config, &req.agent, &rt.state_dir, &rt.runner.exe)
            .map_err(ToolError::invalid)?;
        let (model, thinking) = model_and_thinking(config, &req);
        let timeout_s =
            req.run_timeout.or(Some(config.agents.defaults.subagents.run_timeout_seconds)).filter(|s| *s > 0);
        let inbox_after = access.last_seq_of(&caller.key)?;
        // Staged before the transaction, moved into place as its last step; removed if anything
        // fails. They go to the child's run workdir: its own directory when it runs sandboxed.
        let child_session_id = uuid::Uuid::new_v4().to_string();
        let run_workdir = if child_sandboxed {
            crate::runner::sandbox::session_workdir(&spec.workdir, &child_session_id)
        } else {
            spec.workdir.clone()
        };
        let staged = if req.attachments.is_empty() {
            None
        } else {
            Some(
                super::attachments::stage(&spec.workdir, &run_workdir, &req.attachments)
                    .map_err(|e| ToolError::error(format!("attachments: {e}")))?,
            )
        };
        let plan = SpawnPlan {
            caller,
            caller_channel: if caller.external {
                "webchat".into()
            } else {
                super::channel_of_row(&caller.key, caller_row.as_ref(), rt)
            },
            target_agent: req.agent.clone(),
            task: &req.task,
            label: req.label.clone(),
            model,
            thinking,
            timeout_ms: timeout_s.map(|s| (s * 1000) as i64),
            cleanup_delete: req.cleanup_delete,
            sandboxed: child_sandboxed,
            depth,
            max_depth,
            chain_id: hop.chain_id,
            hop: hop.hop,
            idempotency: req.idempotency_key.as_deref().map(|k| (k, args_hash.as_str())),
            attachments: staged.as_ref(),
            // Another node may run the child: the bytes go into the store with the receipts.
            attachment_files: rt.store.is_shared().then_some(req.attachments.as_slice()),
            child_session_id,
            budget: super::budget::asked(config, &req.agent, req.budget.as_ref()),
            child_runner: spec.kind,
            thread: req.thread.as_ref(),
            attach_as: req.attach_as.as_ref(),
            project: None,
            worktree: None,
        };
        let project = project_for(config, &req, child_sandboxed)?;
        let worktree = match &project {
            Some(dir)
                if req.workspace.unwrap_or(config.agents.defaults.subagents.workspace)
                    == crate::config::WorkspaceMode::Worktree =>
            {
                let name =
                    crate::runner::worktree::name_for(req.label.as_deref(), req.agent.as_str(), &plan.child_session_id);
                Some(
                    crate::runner::worktree::create(dir, &rt.state_dir.join("worktrees"), &name)
                        .map_err(ToolError::invalid)?,
                )
            }
            _ => None,
        };
        let plan =
            SpawnPlan { project: worktree.as_ref().map(|wt| PathBuf::from(&wt.workdir)).or(project), worktree, ..plan };
        let started = start(&rt.store, &rt.config, &plan);
        if started.is_err()
            && let Some(wt) = &plan.worktree
        {
            // The fresh worktree holds no work: it goes with the refused (or replayed) spawn.
            crate::runner::worktree::settle(wt, true);
        }
        let spawned = match started {
            Ok(spawned) => spawned,
            // The same key's spawn committed (on another node, or request) since the look above.
            Err(Refused::Replayed(hit)) => {
                let key = req.idempotency_key.as_deref().unwrap_or_default();
                let hit = chain::same_arguments(*hit, key, &args_hash, "spawn")?;
                return replayed(access, caller, &req, hit);
            }
            Err(r) => return Err(self.refusal(caller, &rt.store, r)),
        };
        let workspace = match (&plan.worktree, &plan.project) {
            (Some(wt), _) => json!({"mode": "worktree", "path": wt.workdir, "branch": wt.branch}),
            (None, Some(dir)) => {
                let sharing = siblings_in(&rt.store, &caller.key, &spawned.child_key, dir)?;
                let mut w = json!({"mode": "project", "path": dir.display().to_string()});
                if sharing > 0 {
                    w["sharedWith"] = json!(sharing);
                    w["note"] = json!(format!(
                        "{sharing} other unfinished child(ren) of yours work in this project too and may change the same files; wait for one, or spawn with workspace \"isolated\""
                    ));
                }
                w
            }
            (None, None) => json!({"mode": "isolated"}),
        };
        let attachments = staged.as_ref().map(super::attachments::Staged::summary);
        if let Some(s) = staged {
            s.keep();
        }
        rt.wake();
        Ok(SpawnAccepted {
            spawned,
            inbox_after,
            attachments,
            replayed: false,
            echo: spec.echo,
            workspace: Some(workspace),
        })
    }
}

/// The allowlist (`agents.list[].subagents.allowAgents`): with `*`, only configured agents.
fn check_allowed(config: &Config, caller: &Caller, agent: &AgentId) -> Result<(), ToolError> {
    let (allow_any, allowed) = crate::policy::spawnable(config, &caller.agent);
    if !allowed.contains(agent) || (allow_any && !config.is_configured(agent) && *agent != caller.agent) {
        return Err(ToolError::forbidden(format!(
            "agentId \"{agent}\" is not allowed for this agent; allowed: {} (agents.list[].subagents.allowAgents)",
            allowed.iter().map(AgentId::as_str).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}

/// A sandboxed caller spawns only sandboxed children; `sandbox: "require"` also needs the
/// sandbox to be available now (an inherited one that cannot start fails the run instead).
fn check_sandbox(caller: &Caller, req: &SpawnRequest, child_sandboxed: bool) -> Result<(), ToolError> {
    if (caller.sandboxed || req.require_sandbox) && !child_sandboxed {
        let why = if caller.sandboxed {
            "a sandboxed session may only spawn sandboxed children"
        } else {
            "sandbox: \"require\" was asked"
        };
        return Err(ToolError::forbidden(format!(
            "{why}, but agent \"{}\" does not run sandboxed (agents.list[].sandbox.mode / agents.defaults.sandbox.mode)",
            req.agent
        )));
    }
    if req.require_sandbox {
        crate::runner::sandbox::available()
            .map_err(|why| ToolError::error(format!("sandbox unavailable: {why}; nothing was created")))?;
    }
    Ok(())
}

/// Model: param → target subagents.model → defaults.subagents.model → target model →
/// defaults.model.primary. Thinking: param → target subagents.thinking → defaults.subagents.thinking.
fn model_and_thinking(config: &Config, req: &SpawnRequest) -> (Option<String>, Option<String>) {
    let entry = config.agent(&req.agent);
    let sub = entry.and_then(|e| e.subagents.as_ref());
    let defaults = &config.agents.defaults;
    let model = req
        .model
        .clone()
        .or_else(|| sub.and_then(|s| s.model.clone()))
        .or_else(|| defaults.subagents.model.clone())
        .or_else(|| entry.and_then(|e| e.model.clone()))
        .or_else(|| defaults.model.primary.clone());
    let thinking = req
        .thinking
        .clone()
        .or_else(|| sub.and_then(|s| s.thinking.clone()))
        .or_else(|| defaults.subagents.thinking.clone());
    (model, thinking)
}

impl Engine<'_> {
    /// What the caller is told when admission in the transaction refused. A full cap also names
    /// the children that hold it, as far as the caller may see them.
    fn refusal(&self, caller: &Caller, store: &Store, refused: Refused) -> ToolError {
        match refused {
            Refused::Children(n) => ToolError::forbidden(format!(
                "maxChildrenPerAgent={n} reached: this session already has {n} unfinished children (agents.defaults.subagents.maxChildrenPerAgent){}",
                self.slot_holders(caller, store, Some(&caller.key))
            )),
            Refused::Queue(n) => ToolError::forbidden(format!(
                "maxQueued={n} reached: too many children are waiting to start (agents.defaults.subagents.maxQueued){}",
                self.slot_holders(caller, store, None)
            )),
            Refused::Store(e) => e.into(),
            Refused::Attachments(e) => ToolError::error(format!("attachments: {e}")),
            Refused::Budget(BudgetRefusal::Store(e)) => e.into(),
            Refused::Budget(b) => ToolError::forbidden(b.message()),
            Refused::Replayed(_) => unreachable!("a replay is answered, never refused (`spawn`)"),
        }
    }

    /// `; held by: <label> (<key>, <state>), …, and N more` for the holders of a full cap that the
    /// caller may see (the others are never named nor counted: a caller must not learn of
    /// sessions it may not see). Read after the refusal, so it may be a moment newer than it.
    fn slot_holders(&self, caller: &Caller, store: &Store, requester: Option<&SessionKey>) -> String {
        let holders = match store.slot_holders(requester, MAX_HOLDERS_READ) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read who holds a full spawn cap");
                return String::new();
            }
        };
        let visible: Vec<_> =
            holders.into_iter().filter(|h| self.access.row_visible(caller, &h.session).unwrap_or(false)).collect();
        if visible.is_empty() {
            return "; none of them is visible to you".into();
        }
        let named: Vec<String> = visible
            .iter()
            .take(MAX_HOLDERS_NAMED)
            .map(|h| {
                format!("{} ({}, {})", h.session.label.as_deref().unwrap_or("unlabelled"), h.session.key, h.status)
            })
            .collect();
        let more = visible.len().saturating_sub(MAX_HOLDERS_NAMED);
        let more = if more > 0 { format!(", and {more} more") } else { String::new() };
        format!("; held by: {}{more}", named.join(", "))
    }
}

/// How many holders of a full cap a refusal names, and how many it reads to count the rest.
const MAX_HOLDERS_NAMED: usize = 10;
const MAX_HOLDERS_READ: usize = 1000;

/// Everything a spawn commits.
struct SpawnPlan<'a> {
    caller: &'a Caller,
    caller_channel: String,
    target_agent: AgentId,
    task: &'a str,
    label: Option<String>,
    model: Option<String>,
    thinking: Option<String>,
    timeout_ms: Option<i64>,
    cleanup_delete: bool,
    sandboxed: bool,
    depth: i64,
    max_depth: i64,
    chain_id: String,
    hop: i64,
    idempotency: Option<(&'a str, &'a str)>,
    /// Staged attachments: their receipts go into the transaction, which moves them into place
    /// as its last step.
    attachments: Option<&'a super::attachments::Staged>,
    /// The attachments' bytes, to keep in the store (on a shared one; `None` alone).
    attachment_files: Option<&'a [super::attachments::Incoming]>,
    /// The child's sessionId (chosen first: a sandboxed child's workdir is named after it).
    child_session_id: String,
    /// The budget it asks (empty: none of its own).
    budget: Limits,
    /// Whether the child's runner can report usage depends on its kind.
    child_runner: crate::config::RunnerKind,
    thread: Option<&'a ThreadBinding>,
    attach_as: Option<&'a Value>,
    /// The requester's project the child works in (in its worktree, when it has one); none: the
    /// agent's own workspace.
    project: Option<PathBuf>,
    /// The child's own worktree of the project (`workspace: "worktree"`).
    worktree: Option<crate::runner::worktree::Worktree>,
}

/// Where a child works: the requester's project (its client's root, else the directory this
/// serving process was started in), or None for the agent's own workspace. `auto` means the project for an agent that runs a
/// CLI preset without a workspace of its own. A sandboxed child works in its own directory in the
/// jail, and attachments are written into the agent's workspace: `project` asked outright is then
/// refused, `auto` falls back.
fn project_for(config: &Config, req: &SpawnRequest, sandboxed: bool) -> Result<Option<PathBuf>, ToolError> {
    use crate::config::{RunnerPreset, WorkspaceMode};
    let asked = req.workspace.unwrap_or(config.agents.defaults.subagents.workspace);
    let own_workspace = config.agent(&req.agent).is_some_and(|a| a.workspace.is_some());
    let preset = crate::runner::effective_runner(config, &req.agent).preset;
    let wanted = match asked {
        WorkspaceMode::Project | WorkspaceMode::Worktree => true,
        WorkspaceMode::Isolated => false,
        WorkspaceMode::Auto => !own_workspace && preset.is_some_and(|p| p != RunnerPreset::Echo),
    };
    let blocker = if sandboxed {
        Some("a sandboxed child works in its own directory inside the jail")
    } else if !req.attachments.is_empty() {
        Some("attachments are written into the agent's own workspace")
    } else {
        None
    };
    match (wanted, blocker) {
        (false, _) => Ok(None),
        (true, Some(why)) if asked != WorkspaceMode::Auto => Err(ToolError::invalid(format!(
            "workspace {:?} cannot apply: {why}; leave workspace out or ask \"isolated\"",
            if asked == WorkspaceMode::Worktree { "worktree" } else { "project" }
        ))),
        (true, Some(_)) => Ok(None),
        (true, None) => match &req.client_project {
            Some(root) => Ok(Some(root.clone())),
            None => std::env::current_dir()
                .map(Some)
                .map_err(|e| ToolError::error(format!("workspace: the server's own directory cannot be read: {e}"))),
        },
    }
}

/// How many of `parent`'s other unfinished children work in `project`: siblings writing one
/// project at once is the requester's choice, which the spawn's answer lets it make knowingly.
fn siblings_in(
    store: &Store,
    parent: &SessionKey,
    child: &SessionKey,
    project: &std::path::Path,
) -> Result<usize, StoreError> {
    let project = project.display().to_string();
    let mut sharing = 0;
    for sibling in store.children(parent, i64::MAX)? {
        let unfinished = sibling.announced_at.is_none() && sibling.cancelled_at.is_none();
        let Some(spawn_run) = sibling.spawn_run.as_deref().filter(|_| unfinished && sibling.key != *child) else {
            continue;
        };
        let flow = store.run(spawn_run)?.and_then(|r| Flow::of(r.extra.as_ref()));
        sharing += usize::from(
            flow.as_ref().and_then(Flow::spawn).and_then(|s| s.project.as_deref()) == Some(project.as_str()),
        );
    }
    Ok(sharing)
}

/// What the spawn created.
#[derive(Debug, Clone)]
pub struct Spawned {
    pub run_id: String,
    pub child_key: SessionKey,
    pub queued: bool,
    /// Its budget as granted (`{limit, clamped?, shared?}`); none when no budget applies.
    pub budget: Option<Value>,
    /// Its thread (`{channel, to, threadId, mode}`), when it is bound to one.
    pub thread: Option<Value>,
}

/// Why admission refused (all `forbidden`, naming the limit).
#[derive(Debug)]
enum Refused {
    Children(u32),
    Queue(u32),
    Store(StoreError),
    /// The staged attachments could not be moved into place; nothing was committed.
    Attachments(String),
    Budget(BudgetRefusal),
    /// Nothing was committed: a spawn with the same idempotency key holds it.
    Replayed(Box<IdempotencyHit>),
}

impl From<StoreError> for Refused {
    fn from(e: StoreError) -> Self {
        Refused::Store(e)
    }
}

/// The sub-agent context, in `system` of the child's runs; `ask_notes`: it asks for the notes in
/// the final answer ([`NOTES_IN_REPLY`]).
fn subagent_context(plan: &SpawnPlan, child: &SessionKey, ask_notes: bool) -> String {
    let spawning = if plan.depth < plan.max_depth {
        "You may spawn sub-agents of your own with sessions_spawn; their completions arrive as your next messages."
    } else {
        "You are a leaf worker: you cannot spawn further sub-agents."
    };
    let thread = match plan.thread {
        Some(b) if b.mode == BindingMode::Session => format!(
            "\nYour replies are posted in thread {} of channel {}. This subagent session is persistent and remains available for thread follow-up messages.",
            b.thread_id, b.channel
        ),
        Some(b) => format!("\nYour replies are posted in thread {} of channel {}.", b.thread_id, b.channel),
        None => String::new(),
    };
    let notes = if ask_notes { format!("\n{NOTES_IN_REPLY}") } else { String::new() };
    format!(
        "Sub-agent context. You are a sub-agent spawned for one task (depth {depth} of {max}).\n\
         Rules: stay on the task; finish it; do not start unrelated work; your session is ephemeral; \
         your final reply is announced to the session that spawned you automatically — do not poll or \
         message it.{notes}\n{spawning}{thread}\nLabel: {label}.\nRequester session: {req}.\nRequester channel: {ch}.\nYour session: {child}.",
        depth = plan.depth,
        max = plan.max_depth,
        label = plan.label.as_deref().unwrap_or("(none)"),
        req = plan.caller.key,
        ch = plan.caller_channel,
    )
}

/// The answer to a spawn its idempotency key names: the child and run it started.
fn replayed(
    access: &crate::access::Access,
    caller: &Caller,
    req: &SpawnRequest,
    hit: IdempotencyHit,
) -> Result<SpawnAccepted, ToolError> {
    let result = hit.result.as_ref();
    let child = result.and_then(|r| r.get("childSessionKey")).and_then(Value::as_str).unwrap_or("");
    let queued = result.and_then(|r| r.get("queued")).and_then(Value::as_bool).unwrap_or(false);
    let spawned = Spawned {
        run_id: hit.run_id.clone().unwrap_or_default(),
        child_key: SessionKey::from_canonical(child),
        queued,
        budget: result.and_then(|r| r.get("budget")).cloned(),
        thread: result.and_then(|r| r.get("thread")).filter(|t| t.is_object()).cloned(),
    };
    let inbox_after = access.last_seq_of(&caller.key)?;
    let echo = crate::runner::is_echo(access.config(), &req.agent);
    Ok(SpawnAccepted { spawned, inbox_after, attachments: None, replayed: true, echo, workspace: None })
}

/// Checks and reserves admission, creates the child, queues its run and moves its attachments
/// into place, in one transaction: a spawn that fails leaves neither a child nor files.
///
/// Holds no global lock on a shared database: it claims its idempotency key first
/// (`Tx::claim_key`), then locks what admission counts (`Tx::spawn_counts`: the requester's
/// session row, the spawns' cap key) and the budget accounts it reserves from
/// (`Tx::budget_chain`, root to leaf); the rest are inserts under unique keys. The attachments
/// move last: a transaction PostgreSQL ends for a deadlock (and runs again) ends before them.
fn start(store: &Store, config: &Config, plan: &SpawnPlan) -> Result<Spawned, Refused> {
    let sub = &config.agents.defaults.subagents;
    let child_key = SessionKey::for_agent(&plan.target_agent, &format!("subagent:{}", uuid::Uuid::new_v4()));
    let run_id = uuid::Uuid::new_v4().to_string();
    let scope = key_scope(config, &plan.target_agent);
    store.write_row_locked(|tx| -> Result<Spawned, Refused> {
        if let Some((key, hash)) = plan.idempotency {
            // What the answer will say but the budget's part, known only once reserved: the
            // key's result is written again below with it.
            let result = json!({"childSessionKey": child_key.as_str()});
            let use_of_key = RememberedKey {
                caller: plan.caller.key.as_str(),
                key,
                tool: "sessions_spawn",
                args_hash: hash,
                run_id: &run_id,
                result: &result,
            };
            if let Some(hit) = tx.claim_key(&use_of_key)? {
                return Err(Refused::Replayed(Box::new(hit)));
            }
        }
        let counts = tx.spawn_counts(&plan.caller.key)?;
        if counts.unfinished >= i64::from(sub.max_children_per_agent) {
            return Err(Refused::Children(sub.max_children_per_agent));
        }
        // Children admitted but not started yet hold their place in the line too.
        let queued = counts.running + counts.queued >= i64::from(sub.max_concurrent);
        if queued && counts.queued >= i64::from(sub.max_queued) {
            return Err(Refused::Queue(sub.max_queued));
        }
        let mut child = NewSession::new(
            child_key.clone(),
            plan.target_agent.clone(),
            keys::kind_of(&child_key, &scope, None),
            false,
        );
        child.session_id = plan.child_session_id.clone();
        child.spawned_by = Some(plan.caller.key.clone());
        child.spawn_depth = plan.depth;
        child.subagent_role = Some(if plan.depth < plan.max_depth { "orchestrator" } else { "leaf" }.into());
        child.label = plan.label.clone();
        child.sandboxed = plan.sandboxed;
        child.model = plan.model.clone();
        tx.insert_session(&child)?;
        let child_id: i64 = tx.session_id(&child_key)?;
        tx.set_spawn_run(child_id, &run_id)?;
        let reservation = Reservation {
            requester: tx.find_session_id(&plan.caller.key)?,
            requester_is_root: plan.depth == 1,
            child: child_id,
            child_agent: &plan.target_agent,
            asked: plan.budget,
            child_runner: plan.child_runner,
        };
        let budget = super::budget::reserve(tx, config, &reservation).map_err(Refused::Budget)?.to_json();
        if let Some(b) = plan.thread {
            // Its replies go to its thread: the channel and the address live on its row.
            tx.bind_thread(child_id, b)?;
            tx.set_channel(child_id, &b.channel)?;
            let route = Route {
                channel: b.channel.clone(),
                to: Some(b.to.clone()),
                thread_id: Some(b.thread_id.clone()),
                account_id: None,
            };
            tx.set_route(child_id, &route)?;
        }
        // Every kind but jsonl starts its CLI per turn: a Notes step would be a second start.
        let notes_in_reply = plan.child_runner != crate::config::RunnerKind::Jsonl;
        let flow = SpawnFlow {
            requester: plan.caller.key.to_string(),
            cleanup: if plan.cleanup_delete { Cleanup::Delete } else { Cleanup::Keep },
            system: subagent_context(plan, &child_key, notes_in_reply && sub.announce_step),
            notes_in_reply,
            attachments: plan.attachments.map(|staged| staged.for_request()),
            attachments_path: plan.attachments.map(|staged| staged.path().display().to_string()),
            attach_as: plan.attach_as.cloned(),
            project: plan.project.as_ref().map(|p| p.display().to_string()),
            worktree: plan.worktree.clone(),
        };
        if let Some(staged) = plan.attachments {
            for r in &staged.receipts {
                let file = plan.attachment_files.and_then(|files| files.iter().find(|f| f.name == r.name));
                let receipt = AttachmentReceipt {
                    name: &r.name,
                    bytes: r.bytes,
                    sha256: &r.sha256,
                    rel_dir: &staged.rel_dir,
                    content: file.map(|f| f.bytes.as_slice()),
                    mime_type: file.and_then(|f| f.mime_type.as_deref()),
                };
                tx.add_attachment_receipt(&run_id, &receipt)?;
            }
        }
        tx.enqueue(&NewRun {
            run_id: run_id.clone(),
            session: child_id,
            mode: RunMode::Spawn,
            input: json!({"role": "user", "content": plan.task}),
            provenance: Some(
                Provenance::from_session(
                    &plan.caller.key,
                    &plan.caller_channel,
                    SourceTool::SessionsSpawn,
                    Some(&plan.chain_id),
                )
                .to_json(),
            ),
            requester_key: Some(plan.caller.key.clone()),
            chain_id: Some(plan.chain_id.clone()),
            hop: plan.hop,
            announce_kind: None,
            model: plan.model.clone(),
            thinking: plan.thinking.clone(),
            timeout_ms: plan.timeout_ms,
            extra: Some(Flow::Tagged(Tagged::Spawn(Box::new(flow))).to_json()),
        })?;
        let thread = plan
            .thread
            .map(|b| json!({"channel": b.channel, "to": b.to, "threadId": b.thread_id, "mode": b.mode.as_str()}));
        if let Some((key, hash)) = plan.idempotency {
            let result =
                json!({"childSessionKey": child_key.as_str(), "queued": queued, "budget": budget, "thread": thread});
            tx.remember_key(&plan.caller.key, key, "sessions_spawn", hash, &run_id, &result)?;
        }
        // Last, so that nothing after it can fail but the commit (whose failure drops the files).
        if let Some(staged) = plan.attachments {
            staged.place().map_err(Refused::Attachments)?;
        }
        Ok(Spawned { run_id: run_id.clone(), child_key: child_key.clone(), queued, budget, thread })
    })
}

/// The status line of an announce, from the runtime (never from model text).
fn status_text(run: &RunRow) -> String {
    match run.status {
        RunStatus::Ok => "completed successfully".to_string(),
        RunStatus::Timeout => "timed out".to_string(),
        RunStatus::Interrupted => "interrupted".to_string(),
        RunStatus::Cancelled => "cancelled".to_string(),
        RunStatus::BudgetExceeded => run.error.clone().unwrap_or_else(|| "budget exceeded".to_string()),
        s => format!("failed: {}", run.error.clone().unwrap_or_else(|| s.to_string())),
    }
}

fn compact(n: i64) -> String {
    match n {
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}k", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// The announce text (docs/BEHAVIOUR.md, Sub-agents; pinned).
pub fn announce_text(
    rt: &Scheduler,
    child: &SessionRow,
    spawn_run: &RunRow,
    result: &str,
    notes: Option<&str>,
    worktree: Option<&str>,
) -> String {
    let mut result = if result.trim().is_empty() { "(no output)".to_string() } else { result.to_string() };
    if result.len() > RESULT_BYTES {
        let mut cut = RESULT_BYTES;
        while !result.is_char_boundary(cut) {
            cut -= 1;
        }
        result.truncate(cut);
        result.push_str("\n…(result truncated at 8 KiB)…");
    }
    let ended = spawn_run.ended_at.unwrap_or_else(crate::store::now_ms);
    let runtime = (ended - spawn_run.started_at.unwrap_or(spawn_run.created_at)).max(0) / 1000;
    let mut stats = vec![format!("runtime {runtime}s")];
    let tokens = child.tokens_in.saturating_add(child.tokens_out);
    if tokens > 0 {
        stats.push(format!(
            "tokens {} (in {} / out {})",
            compact(tokens),
            compact(child.tokens_in),
            compact(child.tokens_out)
        ));
    }
    if let Some(cost) = child.cost {
        stats.push(format!("est ${cost:.4}"));
    }
    match rt.store.budget_of(child.id) {
        Ok(Some(account)) => stats.push(account.spent_text()),
        Ok(None) => {}
        Err(e) => tracing::warn!(child = %child.key, error = %e, "reading the child's budget for its announce failed"),
    }
    stats.push(format!("sessionKey {}", child.key));
    stats.push(format!("sessionId {}", child.session_id));
    let (crate::access::Transcript::File(at) | crate::access::Transcript::Resource(at)) =
        crate::access::transcript(child, Some(&crate::config::export_dir(&rt.state_dir)));
    stats.push(format!("transcript {at}"));
    let mut text = format!("Status: {}\nResult: {result}\n", status_text(spawn_run));
    if crate::runner::is_echo(&rt.config, &child.agent_id) {
        text.push_str(&format!("Warning: {}\n", crate::runner::ECHO_WARNING));
    }
    if let Some(line) = worktree {
        text.push_str(&format!("Worktree: {line}\n"));
    }
    if rt.config.agents.defaults.subagents.announce_step
        && let Some(n) = notes.filter(|n| !n.trim().is_empty())
    {
        text.push_str(&format!("Notes: {n}\n"));
    }
    if let Some(asked) = asked_line(rt, spawn_run) {
        text.push_str(&asked);
    }
    text.push_str(&format!("Stats: {}", stats.join(" • ")));
    text
}

/// The `Asked:` line: each question or approval the run asked, how it ended and who answered (the
/// model, a person at which host, the operator, a rule, no one in time). None when it asked none.
fn asked_line(rt: &Scheduler, run: &RunRow) -> Option<String> {
    const TEXT_CHARS: usize = 80;
    let asks = rt.store.asks_of_runs(std::slice::from_ref(&run.run_id)).unwrap_or_default();
    let items: Vec<String> = asks
        .iter()
        .map(|a| {
            let words = crate::sanitize::ask_words(&a.text, None, None).text;
            let short: String = words.chars().take(TEXT_CHARS).collect();
            let cut = if short.len() < words.len() { "…" } else { "" };
            let how = match (a.decision, a.answered_via) {
                (Some(d), Some(via)) if a.state != crate::store::AskState::Withdrawn => format!(
                    "{} by {}",
                    d.as_str(),
                    crate::engine::ask::answerer_words(
                        via,
                        a.answered_by.as_deref().unwrap_or_default(),
                        a.answered_host.as_deref()
                    )
                ),
                _ => a.state.as_str().to_string(),
            };
            format!("{} \"{short}{cut}\": {how}", a.kind.as_str())
        })
        .collect();
    (!items.is_empty()).then(|| format!("Asked: {}\n", items.join("; ")))
}

/// The Result of a child: its final reply, else its last tool result, else nothing. A child that
/// was stopped (cancelled, or over its budget) gets its last own words instead: the last tool
/// result of an interrupted agent is the agent's note about the interruption, not a result.
fn child_result(
    rt: &Scheduler,
    child: &SessionRow,
    reply: Option<&str>,
    status: RunStatus,
) -> Result<String, StoreError> {
    if let Some(r) = reply.filter(|r| !r.trim().is_empty()) {
        return Ok(r.to_string());
    }
    let stopped = matches!(status, RunStatus::Cancelled | RunStatus::BudgetExceeded);
    let fallback = if stopped { "assistant" } else { "toolResult" };
    let page = rt.store.history_tail(child.id, 50, true)?;
    Ok(page
        .messages
        .iter()
        .rev()
        .find(|m| m.role == fallback)
        .map(|m| crate::runner::protocol::content_text(&m.content))
        .unwrap_or_default())
}

/// The reply to the child's task: its last work run's — a steer turn's, or a completion run's
/// that read its own children's results (an orchestrator answers after its children did) — unless
/// that one was empty or a skip token, else its spawn run's.
fn task_reply(spawn_run: &RunRow, last_work: &RunRow) -> Option<String> {
    let said = |r: &&String| !r.trim().is_empty() && !is_skip(r);
    last_work.reply.as_ref().filter(said).or(spawn_run.reply.as_ref()).cloned()
}

/// The task reply and the notes in it: while announceStep is on, a CLI child
/// ([`SpawnFlow::notes_in_reply`]) ends its answer with a `Notes:` section, which is cut off the
/// Result; any other child's notes come from its Notes step, so none are taken here.
fn reply_and_notes(rt: &Scheduler, spawn_run: &RunRow, last_work: &RunRow) -> (Option<String>, Option<String>) {
    let reply = task_reply(spawn_run, last_work);
    if !rt.config.agents.defaults.subagents.announce_step || !spawned_cli(spawn_run) {
        return (reply, None);
    }
    match reply.as_deref().and_then(split_notes) {
        Some((result, notes)) => {
            let notes = Some(notes).filter(|n| !n.is_empty() && !is_skip(n)).map(String::from);
            (Some(result.to_string()), notes)
        }
        None => (reply, None),
    }
}

/// The child runs a CLI started per turn: its notes are in its reply ([`SpawnFlow::notes_in_reply`]).
fn spawned_cli(spawn_run: &RunRow) -> bool {
    Flow::of(spawn_run.extra.as_ref()).as_ref().and_then(Flow::spawn).is_some_and(|s| s.notes_in_reply)
}

/// A reply split at its last line labelled `Notes:` (also `**Notes:**`, `## Notes:`): the text
/// before that line, and the notes after the label (to the end). None: no such line.
fn split_notes(reply: &str) -> Option<(&str, &str)> {
    let mut line_start = 0;
    let mut found = None;
    for line in reply.split_inclusive('\n') {
        if let Some(rest) = after_notes_label(line) {
            found = Some((line_start, line_start + line.len() - rest.len()));
        }
        line_start += line.len();
    }
    let (line, notes) = found?;
    Some((reply[..line].trim_end(), reply[notes..].trim()))
}

/// The rest of a line that starts with the `Notes:` label, markdown emphasis or heading marks
/// around it allowed, in any case.
fn after_notes_label(line: &str) -> Option<&str> {
    let marks = ['#', '*', '_', '>', ' ', '\t'];
    let label = line.trim_start_matches(marks);
    if !label.get(..5)?.eq_ignore_ascii_case("notes") {
        return None;
    }
    let rest = label[5..].trim_start_matches(['*', '_']).strip_prefix(':')?;
    Some(rest.trim_start_matches(['*', '_']))
}

/// After any run in a sub-agent session (its own work, a message sent to it, an exchange's
/// announce, its Notes step): a thread-bound child's reply goes to its thread; the announce goes
/// once no run of the child is left and its own children have announced — exactly once,
/// whatever the mix of runs. Its Result and status are those of its last work run.
pub fn after_child_run(rt: &Scheduler, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    let store = &rt.store;
    let Some(child) = store.session_by_key(&run.session_key)? else { return Ok(()) };
    if matches!(run.mode, RunMode::Spawn | RunMode::Steer) && store.thread_binding(child.id)?.is_some() {
        super::steps::to_channel(rt, run, result, DeliveryKind::Reply)?;
    }
    let (Some(spawn_run_id), None) = (&child.spawn_run, child.announced_at) else { return Ok(()) };
    let Some(spawn_run) = store.run(spawn_run_id)? else { return Ok(()) };
    if child.cancelled_at.is_some() {
        return announce_cancelled(rt, &child, &spawn_run);
    }
    if store.active_run_of(child.id)?.is_some() {
        return Ok(()); // the child's next run (a steer, a completion, a message) announces when it ends
    }
    let last_work = store.last_work_run(child.id)?.unwrap_or_else(|| spawn_run.clone());
    let (reply, reply_notes) = reply_and_notes(rt, &spawn_run, &last_work);
    if run.mode == RunMode::Announce && run.announce_kind == Some(AnnounceKind::Subagent) {
        // The Notes step ended: announce with its reply (ANNOUNCE_SKIP adds nothing).
        let notes = result.reply.as_deref().filter(|r| !is_skip(r));
        let result_text = child_result(rt, &child, reply.as_deref(), RunStatus::Ok)?;
        return announce(rt, &child, &spawn_run, &result_text, notes);
    }
    if last_work.reply.as_deref().is_some_and(|r| matches!(r.trim(), ANNOUNCE_SKIP | NO_REPLY)) {
        // Silence was asked for: no announce, but the flow ends (cleanup still applies).
        return finish(rt, &child, &spawn_run);
    }
    if store.unannounced_children(child.key.as_str())? > 0 {
        return Ok(()); // the last child's completion wakes this session again
    }
    let ok = last_work.status == RunStatus::Ok;
    if ok && rt.config.agents.defaults.subagents.announce_step && !spawned_cli(&spawn_run) {
        return queue_notes(rt, &child, run);
    }
    let status_run = RunRow { status: last_work.status, ..spawn_run.clone() };
    let result_text = child_result(rt, &child, reply.as_deref(), status_run.status)?;
    // Notes only after success, as with a Notes step.
    announce(rt, &child, &status_run, &result_text, reply_notes.as_deref().filter(|_| ok))
}

/// A child whose work an ancestor cancelled announces `Status: cancelled` once none of its runs
/// is left, without a Notes step and without waiting for its own children (their completions
/// are not run in it).
pub fn announce_cancelled(rt: &Scheduler, child: &SessionRow, spawn_run: &RunRow) -> Result<(), StoreError> {
    if child.announced_at.is_some() || rt.store.active_run_of(child.id)?.is_some() {
        return Ok(()); // announced already, or the run still stopping announces when it ends
    }
    let last_work = rt.store.last_work_run(child.id)?.unwrap_or_else(|| spawn_run.clone());
    let (reply, _) = reply_and_notes(rt, spawn_run, &last_work);
    let result_text = child_result(rt, child, reply.as_deref(), RunStatus::Cancelled)?;
    let status_run = RunRow { status: RunStatus::Cancelled, ..spawn_run.clone() };
    announce(rt, child, &status_run, &result_text, None)
}

fn queue_notes(rt: &Scheduler, child: &SessionRow, run: &RunRow) -> Result<(), StoreError> {
    let step = NewRun {
        run_id: super::step_id(&run.run_id, "notes"),
        session: child.id,
        mode: RunMode::Announce,
        input: json!({"role": "user", "content": NOTES_PROMPT}),
        provenance: Some(
            Provenance::InternalSystem { tool: SourceTool::SubagentAnnounce, chain: run.chain_id.clone() }.to_json(),
        ),
        requester_key: run.requester_key.clone(),
        chain_id: run.chain_id.clone(),
        hop: run.hop,
        announce_kind: Some(AnnounceKind::Subagent),
        model: None,
        thinking: None,
        timeout_ms: None,
        extra: run.extra.clone(),
    };
    // One insert under the step's derived run id: no global lock, queued once.
    rt.store.write_row_locked(|tx| tx.enqueue(&step))?;
    rt.wake();
    Ok(())
}

/// Delivers the announce to the requester, then cleans up.
fn announce(
    rt: &Scheduler,
    child: &SessionRow,
    spawn_run: &RunRow,
    result: &str,
    notes: Option<&str>,
) -> Result<(), StoreError> {
    let store = &rt.store;
    let worktree = settle_worktree(spawn_run);
    let text = announce_text(rt, child, spawn_run, result, notes, worktree.as_deref());
    let Some(requester) = spawn_run.requester_key.clone() else { return finish(rt, child, spawn_run) };
    let requester_row = store.session_by_key(&requester)?;
    let provenance =
        Provenance::from_session(&child.key, "internal", SourceTool::SubagentAnnounce, spawn_run.chain_id.as_deref())
            .to_json();
    // No global lock: the announce's delivery row decides (`add_announce` locks the spawn run's
    // row for its check, so a second taker finds it after the first's commit); the requester's
    // session row, appended to or queued in, is locked first, in the store's lock order.
    store.write_row_locked(|tx| -> Result<(), StoreError> {
        let Some(r) = &requester_row else { return Ok(()) };
        // Read under the requester's row lock: a cancel committing after the row was read above
        // still skips the announce.
        let cancelled = tx.work_cancelled(r.id)?;
        // One announce per child: the delivery row goes first, and a step taken again stops here.
        let kind = if r.external { DeliveryKind::Announce } else { DeliveryKind::Completion };
        if cancelled {
            // The requester's own work was cancelled: nothing runs in it any more.
            let mut skipped = delivery(spawn_run, kind, requester.as_str(), DeliveryStatus::Skipped);
            skipped.last_error = Some("its requester was cancelled");
            tx.add_announce(&skipped, &text)?;
            return Ok(());
        }
        if !tx.add_announce(&delivery(spawn_run, kind, requester.as_str(), DeliveryStatus::Delivered), &text)? {
            return Ok(());
        }
        if r.external {
            tx.append_message(
                r.id,
                &NewMessage::user_text(
                    &text,
                    Some(spawn_run.run_id.clone()),
                    provenance.clone(),
                    spawn_run.chain_id.clone(),
                ),
            )?;
        } else {
            let run_id = super::step_id(&spawn_run.run_id, "completion");
            tx.enqueue(&NewRun {
                run_id: run_id.clone(),
                session: r.id,
                mode: RunMode::Completion,
                input: json!({"role": "user", "content": format!("{COMPLETION_PREFIX}\n\n{text}")}),
                provenance: Some(provenance.clone()),
                requester_key: None,
                chain_id: spawn_run.chain_id.clone(),
                hop: spawn_run.hop,
                announce_kind: None,
                model: None,
                thinking: None,
                timeout_ms: None,
                extra: Some(Flow::Tagged(Tagged::Completion { child: child.key.to_string() }).to_json()),
            })?;
        }
        Ok(())
    })?;
    rt.wake();
    finish(rt, child, spawn_run)
}

/// The child's worktree at its end: removed with `cleanup: "delete"` when it holds no work, else
/// kept; the announce's line for it says which.
fn settle_worktree(spawn_run: &RunRow) -> Option<String> {
    let flow = Flow::of(spawn_run.extra.as_ref())?;
    let spawn = flow.spawn()?;
    let wt = spawn.worktree.as_ref()?;
    let settled = crate::runner::worktree::settle(wt, spawn.cleanup == Cleanup::Delete);
    Some(crate::runner::worktree::settled_line(wt, &settled))
}

/// A driven requester consumed a child's announce when the completion run that carried it ended
/// well: the announce is `read`.
pub fn completion_read(rt: &Scheduler, run: &RunRow, result: &TurnResult) -> Result<(), StoreError> {
    let Some(Flow::Tagged(Tagged::Completion { child })) = Flow::of(run.extra.as_ref()) else { return Ok(()) };
    if result.status != RunStatus::Ok {
        return Ok(());
    }
    let Some(row) = rt.store.session_by_key(&SessionKey::from_canonical(child))? else { return Ok(()) };
    match &row.spawn_run {
        Some(spawn_run) => rt.store.mark_announces_read(&[spawn_run.as_str()]),
        None => Ok(()),
    }
}

fn delivery<'a>(run: &'a RunRow, kind: DeliveryKind, target: &'a str, status: DeliveryStatus) -> NewDelivery<'a> {
    NewDelivery {
        run_id: &run.run_id,
        kind,
        mode: DeliveryMode::Inbox,
        status,
        target_key: target,
        channel: None,
        last_error: None,
    }
}

/// The flow ends: mark announced, then delete now or archive later.
fn finish(rt: &Scheduler, child: &SessionRow, spawn_run: &RunRow) -> Result<(), StoreError> {
    let flow = Flow::of(spawn_run.extra.as_ref());
    let delete = flow.as_ref().and_then(Flow::spawn).is_some_and(|s| s.cleanup == Cleanup::Delete);
    let minutes = rt.config.agents.defaults.subagents.archive_after_minutes;
    let mut archive_after = (minutes > 0.0).then_some((minutes * 60_000.0) as i64);
    // A session-mode child stays for its thread's follow-ups: its idle time decides.
    if let Some(b) = rt.store.thread_binding(child.id)?.filter(|b| b.mode == BindingMode::Session) {
        let now = crate::store::now_ms();
        archive_after = b.archive_due(now).map(|due| due - now);
    }
    if delete {
        remove_attachments(rt, spawn_run);
    }
    // A parent waiting for its last child hears of it through the completion run queued above;
    // a `subagents` wait counts a child finished from here, so it is woken now.
    rt.store.mark_announced(child.id, delete, archive_after)?;
    rt.wake();
    Ok(())
}

/// Removes a child's attachment directory (at delete or archive); the receipts stay on the run.
pub fn remove_attachments(rt: &Scheduler, spawn_run: &RunRow) {
    let flow = Flow::of(spawn_run.extra.as_ref());
    let Some(dir) = flow.as_ref().and_then(Flow::spawn).and_then(|s| s.attachments_path.as_deref()) else {
        return;
    };
    super::attachments::remove(std::path::Path::new(dir));
    let _ = rt.store.attachments_removed(&spawn_run.run_id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::attachments;

    fn plan<'a>(caller: &'a Caller, staged: &'a attachments::Staged) -> SpawnPlan<'a> {
        SpawnPlan { attachments: Some(staged), ..plain_plan(caller, Limits::default()) }
    }

    fn plain_plan(caller: &Caller, budget: Limits) -> SpawnPlan<'_> {
        SpawnPlan {
            caller,
            caller_channel: "webchat".into(),
            target_agent: AgentId::main(),
            task: "read a.txt",
            label: None,
            model: None,
            thinking: None,
            timeout_ms: None,
            cleanup_delete: false,
            sandboxed: false,
            depth: 1,
            max_depth: 1,
            chain_id: "chain".into(),
            hop: 0,
            idempotency: None,
            attachments: None,
            attachment_files: None,
            child_session_id: uuid::Uuid::new_v4().to_string(),
            budget,
            child_runner: crate::config::RunnerKind::Jsonl,
            thread: None,
            attach_as: None,
            project: None,
            worktree: None,
        }
    }

    /// Issue 19: fifty spawns at once under one root budget, round after round (1,000 rounds in
    /// the extended tier), never reserve more than the budget; each refused one asked more than
    /// was left in the end, and the root's reserved amount is exactly what its children hold.
    #[test]
    fn concurrent_spawns_never_reserve_more_than_the_requesters_budget() {
        const BUDGET: i64 = 10_000;
        let rounds = if std::env::var_os("SESSIONS_MCP_EXTENDED").is_some() { 1000 } else { 30 };
        let mut config = Config::default();
        config.session.budget = Some(crate::config::Budget { tokens: Some(BUDGET as u64), ..Default::default() });
        let sub = &mut config.agents.defaults.subagents;
        (sub.max_children_per_agent, sub.max_concurrent, sub.max_queued) = (1000, 1000, 1000);
        let caller = Caller::external_main();
        let dir = tempfile::tempdir().unwrap();
        for round in 0..rounds {
            let store = Store::open(&dir.path().join(format!("r{round}.db"))).unwrap();
            let root = crate::store::NewSession::new(
                caller.key.clone(),
                AgentId::main(),
                crate::keys::SessionKind::Main,
                true,
            );
            let root_id = store.insert_session(&root).unwrap().id;
            let asks: Vec<i64> = (0..50).map(|i| 100 + (i * 7919 + round * 104_729) % 900).collect();
            let granted: Vec<Option<i64>> = std::thread::scope(|s| {
                let handles: Vec<_> = asks
                    .iter()
                    .map(|&tokens| {
                        let (store, config, caller) = (&store, &config, &caller);
                        let budget = Limits { tokens: Some(tokens), ..Limits::default() };
                        s.spawn(move || start(store, config, &plain_plan(caller, budget)).ok().map(|_| tokens))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let total: i64 = granted.iter().flatten().sum();
            assert!(total <= BUDGET, "round {round}: reserved {total} of {BUDGET}");
            let left = BUDGET - total;
            for (asked, got) in asks.iter().zip(&granted) {
                assert!(got.is_some() || *asked > left, "round {round}: {asked} was refused with {left} left");
            }
            let account = store.budget_of(root_id).unwrap().expect("the root's account");
            assert_eq!(account.reserved.tokens, total, "round {round}");
            assert_eq!(store.all_sessions().unwrap().len(), 1 + granted.iter().flatten().count(), "round {round}");
        }
    }

    /// Issue 35 point 4: a CLI child's notes are the section after its answer's last `Notes:`
    /// line; nothing else is taken for one (nor the context that asks for it).
    #[test]
    fn a_reply_splits_at_its_last_notes_label() {
        assert_eq!(split_notes("Summary\n\nNotes: did a\nleft b"), Some(("Summary", "did a\nleft b")));
        assert_eq!(split_notes("done\n**Notes:** in out.txt\n"), Some(("done", "in out.txt")));
        assert_eq!(split_notes("done\n## notes: x"), Some(("done", "x")));
        assert_eq!(split_notes("a\nNotes: first\nb\nNotes: second"), Some(("a\nNotes: first\nb", "second")));
        assert_eq!(split_notes("Notes: only notes"), Some(("", "only notes")));
        assert_eq!(split_notes("the notes: are in a.txt\nnotesy: no\nNotes without a colon"), None);
        assert_eq!(split_notes(NOTES_IN_REPLY), None);
    }

    /// Issue 14 point 3: the files move inside the transaction, so a move that fails leaves
    /// neither a child nor a run nor the staged files.
    #[test]
    fn a_spawn_whose_files_cannot_be_placed_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("sessions.db")).unwrap();
        let config = Config::default();
        let caller = Caller::external_main();
        let files = attachments::validate(
            json!([{"name": "a.txt", "content": "hello"}]).as_array().unwrap(),
            &config.tools.sessions_spawn.attachments,
        )
        .unwrap();
        let workspace = dir.path().join("ws");
        let staged = attachments::stage(&workspace, &workspace, &files).unwrap();
        // Something already holds the final name, so the move fails.
        std::fs::create_dir_all(staged.path().join("squatter")).unwrap();
        let err = start(&store, &config, &plan(&caller, &staged)).unwrap_err();
        assert!(
            matches!(&err, Refused::Attachments(e) if e.contains("cannot move the attachments into place")),
            "{err:?}"
        );
        drop(staged);
        assert!(store.all_sessions().unwrap().is_empty(), "no child");
        assert!(store.run_counts().unwrap().is_empty(), "no run");
        let left: Vec<_> = std::fs::read_dir(workspace.join(".openclaw/attachments")).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "only the squatter's directory: {left:?}");
        // The same spawn with the name free commits the child and its placed files.
        let staged = attachments::stage(&workspace, &workspace, &files).unwrap();
        let spawned = start(&store, &config, &plan(&caller, &staged)).unwrap();
        assert!(staged.path().join("a.txt").is_file());
        staged.keep();
        assert_eq!(store.all_sessions().unwrap().len(), 1, "{spawned:?}");
    }
}
