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
                self.claim_all();
                if sweeps {
                    crate::engine::deliver_due(&self).await;
                }
                if last_renew.elapsed() > Duration::from_secs(5) {
                    let _ = self.store.renew_leases(&self.owner_id);
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
            if self.stop_claiming.is_cancelled() {
                return;
            }
            let claimed = match self.store.claim_ready(self.owner_id.as_str(), &caps) {
                Ok(claimed) if claimed.is_empty() => return,
                Ok(claimed) => claimed,
                Err(e) => return tracing::error!(error = %e, "claiming runs failed"),
            };
            for (run, input_seq) in claimed {
                let token = CancellationToken::new();
                self.active.lock().expect("active").insert(run.run_id.clone(), token.clone());
                let (tx, _) = broadcast::channel(256);
                self.progress.lock().expect("progress").insert(run.run_id.clone(), tx);
                let (steer_tx, steers) = mpsc::unbounded_channel();
                self.steers.lock().expect("steers").insert(run.run_id.clone(), steer_tx);
                tokio::spawn(self.clone().execute(run, input_seq, token, steers));
            }
            self.wake();
        }
    }

    async fn execute(
        self: Arc<Self>,
        run: RunRow,
        input_seq: i64,
        cancel: CancellationToken,
        steers: mpsc::UnboundedReceiver<Steer>,
    ) {
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
        self.active.lock().expect("active").remove(&run_id);
        self.progress.lock().expect("progress").remove(&run_id);
        self.steers.lock().expect("steers").remove(&run_id);
        match finished {
            Ok(outcome) => crate::engine::take_steps(&self, &run, &outcome),
            Err(e) => tracing::error!(run = %run_id, error = %e, "recording a run failed"),
        }
        self.wake();
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
