//! The runtime owner (docs/BEHAVIOUR.md, Runs): exactly one process per state dir runs runs, deliveries and
//! sweeps. It holds an exclusive lock on `<stateDir>/runtime.lock`; other processes serve tools,
//! commit queued runs, and wait for runs by reading their rows when the owner's events ([`link`])
//! or the store poll under them say something changed. A `daemon` has priority: it holds
//! `daemon.lock` for its life, `serve` never takes the runtime lock while a daemon is there, and a
//! `serve` owner that sees one stops claiming and hands over when its running runs end.
//!
//! With a shared database (PostgreSQL) every node — state dir — has its owner, and they all
//! claim from one queue; one owner at a time also takes the sweeps, the work that is nobody's
//! run ([`Store::hold_database_sweeps`]). A run is leased to its owner ([`RunOwner`]) and
//! renewed; a node that stops renewing loses its runs (`interrupted`, never re-run).
//!
//! The per-session FIFO and the caps live in the store (`Store::claim_ready`), so several processes
//! can never overlap runs of one session. A run is claimed `running` and executed by the
//! [`crate::runner::Runner`]; its outcome is committed in one transaction, then `flows` decide the
//! next step (reply-back, announce, deliveries).

pub mod link;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::access::Access;
use crate::config::Config;
use crate::runner::{InputAnswer, Runner, Steer};
use crate::store::{CancelRequest, Caps, RunOwner, RunRow, Store, StoreError};

/// How long a waiter sleeps between looks at a run row when no wake came.
const POLL_MIN: Duration = Duration::from_millis(50);
const POLL_MAX: Duration = Duration::from_secs(1);
/// How often the store's use is looked at, to give memory back after load.
const REST_TICK: Duration = Duration::from_secs(10);
/// Store operations in one tick above which it is load, not the background.
const LOAD_OPS: u64 = 1_000;
/// A run that ended this long ago without its steps taken lost them (a process died, or a step
/// failed); the owner's sweep takes them again.
const STEPS_GRACE_MS: i64 = 30_000;
/// How often an owner renews its lease on a shared database, and looks for its runs that have
/// no process behind them.
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How long an owner on a shared database keeps running its agents without a renewed lease:
/// well inside the lease ([`crate::store::LEASE_MS`], from the renewal's start), so that its
/// agents are stopped before another node may declare their runs interrupted.
const FENCE_AFTER: Duration = Duration::from_millis(crate::store::LEASE_MS as u64 - 5_000);
/// How often the fence looks at the lease's age.
const FENCE_TICK: Duration = Duration::from_secs(1);

/// Which kind of process this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `serve`: owns the runtime only while no daemon is there.
    Serve,
    /// `daemon`: always wants the runtime.
    Daemon,
}

/// Serves the owner's run socket at the path until the token is cancelled: run tokens call the
/// session tools back through it, and the processes that hold the key follow the owner's events
/// there ([`link`]). Whoever serves MCP provides it (`server::http::owner_socket`); the engine
/// only says when (this process became the owner) and until when (it stopped being).
pub type OwnerSocket = Box<dyn Fn(Arc<Scheduler>, PathBuf, link::OwnerKey, CancellationToken) + Send + Sync>;

/// The scheduler of one process (owner or not): it owns the runtime of the state dir while it
/// holds the lock, claims and runs runs, and wakes the waiters of this process.
pub struct Scheduler {
    /// The one store handle of the engine: only the engine writes runs, steps and deliveries.
    pub(super) store: Store,
    pub(super) config: Arc<Config>,
    /// The visibility façade, for the engine's own checks (a spawn's announce target).
    pub(super) access: Access,
    pub(super) state_dir: PathBuf,
    pub(super) runner: Runner,
    pub(super) owner_id: RunOwner,
    role: Role,
    owner: AtomicBool,
    /// This process takes the database's sweeps ([`Store::hold_database_sweeps`]): always the
    /// owner with SQLite, one owner of all the nodes with PostgreSQL.
    sweeper: AtomicBool,
    lock: Mutex<Option<File>>,
    _daemon_lock: Option<File>,
    /// `serve.lock`, shared for this process's life: a maintenance command that must be alone
    /// with the state dir (`migrate`) sees every serving process, owner or not.
    _presence: File,
    /// Wakes the scheduler and in-process waiters when something changed.
    pub(super) changed: Notify,
    /// Counts this process's wakes: the owner streams them to its followers, a follower posts
    /// them to the owner ([`link`]).
    woken: watch::Sender<u64>,
    /// Running runs of this process and how to cancel them.
    active: Mutex<HashMap<String, CancellationToken>>,
    /// Streamed text of running runs, for waiters in this process.
    progress: Mutex<HashMap<String, broadcast::Sender<String>>>,
    /// Where a running run of this process takes steers ([`crate::engine::steer`]).
    pub(super) steers: Mutex<HashMap<String, mpsc::UnboundedSender<Steer>>>,
    /// Steers offered to a running run and not settled yet, with the run they were offered to.
    pub(super) offered: Mutex<HashMap<i64, String>>,
    /// Open asks of this process's running turns: where their answer goes ([`crate::engine::ask`]).
    pub(super) asks: Mutex<HashMap<String, oneshot::Sender<InputAnswer>>>,
    /// (caller, ask id) → who the caller's last wait said may answer it ([`Scheduler::tell`]).
    pub(super) told: Mutex<HashMap<(String, String), crate::policy::Answerer>>,
    /// Stop claiming new runs (shutdown or hand-over).
    stop_claiming: CancellationToken,
    /// Claimed runs of this process whose agent's process has not started yet, since when:
    /// one that does not start within `runtime.startTimeoutSeconds` is ended.
    starting: Mutex<HashMap<String, std::time::Instant>>,
    /// Runs of remote agents taken over from a dead owner (already `active` here), waiting for
    /// the next claim round to start following their tasks again.
    resuming: Mutex<Vec<TakenOver>>,
    /// This owner's lease on a shared database, and the fence that stops its agents when it
    /// cannot be renewed.
    lease: Lease,
    /// Held across one claim, from the store's commit to the run's entry in `active`: shutdown
    /// takes it once after `stop_claiming`, so no claim is half done when it looks at `active`
    /// (a run committed `running` but not yet active was left behind, and the next owner
    /// interrupted it: CI, the three-server load test).
    claiming: Mutex<()>,
    shutting_down: AtomicBool,
    /// Stops the run socket when ownership ends.
    socket: Mutex<Option<CancellationToken>>,
    owner_socket: OwnerSocket,
}

/// An owner's lease as this process knows it ([`Scheduler::keep_lease`]).
struct Lease {
    /// When the last renewal that succeeded was sent: the lease lasts at least
    /// [`crate::store::LEASE_MS`] from then.
    renewed: Mutex<std::time::Instant>,
    /// The lease is older than [`FENCE_AFTER`]: this node's agents were stopped, and it
    /// claims nothing until a renewal succeeds.
    fenced: AtomicBool,
    /// The runs the fence stopped, until their end is recorded (saying why).
    stopped: Mutex<std::collections::HashSet<String>>,
}

/// What a wait ended with.
#[derive(Debug)]
pub enum Waited<T> {
    Finished(T),
    TimedOut,
    Cancelled,
}

impl Scheduler {
    /// Starts the runtime of this process: takes the runtime lock when it may, and keeps trying
    /// (so the process takes over when the owner dies).
    pub fn start(
        store: Store,
        config: Arc<Config>,
        state_dir: &Path,
        role: Role,
        owner_socket: OwnerSocket,
    ) -> Result<Arc<Scheduler>, String> {
        crate::privacy::create_private_dir(state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
        let presence = take_presence(state_dir)?;
        let daemon_lock = match role {
            Role::Daemon => Some(take_daemon_lock(state_dir)?),
            Role::Serve => None,
        };
        let rt = Arc::new(Scheduler {
            access: Access::new(store.clone(), config.clone()),
            store,
            config,
            state_dir: state_dir.to_path_buf(),
            runner: Runner::new().map_err(|e| format!("cannot find the sessions-mcp binary: {e}"))?,
            owner_id: RunOwner::new(&node_id(state_dir)?),
            role,
            owner: AtomicBool::new(false),
            sweeper: AtomicBool::new(false),
            lock: Mutex::new(None),
            _daemon_lock: daemon_lock,
            _presence: presence,
            changed: Notify::new(),
            woken: watch::Sender::new(0),
            active: Mutex::new(HashMap::new()),
            progress: Mutex::new(HashMap::new()),
            steers: Mutex::new(HashMap::new()),
            offered: Mutex::new(HashMap::new()),
            asks: Mutex::new(HashMap::new()),
            told: Mutex::new(HashMap::new()),
            starting: Mutex::new(HashMap::new()),
            resuming: Mutex::new(Vec::new()),
            lease: Lease {
                renewed: Mutex::new(std::time::Instant::now()),
                fenced: AtomicBool::new(false),
                stopped: Mutex::default(),
            },
            stop_claiming: CancellationToken::new(),
            claiming: Mutex::new(()),
            shutting_down: AtomicBool::new(false),
            socket: Mutex::new(None),
            owner_socket,
        });
        let woken = rt.woken.subscribe();
        if rt.try_become_owner() {
            rt.serve_socket();
        }
        tokio::spawn(link::forward_wakes(rt.clone(), woken));
        tokio::spawn(link::follow(rt.clone()));
        tokio::spawn(rt.clone().scheduler());
        tokio::spawn(wake_on_remote_commits(rt.clone()));
        tokio::spawn(give_back_memory(rt.store.clone()));
        if rt.store.is_shared() {
            Scheduler::keep_lease(&rt);
        }
        Ok(rt)
    }

    /// The visibility façade over this engine's store (for the owner's socket).
    pub fn access(&self) -> &Access {
        &self.access
    }

    pub fn is_owner(&self) -> bool {
        self.owner.load(Ordering::SeqCst)
    }

    /// Whether a daemon is alive (it holds daemon.lock).
    fn daemon_present(&self) -> bool {
        self.role != Role::Daemon && daemon_running(&self.state_dir)
    }

    /// Takes the runtime lock if it is free (and no daemon has priority). True when it did.
    fn try_become_owner(&self) -> bool {
        if self.is_owner() || self.stop_claiming.is_cancelled() || self.daemon_present() {
            return false;
        }
        let Ok(file) = open_lock(&self.state_dir.join("runtime.lock")) else { return false };
        if file.try_lock().is_err() {
            return false;
        }
        *self.lock.lock().expect("lock slot") = Some(file);
        self.owner.store(true, Ordering::SeqCst);
        tracing::info!(owner = %self.owner_id, "this process owns the runtime");
        self.recover();
        if !self.store.is_shared() {
            // Alone on the store, the owner is its only deliverer: one that died left these.
            let _ = self.store.requeue_running_deliveries();
        }
        true
    }

    /// Whether this process takes the database's sweeps now (asking for them if it does not).
    /// Taking them on a shared database takes over what the last sweeper left: its deliveries
    /// under way, and the runs of nodes that stopped renewing their leases.
    fn holds_sweeps(&self) -> bool {
        let held = match self.store.hold_database_sweeps() {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask for the database's sweeps");
                false
            }
        };
        let was = self.sweeper.swap(held, Ordering::SeqCst);
        if held && !was && self.store.is_shared() {
            tracing::info!(owner = %self.owner_id, "this node takes the database's sweeps");
            let _ = self.store.requeue_running_deliveries();
            self.interrupt_orphans();
        } else if was && !held {
            tracing::warn!(owner = %self.owner_id, "this node no longer takes the database's sweeps");
        }
        held
    }

    /// The owner's run socket: run tokens call the session tools back through it; the other
    /// processes follow this owner there with the key it publishes first.
    fn serve_socket(self: &Arc<Self>) {
        let key = match link::OwnerKey::publish(&self.state_dir) {
            Ok(key) => key,
            // Run tokens still work; the other processes watch the store instead of the events.
            Err(e) => {
                tracing::error!(error = %e, "cannot write the owner key; other processes will poll the store");
                link::OwnerKey::generate()
            }
        };
        let cancel = CancellationToken::new();
        *self.socket.lock().expect("socket slot") = Some(cancel.clone());
        (self.owner_socket)(self.clone(), self.socket_path(), key, cancel);
    }

    /// `<stateDir>/run/mcp.sock`.
    pub fn socket_path(&self) -> PathBuf {
        self.state_dir.join("run").join("mcp.sock")
    }

    fn release_ownership(&self) {
        if let Some(c) = self.socket.lock().expect("socket slot").take() {
            c.cancel();
        }
        self.owner.store(false, Ordering::SeqCst);
        self.sweeper.store(false, Ordering::SeqCst);
        self.store.release_database_sweeps();
        *self.lock.lock().expect("lock slot") = None;
        tracing::info!("runtime ownership released");
    }

    /// Runs whose owner died become `interrupted` (never re-run); their requesters learn it when
    /// the steps a dead owner left are taken. Alone on the store every ended run's steps not
    /// taken are a dead owner's; on a shared database another node may be taking them right
    /// now, so only the interrupted runs' are taken here (the sweeper catches up the rest).
    fn recover(&self) {
        let interrupted = self.interrupt_orphans();
        if !self.store.is_shared() {
            return crate::engine::catch_up(self, 0);
        }
        for run in interrupted {
            let ended = crate::engine::TurnResult { status: run.status, reply: None, silent: false };
            crate::engine::take_steps(self, &run, &ended);
        }
    }

    /// Interrupts the runs whose owner died ([`Store::interrupt_orphans`]) and kills what is
    /// left of those that ran on this node (another node's processes are that machine's).
    fn interrupt_orphans(&self) -> Vec<RunRow> {
        let orphans = match self.store.interrupt_orphans(&self.owner_id) {
            Ok(orphans) => orphans,
            Err(e) => {
                tracing::error!(error = %e, "recovery failed");
                return Vec::new();
            }
        };
        let (resumed, orphans): (Vec<_>, Vec<_>) = orphans.into_iter().partition(|o| o.resumed.is_some());
        for o in resumed {
            let (token, steers) = self.register(&o.run.run_id, std::time::Instant::now());
            let seq = o.resumed.unwrap_or_default();
            self.resuming.lock().expect("resuming").push((o.run, seq, token, steers));
        }
        let here: Vec<String> = orphans.iter().filter(|o| o.of_node).map(|o| o.run.run_id.clone()).collect();
        kill_leftover_groups(&self.store.supervisors(&here).unwrap_or_default());
        let runs: Vec<RunRow> = orphans.into_iter().map(|o| o.run).collect();
        for run in &runs {
            tracing::warn!(run = %run.run_id, why = run.error.as_deref().unwrap_or_default(), "run interrupted");
        }
        runs
    }

    /// Wakes the scheduler and waiters of this process, and the owner's or its followers'.
    pub fn wake(&self) {
        self.changed.notify_waiters();
        self.woken.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Another process committed something and posted a wake (this process owns the runtime):
    /// the scheduler looks at once, and the subscriptions here and at the followers read the
    /// store (an inbox append there is no change of this process's store).
    pub fn woken_by_follower(&self) {
        self.wake();
        self.store.announce_change();
    }

    async fn scheduler(self: Arc<Self>) {
        let mut last_renew = tokio::time::Instant::now();
        let mut last_sweep = tokio::time::Instant::now();
        let sweep_every = Duration::from_secs(self.config.agents.defaults.subagents.sweep_interval_seconds.max(1));
        loop {
            // Registered before the work below, so that a wake during it (a run that ends, a
            // send that queues) is not lost until the next tick.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shutting_down() {
                return; // `shutdown` finishes the running runs and releases the lock
            }
            if !self.is_owner() {
                if self.try_become_owner() {
                    self.serve_socket();
                }
            } else if self.daemon_present() && !self.stop_claiming.is_cancelled() {
                // A daemon is waiting: stop claiming, hand over once our runs end.
                self.hand_over().await;
                continue;
            } else if !self.stop_claiming.is_cancelled() {
                // Every owner runs its own runs; what is nobody's run is the sweeper's.
                let sweeps = self.holds_sweeps();
                if sweeps {
                    crate::engine::budget::stop_overtime(&self);
                }
                self.stop_flagged();
                crate::engine::steer::offer_pending(&self);
                crate::engine::ask::deliver_answers(&self);
                self.resume_remote_runs();
                self.claim_all();
                self.end_unstarted();
                if sweeps {
                    crate::engine::deliver_due(&self).await;
                }
                if last_renew.elapsed() > RENEW_EVERY {
                    self.end_runs_without_process();
                    if sweeps && self.store.is_shared() {
                        self.recover();
                    }
                    last_renew = tokio::time::Instant::now();
                }
                if sweeps && last_sweep.elapsed() >= sweep_every {
                    crate::engine::catch_up(&self, STEPS_GRACE_MS);
                    match self.store.archive_due() {
                        Ok(keys) if !keys.is_empty() => {
                            tracing::info!(count = keys.len(), "archived finished sub-agent sessions");
                            self.remove_archived_attachments(&keys);
                        }
                        Ok(_) => {}
                        Err(e) => tracing::error!(error = %e, "the archive sweep failed"),
                    }
                    last_sweep = tokio::time::Instant::now();
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    /// Attachment directories go with the archive.
    fn remove_archived_attachments(&self, keys: &[String]) {
        for key in keys {
            let key = crate::keys::SessionKey::from_canonical(key.clone());
            let Ok(Some(child)) = self.store.session_by_key(&key) else { continue };
            let Some(run_id) = &child.spawn_run else { continue };
            if let Ok(Some(run)) = self.store.run(run_id) {
                crate::engine::spawn::remove_attachments(self, &run);
            }
        }
    }

    async fn hand_over(&self) {
        tracing::info!("a daemon is waiting: handing the runtime over when running runs end");
        while !self.active.lock().expect("active").is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.release_ownership();
    }

    fn caps(&self) -> Caps {
        let config = &self.config;
        let per_agent = config
            .configured_agents()
            .into_iter()
            .map(|a| {
                let spec = crate::runner::resolve_runner(config, &a, &self.state_dir, &self.runner.exe);
                (a.to_string(), spec.map_or(1, |s| s.max_concurrent))
            })
            .collect();
        Caps {
            global: config.runtime.max_concurrent_runs,
            per_agent,
            default_agent: config.agents.defaults.runner.max_concurrent(),
            spawns: config.agents.defaults.subagents.max_concurrent,
        }
    }

    fn claim_all(self: &Arc<Self>) {
        let caps = self.caps();
        loop {
            let _claim = self.claiming.lock().expect("claim gate");
            if self.stop_claiming.is_cancelled() || self.fenced() {
                return;
            }
            let asked = std::time::Instant::now();
            let claimed = match self.store.claim_ready(self.owner_id.as_str(), &caps) {
                Ok(claimed) if claimed.is_empty() => return,
                Ok(claimed) => claimed,
                Err(e) => return tracing::error!(error = %e, "claiming runs failed"),
            };
            // A claim renews the owner's lease in its transaction.
            self.lease_renewed(asked);
            for (run, input_seq) in claimed {
                let (token, steers) = self.register(&run.run_id, asked);
                tokio::spawn(self.clone().execute(run, input_seq, token, steers));
            }
            self.wake();
        }
    }

    /// Makes `run_id` a run of this process (started at `asked`): its cancel token and steers.
    fn register(&self, run_id: &str, asked: std::time::Instant) -> (CancellationToken, mpsc::UnboundedReceiver<Steer>) {
        let token = CancellationToken::new();
        self.starting.lock().expect("starting").insert(run_id.to_string(), asked);
        self.active.lock().expect("active").insert(run_id.to_string(), token.clone());
        let (tx, _) = broadcast::channel(256);
        self.progress.lock().expect("progress").insert(run_id.to_string(), tx);
        let (steer_tx, steers) = mpsc::unbounded_channel();
        self.steers.lock().expect("steers").insert(run_id.to_string(), steer_tx);
        (token, steers)
    }

    /// Starts following again the remote tasks recovery took over.
    fn resume_remote_runs(self: &Arc<Self>) {
        let resuming = std::mem::take(&mut *self.resuming.lock().expect("resuming"));
        for (run, input_seq, token, steers) in resuming {
            tracing::info!(run = %run.run_id, task = run.remote_task_id.as_deref().unwrap_or_default(), "following the remote task of a run taken over");
            crate::engine::ask::withdraw_asks_of_taken_over(self, &run.run_id);
            tokio::spawn(self.clone().execute(run, input_seq, token, steers));
        }
    }

    async fn execute(
        self: Arc<Self>,
        run: RunRow,
        input_seq: i64,
        cancel: CancellationToken,
        steers: mpsc::UnboundedReceiver<Steer>,
    ) {
        stall_start_for_tests(&run).await;
        if !self.is_active(&run.run_id) {
            return; // its start took too long: it was ended meanwhile (`end_unstarted`)
        }
        let run_id = run.run_id.clone();
        let progress = self.progress.lock().expect("progress").get(&run_id).cloned();
        let on_delta = move |text: &str| {
            if let Some(tx) = &progress {
                let _ = tx.send(text.to_string());
            }
        };
        let (asks, asked) = mpsc::unbounded_channel();
        tokio::spawn(crate::engine::ask::serve_asks(self.clone(), run.clone(), asked));
        let finished = crate::engine::run_turn(&self, &run, input_seq, cancel, &on_delta, steers, asks).await;
        if let Ok(outcome) = &finished {
            let started = run.started_at.unwrap_or(run.created_at);
            let (ran, waited) = (crate::store::now_ms() - started, started - run.created_at);
            let agent = crate::metrics::agent_label(run.agent_id.as_str(), |a| self.config.names_agent(a));
            let mode = run.mode.as_str();
            crate::metrics::observe_run(&agent, outcome.status.as_str(), mode, ran as f64 / 1e3, waited as f64 / 1e3);
        }
        self.forget(&run_id);
        if !matches!(finished, Err(ref e) if !matches!(e, StoreError::NotRunning { .. })) {
            // Its end is recorded, here or by another node: the fence has nothing to say of it.
            self.lease.stopped.lock().expect("stopped").remove(&run_id);
        }
        match finished {
            Ok(outcome) => crate::engine::take_steps(&self, &run, &outcome),
            Err(StoreError::NotRunning { status, .. }) if status == crate::engine::turn::HANDED_OVER => {
                tracing::info!(run = %run_id, "left running at shutdown: {status}");
            }
            Err(e) => tracing::error!(run = %run_id, error = %e, "recording a run failed"),
        }
        self.wake();
    }

    /// Whether `run_id` is a run of this process that has not ended here.
    pub(super) fn is_active(&self, run_id: &str) -> bool {
        self.active.lock().expect("active").contains_key(run_id)
    }

    /// The agent's process of `run_id` started: its start is no longer timed.
    pub(super) fn agent_started(&self, run_id: &str) {
        self.starting.lock().expect("starting").remove(run_id);
    }

    /// Drops what this process kept for a run that ended here.
    fn forget(&self, run_id: &str) {
        self.active.lock().expect("active").remove(run_id);
        self.progress.lock().expect("progress").remove(run_id);
        self.steers.lock().expect("steers").remove(run_id);
        self.starting.lock().expect("starting").remove(run_id);
    }

    /// Ends the claimed runs whose agent did not start within `runtime.startTimeoutSeconds`
    /// (a start path that hangs, or a task that never ran): `interrupted`, never re-run, so
    /// that neither the session nor the slot stays taken by a run nothing runs.
    fn end_unstarted(self: &Arc<Self>) {
        let bound = Duration::from_secs(self.config.runtime.start_timeout_seconds.max(1));
        let late: Vec<String> = self
            .starting
            .lock()
            .expect("starting")
            .iter()
            .filter(|(_, since)| since.elapsed() > bound)
            .map(|(id, _)| id.clone())
            .collect();
        for run_id in late {
            let why = format!(
                "interrupted: claimed by node {} but its agent did not start within {} s; it was not re-run",
                self.owner_id.node(),
                bound.as_secs()
            );
            self.abandon(&run_id, why);
        }
    }

    /// Ends the runs `running` under this owner that no task of this process runs (a run
    /// whose task died, or one left behind by a claim): nothing else would, since their
    /// owner is alive and renews its lease.
    fn end_runs_without_process(self: &Arc<Self>) {
        // Under the claim gate: a run claimed but not yet in `active` is not one of them.
        let _claim = self.claiming.lock().expect("claim gate");
        let running = match self.store.running_under(self.owner_id.as_str()) {
            Ok(running) => running,
            Err(e) => return tracing::warn!(error = %e, "cannot look for runs without a process"),
        };
        for run_id in running.into_iter().filter(|id| !self.is_active(id)) {
            // A run the fence stopped while the database was out of reach ends saying so.
            let why = match self.was_fenced(&run_id) {
                true => self.fenced_why(),
                false => {
                    format!("interrupted: node {} had no process running it; it was not re-run", self.owner_id.node())
                }
            };
            self.abandon(&run_id, why);
        }
    }

    /// Ends `run_id` `interrupted` for `why` (its agent, if any, is stopped) and takes its steps.
    fn abandon(self: &Arc<Self>, run_id: &str, why: String) {
        tracing::error!(run = %run_id, why, "ending a run of this node");
        if let Some(token) = self.active.lock().expect("active").get(run_id) {
            token.cancel();
        }
        self.forget(run_id);
        self.lease.stopped.lock().expect("stopped").remove(run_id);
        let ended = crate::store::Finished::without_output(crate::store::RunStatus::Interrupted, why);
        if let Err(e) = self.store.finish_run(run_id, self.owner_id.as_str(), &ended) {
            return tracing::warn!(run = %run_id, error = %e, "recording the end of a run failed");
        }
        match self.store.run(run_id) {
            Ok(Some(run)) => {
                let result = crate::engine::TurnResult { status: run.status, reply: None, silent: false };
                crate::engine::take_steps(self, &run, &result);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(run = %run_id, error = %e, "its steps are left to the sweep"),
        }
        self.wake();
    }

    /// Keeps this owner's lease on a shared database from two threads of their own, so that
    /// neither a busy scheduler nor a store call that hangs holds them up: one renews it every
    /// [`RENEW_EVERY`]; the other stops this node's agents once the lease is older than
    /// [`FENCE_AFTER`] (self-fencing), and no run is claimed until a renewal succeeds.
    fn keep_lease(rt: &Arc<Self>) {
        let spawn = |name: &str, every: Duration, tick: fn(&Scheduler)| {
            let rt = Arc::downgrade(rt);
            let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
                loop {
                    std::thread::sleep(every);
                    let Some(rt) = rt.upgrade() else { return };
                    if rt.shutting_down() && rt.active.lock().expect("active").is_empty() {
                        return;
                    }
                    tick(&rt);
                }
            });
            if let Err(e) = thread {
                tracing::error!(error = %e, "cannot start the lease's threads");
            }
        };
        spawn("lease-renew", RENEW_EVERY, Scheduler::renew_lease);
        spawn("lease-fence", FENCE_TICK, Scheduler::fence);
    }

    fn renew_lease(&self) {
        if !self.is_owner() {
            return;
        }
        let asked = std::time::Instant::now();
        match self.store.renew_leases(&self.owner_id) {
            Ok(()) => self.lease_renewed(asked),
            Err(e) => tracing::warn!(error = %e, "renewing this node's lease failed"),
        }
    }

    /// The lease was renewed by a statement sent at `asked`.
    fn lease_renewed(&self, asked: std::time::Instant) {
        let mut renewed = self.lease.renewed.lock().expect("lease");
        *renewed = (*renewed).max(asked);
        drop(renewed);
        if self.lease.fenced.swap(false, Ordering::SeqCst) {
            tracing::warn!(owner = %self.owner_id, "this node's lease is renewed again: it claims runs again");
        }
    }

    fn fence(&self) {
        let age = self.lease.renewed.lock().expect("lease").elapsed();
        if !self.is_owner() || age < FENCE_AFTER {
            return;
        }
        let active = self.active.lock().expect("active");
        if !self.lease.fenced.swap(true, Ordering::SeqCst) {
            tracing::error!(owner = %self.owner_id, runs = active.len(), age_s = age.as_secs(), "{}", self.fenced_why());
        }
        let mut stopped = self.lease.stopped.lock().expect("stopped");
        for (run_id, token) in active.iter() {
            token.cancel();
            stopped.insert(run_id.clone());
        }
    }

    /// Whether this node stops its agents for want of a renewed lease.
    fn fenced(&self) -> bool {
        self.lease.fenced.load(Ordering::SeqCst)
    }

    /// Whether the fence stopped `run_id` (see [`Scheduler::fence`]).
    pub(super) fn was_fenced(&self, run_id: &str) -> bool {
        self.lease.stopped.lock().expect("stopped").contains(run_id)
    }

    /// Why a fenced node's runs ended.
    pub(super) fn fenced_why(&self) -> String {
        format!(
            "interrupted: its node {} could not renew its lease for {} s (the database out of reach); it stopped the run before another node could end it, and it was not re-run",
            self.owner_id.node(),
            FENCE_AFTER.as_secs()
        )
    }

    /// Asks `run_id` to stop (MCP `tasks/cancel`), from any process. A queued run ends
    /// `cancelled` here and now and takes the steps of an ended run (its requester learns it); a
    /// running one is stopped by its owner, which sees the request within one scheduler tick.
    pub fn cancel_run(&self, run_id: &str) -> Result<CancelRequest, StoreError> {
        let request = self.store.request_cancel(run_id)?;
        match &request {
            CancelRequest::Dequeued(run) => {
                let ended = crate::engine::TurnResult {
                    status: crate::store::RunStatus::Cancelled,
                    reply: None,
                    silent: false,
                };
                crate::engine::take_steps(self, run, &ended);
            }
            CancelRequest::Flagged => self.stop_flagged(),
            CancelRequest::AlreadyEnded => {}
        }
        self.wake();
        Ok(request)
    }

    /// Cancels this owner's running runs that were asked to stop.
    pub(super) fn stop_flagged(&self) {
        if !self.is_owner() {
            return;
        }
        let flagged = match self.store.cancel_requests(self.owner_id.as_str()) {
            Ok(ids) => ids,
            Err(e) => return tracing::error!(error = %e, "reading cancel requests failed"),
        };
        let active = self.active.lock().expect("active");
        for run_id in flagged {
            if let Some(token) = active.get(&run_id) {
                tracing::info!(run = %run_id, "cancelling a run on its requester's request");
                token.cancel();
            }
        }
    }

    /// Whether this process is shutting down (a cancelled run then ends `interrupted`).
    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Subscribes to a running run's streamed text (only runs of this process stream).
    pub fn subscribe(&self, run_id: &str) -> Option<broadcast::Receiver<String>> {
        self.progress.lock().expect("progress").get(run_id).map(|tx| tx.subscribe())
    }

    /// Waits for `run_id` to finish, up to `timeout`, or until `cancel` fires.
    pub async fn wait(
        &self,
        run_id: &str,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<Waited<Box<RunRow>>, StoreError> {
        self.wait_for(timeout, cancel, || Ok(self.store.run(run_id)?.filter(RunRow::is_finished).map(Box::new))).await
    }

    /// Waits until `check` answers something, up to `timeout`, or until `cancel` fires. `check`
    /// reads the store at each wake of this process — its own changes, and the owner's events
    /// when it follows one ([`link`]) — and, underneath, at a poll that backs off from 50 ms to
    /// 1 s (a gone owner, or a writer that wakes no one).
    pub async fn wait_for<T, E>(
        &self,
        timeout: Duration,
        cancel: &CancellationToken,
        mut check: impl FnMut() -> Result<Option<T>, E>,
    ) -> Result<Waited<T>, E> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut poll = POLL_MIN;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(done) = check()? {
                return Ok(Waited::Finished(done));
            }
            tokio::select! {
                _ = cancel.cancelled() => return Ok(Waited::Cancelled),
                _ = tokio::time::sleep_until(deadline) => return Ok(Waited::TimedOut),
                _ = &mut notified => {}
                _ = tokio::time::sleep(poll) => poll = (poll * 2).min(POLL_MAX),
            }
        }
    }

    /// After the client left (stdin EOF): keep running until nothing is queued or running, or
    /// `runtime.drainSeconds` passed; queued runs always stay queued for the next owner.
    pub async fn drain(&self) {
        let limit = Duration::from_secs(self.config.runtime.drain_seconds);
        let deadline = tokio::time::Instant::now() + limit;
        while self.is_owner() && tokio::time::Instant::now() < deadline {
            match self.store.unfinished_runs() {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.shutdown(false).await;
    }

    /// Stops claiming; with `cancel_running` (SIGTERM/SIGINT) cancels running runs, which end
    /// `interrupted`. Queued runs stay queued. Releases the lock when no run is left here.
    pub async fn shutdown(&self, cancel_running: bool) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.stop_claiming.cancel();
        // a claim under way finishes (its run is in `active` below); none starts after
        drop(self.claiming.lock().expect("claim gate"));
        if cancel_running {
            for token in self.active.lock().expect("active").values() {
                token.cancel();
            }
        }
        while !self.active.lock().expect("active").is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.is_owner() {
            self.release_ownership();
        }
    }
}

/// A run of a remote agent recovery took over: the run, its input's seq, its cancel token and
/// its steers, as a claim would have made them.
type TakenOver = (RunRow, i64, CancellationToken, mpsc::UnboundedReceiver<Steer>);

/// Once load is over — the first tick with no more store operations than the scheduler's own
/// background (about 20 a second), after more than that since the last time — the store's page
/// caches and the allocator's free pages go back to the OS. Without it RSS stayed near its peak
/// after load (glibc keeps freed memory in its arenas; BENCHMARKS.md, soak).
async fn give_back_memory(store: crate::store::Store) {
    let ops = || {
        let (reads, writes) = store.activity();
        reads + writes
    };
    let (mut last, mut given_back) = (ops(), ops());
    loop {
        tokio::time::sleep(REST_TICK).await;
        let now = ops();
        if now - last <= LOAD_OPS && now - given_back > LOAD_OPS {
            store.shrink_memory();
            trim_heap();
            given_back = now;
        }
        last = now;
    }
}

/// Returns the allocator's free pages to the OS, from every arena.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own free lists; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Another node committed to a shared database (work queued, a run ended, a cancel): the
/// scheduler looks at once rather than at its next tick. Ends with the store.
async fn wake_on_remote_commits(rt: Arc<Scheduler>) {
    let mut commits = rt.store.remote_changes();
    while commits.changed().await.is_ok() {
        rt.changed.notify_waiters();
    }
}

/// A fault for the tests (debug builds only): the runs of the agent that
/// `SESSIONS_MCP_FAULT_STALL_START` names never get past the start of their task, as a task
/// that is never polled again would (issue 37).
async fn stall_start_for_tests(run: &RunRow) {
    #[cfg(debug_assertions)]
    if std::env::var("SESSIONS_MCP_FAULT_STALL_START").is_ok_and(|agent| agent == run.agent_id.as_str()) {
        std::future::pending::<()>().await;
    }
    #[cfg(not(debug_assertions))]
    let _ = run;
}

/// Whether a daemon runs for `state_dir`: it holds `daemon.lock` exclusively for its life. The
/// look takes a *shared* lock for an instant, so two looks never see each other: with an
/// exclusive look, an owner that looked while another process was looking took that for a
/// daemon and handed its runtime over to nobody (CI, the three-server load test: the next
/// owner was a `serve` whose client killed it with a run still running).
pub fn daemon_running(state_dir: &Path) -> bool {
    match std::fs::File::open(state_dir.join("daemon.lock")) {
        Ok(f) => f.try_lock_shared().is_err(),
        Err(_) => false,
    }
}

/// This state dir's node id (`<stateDir>/node-id`, made once): `<host>-<6 hex>`, the part of
/// every run owner id that says which node ran a run. The hex keeps two state dirs of one
/// machine (or two machines of one name) apart.
fn node_id(state_dir: &Path) -> Result<String, String> {
    let path = state_dir.join("node-id");
    let shown = || path.display().to_string();
    let nonce = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let made = format!("{}-{nonce}", host_name());
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(mut file) => {
            use std::io::Write;
            file.write_all(made.as_bytes()).map_err(|e| format!("{}: {e}", shown()))?;
            return Ok(made);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", shown())),
    }
    // Another process may have just created it: its content comes with its write.
    for _ in 0..50 {
        let id = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", shown()))?;
        let id = id.trim();
        if !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-') {
            return Ok(id.to_string());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!("{}: not a node id (letters, digits, '.' and '-'): remove the file to make a new one", shown()))
}

/// This machine's name, kept to what a node id may hold.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let name = if ok {
        String::from_utf8_lossy(&buf[..buf.iter().position(|b| *b == 0).unwrap_or(0)]).into_owned()
    } else {
        String::new()
    };
    let kept: String = name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-').take(63).collect();
    if kept.is_empty() { "node".into() } else { kept }
}

/// The runtime of a state dir, held by a maintenance command (`migrate`) for as long as it lives:
/// no daemon starts and no `serve` becomes the owner meanwhile.
pub struct RuntimeHold {
    _daemon: File,
    _runtime: File,
    _presence: File,
}

/// Holds the runtime of `state_dir`, or says who owns it: a daemon (it holds `daemon.lock`), or a
/// `serve`/`daemon` that owns the runtime (`runtime.lock`).
///
/// `runtime.lock` is taken first: while a `serve` owns the runtime, `daemon.lock` is never
/// touched, since a `serve` owner that saw it held would take that for a daemon and hand its
/// runtime over to nobody. Once `runtime.lock` is ours no `serve` owns anything, and holding
/// `daemon.lock` too keeps a daemon from starting until the hold ends. Last, `serve.lock`: a
/// `serve` that does not own the runtime still writes (it queues runs), and one left running
/// when the owner went would become the next owner or write beside the hold; none starts
/// while it is held.
pub fn hold_runtime(state_dir: &Path) -> Result<RuntimeHold, String> {
    let shown = state_dir.display();
    let daemon_runs = || format!("a daemon runs for {shown}: stop it (and every serve) first");
    if daemon_running(state_dir) {
        return Err(daemon_runs());
    }
    let runtime = open_lock(&state_dir.join("runtime.lock"))?;
    if runtime.try_lock().is_err() {
        return Err(format!("a serve or daemon process owns the runtime of {shown}: stop it (and every serve) first"));
    }
    let daemon = take_daemon_lock(state_dir).map_err(|_| daemon_runs())?;
    let presence = open_lock(&state_dir.join("serve.lock"))?;
    if presence.try_lock().is_err() {
        return Err(format!(
            "a serve process runs for {shown} (not the runtime's owner, but it writes): stop it first"
        ));
    }
    Ok(RuntimeHold { _daemon: daemon, _runtime: runtime, _presence: presence })
}

/// `serve.lock`, shared, for a serving process's life (see [`hold_runtime`]).
fn take_presence(state_dir: &Path) -> Result<File, String> {
    let file = open_lock(&state_dir.join("serve.lock"))?;
    match file.try_lock_shared() {
        Ok(()) => Ok(file),
        Err(_) => Err(format!(
            "a maintenance command (migrate) holds {} alone: start again once it is done",
            state_dir.display()
        )),
    }
}

/// How long a starting daemon retries `daemon.lock` while other processes look at it (each look
/// holds a shared lock for an instant); a daemon that runs holds it for good.
const DAEMON_LOCK_PATIENCE: Duration = Duration::from_millis(500);

/// Takes `daemon.lock` for this daemon's life, or says a daemon already runs.
fn take_daemon_lock(state_dir: &Path) -> Result<File, String> {
    let file = open_lock(&state_dir.join("daemon.lock"))?;
    let deadline = std::time::Instant::now() + DAEMON_LOCK_PATIENCE;
    while file.try_lock().is_err() {
        if std::time::Instant::now() >= deadline {
            return Err("a daemon already runs for this state dir".to_string());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(file)
}

fn open_lock(path: &Path) -> Result<File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The start time of a process (field 22 of `/proc/<pid>/stat`), to tell a pid from a recycled one.
pub fn process_start_time(pid: i64) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(") ")?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Kills the process groups of supervisors that outlived their owner, if their start time
/// still matches (never a recycled pid).
fn kill_leftover_groups(supervisors: &[(i64, Option<i64>)]) {
    for (pid, start) in supervisors {
        if start.is_some() && process_start_time(*pid) == *start {
            // SAFETY: killpg has no memory-safety preconditions.
            unsafe {
                libc::killpg(*pid as i32, libc::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looks_at_the_daemon_lock_never_see_each_other_as_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!daemon_running(dir.path()), "no lock file: no daemon");
        let looking = open_lock(&dir.path().join("daemon.lock")).unwrap();
        looking.try_lock_shared().unwrap(); // another process, looking right now
        assert!(!daemon_running(dir.path()), "a look is not a daemon");
        drop(looking);
        let daemon = take_daemon_lock(dir.path()).unwrap();
        assert!(daemon_running(dir.path()), "a daemon that holds the lock is seen");
        assert!(take_daemon_lock(dir.path()).is_err(), "a second daemon is refused");
        drop(daemon);
        assert!(!daemon_running(dir.path()), "a daemon that left is gone");
    }

    #[test]
    fn a_starting_daemon_waits_out_a_look_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let looking = open_lock(&dir.path().join("daemon.lock")).unwrap();
        looking.try_lock_shared().unwrap();
        let look = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(looking);
        });
        assert!(take_daemon_lock(dir.path()).is_ok(), "the daemon starts once the look is over");
        look.join().unwrap();
    }

    #[test]
    fn a_held_runtime_keeps_daemons_and_owners_out_and_is_refused_while_either_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let daemon = take_daemon_lock(dir.path()).unwrap();
        let e = hold_runtime(dir.path()).err().unwrap();
        assert!(e.starts_with("a daemon runs for "), "{e}");
        drop(daemon);
        let owner = open_lock(&dir.path().join("runtime.lock")).unwrap();
        owner.try_lock().unwrap();
        let e = hold_runtime(dir.path()).err().unwrap();
        assert!(e.starts_with("a serve or daemon process owns the runtime of "), "{e}");
        assert!(!daemon_running(dir.path()), "the refused hold let daemon.lock go");
        drop(owner);
        let held = hold_runtime(dir.path()).unwrap();
        assert!(take_daemon_lock(dir.path()).is_err(), "no daemon starts while it is held");
        assert!(open_lock(&dir.path().join("runtime.lock")).unwrap().try_lock().is_err(), "no serve owns it");
        assert!(take_presence(dir.path()).is_err(), "no serve starts while it is held");
        drop(held);
        assert!(take_daemon_lock(dir.path()).is_ok());
    }

    #[test]
    fn a_serve_that_does_not_own_the_runtime_keeps_a_hold_out() {
        let dir = tempfile::tempdir().unwrap();
        let follower = take_presence(dir.path()).unwrap();
        let second = take_presence(dir.path()).unwrap();
        let e = hold_runtime(dir.path()).err().unwrap();
        assert!(e.starts_with("a serve process runs for "), "{e}");
        assert!(!daemon_running(dir.path()), "the refused hold let daemon.lock go");
        drop((follower, second));
        assert!(hold_runtime(dir.path()).is_ok(), "held once every serve is gone");
    }
}
