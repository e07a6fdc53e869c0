//! The store served from PostgreSQL: the [`Sql`] surface over a pooled connection, and the
//! read and write transactions `Store` runs its operations in.
//!
//! The store's operations are synchronous (the engine calls them from its tasks and threads as
//! it calls SQLite), while the driver is async. The driver's connections run on a small runtime
//! of their own; a statement is awaited with `futures::executor::block_on` on the caller's
//! thread, which only waits on the connection's channel (tokio-postgres' client side is
//! executor-agnostic), so no caller needs a runtime of its own and none is nested.
//!
//! Writes are ordered by the rows they lock ([`WriteOrder::RowLocks`]): every writer of the
//! engine's paths — the claim, a run's end, its live reports and meter, a send's commit, a
//! spawn's admission, steers, asks, cancels, a child's close, the flows' steps and deliveries —
//! locks what it decides on in the store's one order (idempotency row, session rows root to
//! leaf, run rows, budget accounts root to leaf, rows keyed to the run), or is one statement
//! that decides by itself; PostgreSQL ending one for a deadlock or a serialization failure runs
//! it again (docs/ARCHITECTURE.md, PostgreSQL). The few writes that decide over many runs or
//! sessions at once (the sweeps' archive and orphan interruption, `import`) keep SQLite's rule,
//! one writer at a time across every node ([`WriteOrder::Global`]: the transaction-scoped
//! advisory lock [`WRITE_LOCK`] first). Reads run in `REPEATABLE READ READ ONLY`
//! transactions: one snapshot for the whole closure, as SQLite's read transaction gives.

use std::future::Future;

use bytes::BytesMut;
use deadpool_postgres::{Object, Pool};
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::{PgError, PgTarget};
use crate::store::sql::{AfterPipeline, Answer, Arg, ArgValue, Cell, Dialect, Row, Sql, Statement, is_plain_select};
use crate::store::{Result, StoreError};

/// The advisory lock every write transaction holds until it ends (`"smcw"` in ASCII).
pub const WRITE_LOCK: i64 = 0x736d_6377;
/// The channel every commit notifies, with the committing process's id as payload.
pub const CHANGES_CHANNEL: &str = "sessions_mcp_changes";
/// How often a process that found [`SWEEP_LOCK`] taken asks again (on the connection it asked
/// on: no new connection, one statement). The sweeper that died is replaced within this much
/// more than the time its connection takes to be found closed.
const SWEEP_RETRY: std::time::Duration = std::time::Duration::from_secs(2);
/// The shortest time between two notifications of one process: the commits of a burst are
/// told of once per this much (the last of them by a notification of its own after it), since
/// every notifying commit takes PostgreSQL's cluster-wide notify lock at commit.
const NOTIFY_EVERY: std::time::Duration = std::time::Duration::from_millis(20);
/// How long a listener waits before it connects again after losing its connection.
const LISTEN_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// How many times a row-locked write is run when PostgreSQL keeps ending it for a serialization
/// failure or a deadlock ([`PgBackend::write_row_locked`]); the last failure is the caller's.
pub const CONFLICT_ATTEMPTS: u32 = 5;

/// The advisory lock the node that takes the database's sweeps holds for as long as it does
/// (`"smcr"`): every node runs agents, one at a time takes the work that is nobody's run.
pub const SWEEP_LOCK: i64 = 0x736d_6372;

/// A PostgreSQL store: its target, its pool and the runtime the pool's connections run on.
pub struct PgBackend {
    target: PgTarget,
    pool: Pool,
    /// The connection this process asks for [`SWEEP_LOCK`] on, and holds it on while it takes
    /// the sweeps: a connection of its own, so that the lock goes with the process (or the
    /// connection) when either dies.
    sweep_seat: std::sync::Mutex<Option<SweepSeat>>,
    /// One [`WriteOrder::Global`] writer of this process at a time, taken before a connection
    /// is: writers waiting for [`WRITE_LOCK`] while holding connections could leave none for the
    /// reads the writer holding it makes (as SQLite's side has one writer connection behind a
    /// mutex). Row-locked writers do not take it: they wait only on rows held by transactions
    /// under way, which already have their connections.
    write_gate: std::sync::Mutex<()>,
    /// This process, as the payload of its commits' notifications (its own are not news to it).
    process: String,
    /// When this process last notified, and whether a trailing notification is on its way.
    notices: std::sync::Arc<std::sync::Mutex<Notices>>,
    /// Always there until dropped (see `Drop`).
    runtime: Option<tokio::runtime::Runtime>,
}

/// The last `Store` clone may go away inside an async task, where a runtime cannot be dropped
/// (dropping waits for its threads): its threads are left to end on their own.
impl Drop for PgBackend {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl PgBackend {
    /// Connects to `target` and brings its schema to this build's version.
    pub fn open(target: PgTarget) -> std::result::Result<PgBackend, PgError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("postgres")
            .enable_all()
            .build()
            .map_err(|e| PgError::Backend { target: target.to_string(), detail: format!("no runtime: {e}") })?;
        let pool = {
            let target = target.clone();
            on(&runtime, async move { super::open(&target).await })?
        };
        let process = uuid::Uuid::new_v4().simple().to_string();
        Ok(PgBackend {
            target,
            pool,
            sweep_seat: Default::default(),
            write_gate: Default::default(),
            process,
            notices: Default::default(),
            runtime: Some(runtime),
        })
    }

    /// A connection of the pool, taken on the pool's runtime (connecting needs its reactor).
    fn client(&self) -> Result<Object> {
        let (pool, target) = (self.pool.clone(), self.target.clone());
        on(self.runtime(), async move { target.client(&pool).await }).map_err(StoreError::from)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives as long as the backend")
    }

    /// Takes [`SWEEP_LOCK`] for this process if no other holds it. True when this process
    /// holds it (now or already): false as soon as its connection is found closed. A process
    /// that found it taken asks again on the same connection, [`SWEEP_RETRY`] later (a scheduler
    /// asks at every tick).
    pub fn hold_sweeps(&self) -> Result<bool> {
        let mut seat = self.sweep_seat.lock().unwrap_or_else(|p| p.into_inner());
        if seat.as_ref().is_some_and(|s| s.client.is_closed()) {
            *seat = None;
        }
        match seat.as_ref() {
            Some(s) if s.held => return Ok(true),
            Some(s) if s.asked.elapsed() < SWEEP_RETRY => return Ok(false),
            _ => {}
        }
        let target = self.target.clone();
        let client = match seat.take() {
            Some(s) => s.client,
            None => on(self.runtime(), async move {
                let (client, connection) = target.connect_one().await?;
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        tracing::warn!(error = %e, "the connection holding the sweep lock ended");
                    }
                });
                Ok::<_, PgError>(client)
            })?,
        };
        let target = self.target.clone();
        let (client, held) = on(self.runtime(), async move {
            let held = client.query_one("SELECT pg_try_advisory_lock($1)", &[&SWEEP_LOCK]).await;
            (client, held.map(|r| r.get::<_, bool>(0)).map_err(|e| target.classify(&e)))
        });
        let held = held?;
        *seat = Some(SweepSeat { client, held, asked: std::time::Instant::now() });
        Ok(held)
    }

    /// Calls `changed` whenever another process commits to the database (`LISTEN` on
    /// [`CHANGES_CHANNEL`] on a connection of its own, connected again when it is lost; after a
    /// reconnect `changed` is called once, for what may have been missed meanwhile).
    pub fn listen(&self, changed: impl Fn() + Send + Sync + 'static) {
        let (target, me) = (self.target.clone(), self.process.clone());
        let changed: std::sync::Arc<dyn Fn() + Send + Sync> = std::sync::Arc::new(changed);
        self.runtime().spawn(async move {
            let mut first = true;
            loop {
                match listen_once(&target, &me, &changed, first).await {
                    Ok(()) => tracing::warn!("the change listener's connection ended; connecting again"),
                    Err(e) => tracing::warn!(error = %e, "the change listener failed; connecting again"),
                }
                first = false;
                tokio::time::sleep(LISTEN_RETRY).await;
            }
        });
    }

    /// Lets [`SWEEP_LOCK`] go (its connection closes).
    pub fn release_sweeps(&self) {
        self.sweep_seat.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Runs `f` in one read-only snapshot.
    ///
    /// Round trips saved: the `BEGIN` goes out with the first statement, and the end of the
    /// transaction is not waited for (a read changes nothing, so committing and rolling back are
    /// the same); the connection goes back to the pool once it is done, or is dropped from the
    /// pool if ending the transaction failed, so that no one gets a connection still in one.
    pub fn read<T>(&self, f: impl FnOnce(&dyn Sql) -> Result<T>) -> Result<T> {
        let client = self.client()?;
        let sql = PgSql::new(&client, &self.target, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
        let out = f(&sql);
        if sql.began() {
            self.runtime().spawn(async move {
                if let Err(e) = client.batch_execute("ROLLBACK").await {
                    tracing::warn!(error = %e, "ending a PostgreSQL read failed; its connection is dropped");
                    drop(Object::take(client));
                }
            });
        }
        out
    }

    /// Runs `f` in one write transaction; commits when it returns `Ok`. With `durable` false the
    /// commit does not wait for the WAL flush (`synchronous_commit off`, this transaction only):
    /// a record that matters only while this node's processes live. `order` says whether it
    /// takes [`WRITE_LOCK`] ([`WriteOrder`]).
    ///
    /// The other processes are told of the commit (a notification on [`CHANGES_CHANNEL`]) only
    /// when it changed a row and `news` says a waiter may care (not a lease renewal): a
    /// transaction that changed nothing wakes nobody, so that idle nodes do not wake each other
    /// in turn. Notifications are spaced by [`NOTIFY_EVERY`] ([`Notices`]). Also answers
    /// whether the transaction changed a row (this process's own watchers are told then).
    pub fn write<T, E>(
        &self,
        order: WriteOrder,
        durable: bool,
        news: bool,
        f: impl FnOnce(&dyn Sql) -> std::result::Result<T, E>,
    ) -> std::result::Result<(T, bool), E>
    where
        E: From<StoreError>,
    {
        self.write_once(order, durable, news, f).0
    }

    /// As [`PgBackend::write`] without [`WRITE_LOCK`] ([`WriteOrder::RowLocks`]), run again
    /// whole, up to [`CONFLICT_ATTEMPTS`] times, when PostgreSQL ended it for a serialization
    /// failure or a deadlock (40001, 40P01): the transaction was rolled back, so running `f`
    /// again is running it for the first time. Row-locked writers take their locks in one order
    /// (docs/ARCHITECTURE.md, PostgreSQL), so a deadlock needs a writer outside that order.
    pub fn write_row_locked<T, E>(
        &self,
        durable: bool,
        news: bool,
        f: impl Fn(&dyn Sql) -> std::result::Result<T, E>,
    ) -> std::result::Result<(T, bool), E>
    where
        E: From<StoreError>,
    {
        let mut attempt = 1;
        loop {
            let (out, conflicted) = self.write_once(WriteOrder::RowLocks, durable, news, &f);
            if !conflicted || attempt == CONFLICT_ATTEMPTS {
                return out;
            }
            tracing::debug!(attempt, "a row-locked write lost a race (serialization failure or deadlock); again");
            attempt += 1;
        }
    }

    /// One write transaction ([`PgBackend::write`]), and whether a statement of it failed for a
    /// serialization failure or a deadlock (it was rolled back; running it again may succeed).
    fn write_once<T, E>(
        &self,
        order: WriteOrder,
        durable: bool,
        news: bool,
        f: impl FnOnce(&dyn Sql) -> std::result::Result<T, E>,
    ) -> (std::result::Result<(T, bool), E>, bool)
    where
        E: From<StoreError>,
    {
        let mut begin = match order {
            WriteOrder::Global => "BEGIN".to_string(),
            WriteOrder::RowLocks => "BEGIN ISOLATION LEVEL READ COMMITTED".to_string(),
        };
        if !durable {
            begin.push_str("; SET LOCAL synchronous_commit = off");
        }
        if order == WriteOrder::Global {
            begin.push_str(&format!("; SELECT pg_advisory_xact_lock({WRITE_LOCK})"));
        }
        // Only the writers that wait for WRITE_LOCK queue here (see `write_gate`); a row-locked
        // writer waits at most for the rows it touches, held by transactions that go on.
        let _gate = (order == WriteOrder::Global).then(|| self.write_gate.lock().unwrap_or_else(|p| p.into_inner()));
        let client = match self.client() {
            Ok(client) => client,
            Err(e) => return (Err(E::from(e)), false),
        };
        let mut sql = PgSql::new(&client, &self.target, &begin);
        if news {
            sql.news = Some(CommitNews { notices: &self.notices, process: &self.process });
        }
        let out = f(&sql);
        if !sql.began() {
            return (out.map(|v| (v, false)), false); // no statement ran: there is nothing to commit
        }
        let (changed, conflicted) = (sql.changed.get(), sql.conflicted.get());
        let tell = news && changed;
        if let Some(ended) = sql.ended.get() {
            let still_to_tell = tell && !sql.told.get();
            drop(sql);
            return self.ended_in_pipeline(client, ended, out, changed, still_to_tell, conflicted);
        }
        // Delivered at commit, to every other process listening (a rollback sends nothing).
        let notify_now = tell && self.notices.lock().unwrap_or_else(|p| p.into_inner()).may_notify_now();
        let end = match &out {
            Ok(_) if notify_now => sql.batch(&format!("{}; COMMIT", notify_sql(&self.process))),
            Ok(_) => sql.batch("COMMIT"),
            Err(_) => sql.batch("ROLLBACK"),
        };
        drop(sql);
        if let Err(e) = end {
            // Whatever state the connection is left in, nobody else gets it.
            drop(Object::take(client));
            return (Err(E::from(e)), conflicted);
        }
        let value = match out {
            Ok(value) => value,
            Err(e) => return (Err(e), conflicted),
        };
        if tell && !notify_now {
            self.notify_later();
        }
        (Ok((value, changed)), false)
    }

    /// The end of a write whose last pipeline carried its `COMMIT` ([`AfterPipeline::Commit`]),
    /// and its notification unless one went out within [`NOTIFY_EVERY`] (`tell`: the commit is
    /// news that was not told of yet, by a notification after it, [`PgBackend::notify_later`]).
    fn ended_in_pipeline<T, E>(
        &self,
        client: Object,
        ended: Ended,
        out: std::result::Result<T, E>,
        changed: bool,
        tell: bool,
        conflicted: bool,
    ) -> (std::result::Result<(T, bool), E>, bool)
    where
        E: From<StoreError>,
    {
        if ended == Ended::Unknown {
            drop(Object::take(client)); // whatever state it is in, nobody else gets it
        }
        match (out, ended) {
            (Ok(value), Ended::Committed) => {
                if tell {
                    self.notify_later();
                }
                (Ok((value, changed)), false)
            }
            (Err(e), _) => (Err(e), conflicted),
            // The write went on as if its failed pipeline had committed: a bug, never its value.
            (Ok(_), _) => {
                let bug = "a write returned success after its committing pipeline failed";
                (Err(E::from(StoreError::Backend(bug.into()))), false)
            }
        }
    }

    /// Tells the other processes of a commit that was not, once [`NOTIFY_EVERY`] passed since
    /// the last notification (one for every commit in between): sent after the commit, so that
    /// whoever hears it sees what was committed.
    fn notify_later(&self) {
        let wait = {
            let mut notices = self.notices.lock().unwrap_or_else(|p| p.into_inner());
            if notices.trailing {
                return; // the one on its way tells of this commit too
            }
            notices.trailing = true;
            notices.last.map_or(std::time::Duration::ZERO, |at| NOTIFY_EVERY.saturating_sub(at.elapsed()))
        };
        let (pool, target, notices) = (self.pool.clone(), self.target.clone(), self.notices.clone());
        let notify = notify_sql(&self.process);
        self.runtime().spawn(async move {
            tokio::time::sleep(wait).await;
            {
                let mut notices = notices.lock().unwrap_or_else(|p| p.into_inner());
                notices.trailing = false;
                notices.last = Some(std::time::Instant::now());
            }
            // Lost only with the database: the waiters' polls read the store meanwhile.
            let sent = match target.client(&pool).await {
                Ok(client) => client.batch_execute(&notify).await.map_err(|e| target.classify(&e)),
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                tracing::warn!(error = %e, "telling the other nodes of a commit failed");
            }
        });
    }
}

/// How a write transaction is ordered against the others ([`PgBackend::write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOrder {
    /// Under [`WRITE_LOCK`], one at a time across every process: the engine's checks between
    /// statements hold as in one process.
    Global,
    /// `READ COMMITTED` without [`WRITE_LOCK`], for a write that keeps its own invariants by
    /// row locks and advisory locks of its own, taken in an order that cannot close a cycle
    /// with the locked writers (the claim, `run_queue::claim_locking_rows`), or that needs none
    /// (one statement on rows named by their key, nothing read first). Other processes' locked
    /// writes run meanwhile.
    RowLocks,
}

/// The spacing of one process's notifications ([`NOTIFY_EVERY`]).
#[derive(Default)]
struct Notices {
    /// When the last one was sent (or decided on).
    last: Option<std::time::Instant>,
    /// A notification for commits not told of yet is on its way.
    trailing: bool,
}

impl Notices {
    /// Whether a commit may carry its notification now (counted as sent): not when one went
    /// out less than [`NOTIFY_EVERY`] ago, nor while a trailing one is on its way.
    fn may_notify_now(&mut self) -> bool {
        let now = std::time::Instant::now();
        if self.trailing || self.last.is_some_and(|at| now.duration_since(at) < NOTIFY_EVERY) {
            return false;
        }
        self.last = Some(now);
        true
    }
}

/// The connection [`SWEEP_LOCK`] is asked for and held on ([`PgBackend::hold_sweeps`]).
struct SweepSeat {
    client: tokio_postgres::Client,
    /// Whether this process holds the lock.
    held: bool,
    /// When it was last asked for.
    asked: std::time::Instant,
}

/// One listening connection, until it ends: `changed` for every notification of another
/// process (and once at the start of a reconnection).
async fn listen_once(
    target: &PgTarget,
    me: &str,
    changed: &std::sync::Arc<dyn Fn() + Send + Sync>,
    first: bool,
) -> std::result::Result<(), PgError> {
    use futures::StreamExt;
    let (client, mut connection) = target.connect_one().await?;
    // The connection's messages are polled by a task of their own: that also carries the
    // client's LISTEN below.
    let (me, on_message) = (me.to_string(), changed.clone());
    let messages = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) if n.payload() != me => on_message(),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    client.batch_execute(&format!("LISTEN {CHANGES_CHANNEL}")).await.map_err(|e| target.classify(&e))?;
    if !first {
        changed();
    }
    match messages.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(target.classify(&e)),
        Err(e) => Err(PgError::Backend { target: target.to_string(), detail: e.to_string() }),
    }
}

/// Runs `fut` on `runtime` and waits for it on this thread, which may itself be a runtime's.
/// The answer comes back through a channel of std, not the task's `JoinHandle`: polled on a
/// thread of another runtime, a `JoinHandle` draws on that thread's task budget, and once a
/// task that makes many store calls in one poll has spent it, the handle defers its wake to a
/// scheduler that this blocked thread never returns to (a deadlock, seen under load).
fn on<T: Send + 'static>(runtime: &tokio::runtime::Runtime, fut: impl Future<Output = T> + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let task = runtime.spawn(async move {
        let _ = tx.send(fut.await);
    });
    match rx.recv() {
        Ok(value) => value,
        // The task ended without an answer: it panicked (or the runtime is shutting down).
        Err(_) => match futures::executor::block_on(task) {
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            _ => panic!("the PostgreSQL runtime stopped while a store call waited on it"),
        },
    }
}

/// A connection as the store's [`Sql`].
struct PgSql<'a> {
    client: &'a Object,
    target: &'a PgTarget,
    /// What begins the transaction, until the first statement takes it along (pipelined: one
    /// round trip for both); then None.
    opening: std::cell::RefCell<Option<String>>,
    /// Whether a statement changed a row (whether the commit is news to anyone).
    changed: std::cell::Cell<bool>,
    /// Whether a statement failed for a serialization failure or a deadlock.
    conflicted: std::cell::Cell<bool>,
    /// How a pipeline that ended the transaction ([`AfterPipeline::Commit`]) left it; None
    /// while it is open.
    ended: std::cell::Cell<Option<Ended>>,
    /// For a write whose commit is news ([`PgBackend::write`]'s `news`): how a pipeline that
    /// carries its commit notifies with it.
    news: Option<CommitNews<'a>>,
    /// Whether the commit's notification went out with it.
    told: std::cell::Cell<bool>,
}

/// How a pipeline carrying a write's commit notifies the other processes with it: as
/// [`PgBackend::write`] does at its commit, unless one went out within [`NOTIFY_EVERY`]. The
/// commit's statements are taken for changes (a pipeline that commits is a run's writes).
struct CommitNews<'a> {
    notices: &'a std::sync::Mutex<Notices>,
    process: &'a str,
}

/// The statement that tells the other processes of a commit of `process`'s.
fn notify_sql(process: &str) -> String {
    format!("SELECT pg_notify('{CHANGES_CHANNEL}', '{process}')")
}

/// How a transaction ended with its last pipeline ([`AfterPipeline::Commit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Committed,
    /// A statement or the commit failed: PostgreSQL rolled it back (a `COMMIT` in a failed
    /// transaction is a rollback), and the connection is ready for the next one.
    RolledBack,
    /// The commit's answer never came (the connection failed): what became of it is unknown,
    /// and the connection must not be used again.
    Unknown,
}

impl<'a> PgSql<'a> {
    fn new(client: &'a Object, target: &'a PgTarget, opening: &str) -> PgSql<'a> {
        PgSql {
            client,
            target,
            opening: std::cell::RefCell::new(Some(opening.to_string())),
            changed: std::cell::Cell::new(false),
            conflicted: std::cell::Cell::new(false),
            ended: std::cell::Cell::new(None),
            news: None,
            told: std::cell::Cell::new(false),
        }
    }

    /// Whether a statement ran, and with it the transaction began.
    fn began(&self) -> bool {
        self.opening.borrow().is_none()
    }

    /// Awaits `statement`, sent right after the transaction's opening if it has not been sent.
    fn run<T>(
        &self,
        statement: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
        sql: &str,
    ) -> Result<T> {
        let opening = self.opening.borrow_mut().take();
        let out = match opening {
            None => futures::executor::block_on(statement),
            Some(opening) => {
                // Both requests are written before either answer is read (the driver pipelines).
                let (begun, out) =
                    futures::executor::block_on(futures::future::join(self.client.batch_execute(&opening), statement));
                begun.map_err(|e| self.error(&e, &opening))?;
                out
            }
        };
        out.map_err(|e| self.error(&e, sql))
    }

    fn batch(&self, sql: &str) -> Result<()> {
        futures::executor::block_on(self.client.batch_execute(sql)).map_err(|e| self.error(&e, sql))
    }

    fn error(&self, e: &tokio_postgres::Error, sql: &str) -> StoreError {
        use tokio_postgres::error::SqlState;
        if e.code().is_some_and(|c| *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED)
        {
            self.conflicted.set(true);
        }
        let e = self.target.classify(e);
        tracing::debug!(error = %e, sql, "PostgreSQL statement failed");
        StoreError::from(e)
    }

    /// Sends `statements` (their `BEGIN` first if it has not gone out, a `COMMIT` last with
    /// [`AfterPipeline::Commit`]) before awaiting any answer: tokio-postgres writes a request
    /// when its future is first polled, and `join` polls them in order. Every answer is awaited,
    /// so that the connection is idle again whatever failed; the first failure in order is the
    /// cause (the ones after it are PostgreSQL refusing statements of a failed transaction).
    fn pipeline(&self, statements: &[Statement], after: AfterPipeline) -> Result<Vec<Answer>> {
        use futures::future::{OptionFuture, join_all};
        let texts: Vec<String> = statements.iter().map(|s| placeholders(s.sql())).collect();
        // Statements new to this connection are parsed first, together (once per connection).
        let prepared = futures::executor::block_on(join_all(texts.iter().map(|t| self.client.prepare_cached(t))));
        let prepared = prepared.into_iter().zip(&texts).map(|(p, t)| p.map_err(|e| self.error(&e, t)));
        let prepared = prepared.collect::<Result<Vec<_>>>()?;
        let values: Vec<Vec<ArgValue>> = statements.iter().map(Statement::values).collect();
        let queries = prepared.iter().zip(&values).map(|(stmt, values)| answer(self.client, stmt, values));
        let opening = self.opening.borrow_mut().take();
        let begin: OptionFuture<_> = opening.as_deref().map(|o| self.client.batch_execute(o)).into();
        // The notification is a request of its own: a failed transaction refuses it, and the
        // `COMMIT` after it still runs (as the rollback) and leaves the connection idle.
        let notify_sql = (after == AfterPipeline::Commit).then(|| self.notify_with_commit()).flatten();
        let notify: OptionFuture<_> = notify_sql.as_deref().map(|n| self.client.batch_execute(n)).into();
        let commit: OptionFuture<_> =
            (after == AfterPipeline::Commit).then(|| self.client.batch_execute("COMMIT")).into();
        let (begun, answers, _, committed) =
            futures::executor::block_on(futures::future::join4(begin, join_all(queries), notify, commit));
        let first_failure = match begun {
            Some(Err(e)) => Some(self.error(&e, opening.as_deref().unwrap_or_default())),
            _ => answers.iter().zip(&texts).find_map(|(a, t)| a.as_ref().err().map(|e| self.error(e, t))),
        };
        if let Some(committed) = committed {
            self.ended.set(Some(match (&committed, &first_failure) {
                (Err(e), _) if e.as_db_error().is_none() => Ended::Unknown,
                (Ok(()), None) => Ended::Committed,
                _ => Ended::RolledBack,
            }));
            if let (Err(e), None) = (committed, &first_failure) {
                return Err(self.error(&e, "COMMIT"));
            }
        }
        if let Some(e) = first_failure {
            return Err(e);
        }
        let mut out = Vec::with_capacity(answers.len());
        for (answer, text) in answers.into_iter().zip(&texts) {
            let (rows, tagged) = answer.expect("a failure was returned above");
            let rows = rows.iter().map(|r| row(r, text)).collect::<Result<Vec<_>>>()?;
            let changed = if is_plain_select(text) { 0 } else { tagged as usize };
            out.push(Answer { rows, changed });
        }
        if out.iter().any(|a| a.changed > 0) {
            self.changed.set(true);
        }
        Ok(out)
    }

    /// The notification a pipeline that commits sends before its `COMMIT`: for a write that is
    /// news, when one may go out now ([`CommitNews`]).
    fn notify_with_commit(&self) -> Option<String> {
        let news = self.news.as_ref()?;
        let mut notices = news.notices.lock().unwrap_or_else(|p| p.into_inner());
        notices.may_notify_now().then(|| {
            self.told.set(true);
            notify_sql(news.process)
        })
    }

    fn prepare(&self, sql: &str) -> Result<tokio_postgres::Statement> {
        let text = placeholders(sql);
        futures::executor::block_on(self.client.prepare_cached(&text)).map_err(|e| self.error(&e, &text))
    }
}

impl Sql for PgSql<'_> {
    fn execute(&self, sql: &str, args: &[&dyn Arg]) -> Result<usize> {
        let stmt = self.prepare(sql)?;
        let values: Vec<ArgValue> = args.iter().map(|a| a.arg()).collect();
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        let n = self.run(self.client.execute(&stmt, &params), sql)?;
        if n > 0 {
            self.changed.set(true);
        }
        Ok(n as usize)
    }

    fn rows(&self, sql: &str, args: &[&dyn Arg]) -> Result<Vec<Row>> {
        let stmt = self.prepare(sql)?;
        let values: Vec<ArgValue> = args.iter().map(|a| a.arg()).collect();
        let params: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
        let rows = self.run(self.client.query(&stmt, &params), sql)?;
        // A statement that returns rows changed them unless it is a plain SELECT (`INSERT …
        // RETURNING`, `UPDATE … RETURNING`); a `WITH` is taken for a change, to be safe.
        if !rows.is_empty() && !is_plain_select(sql) {
            self.changed.set(true);
        }
        rows.iter().map(|r| row(r, sql)).collect()
    }

    fn pipeline(&self, statements: &[Statement], after: AfterPipeline) -> Result<Vec<Answer>> {
        PgSql::pipeline(self, statements, after)
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
}

/// One statement of a pipeline, run: its rows and the count in its command tag (rows changed,
/// or selected for a `SELECT`). Its request is written at the first poll.
async fn answer(
    client: &Object,
    stmt: &tokio_postgres::Statement,
    values: &[ArgValue<'_>],
) -> std::result::Result<(Vec<tokio_postgres::Row>, u64), tokio_postgres::Error> {
    use futures::TryStreamExt;
    let params = values.iter().map(|v| v as &(dyn ToSql + Sync));
    let stream = client.query_raw(stmt, params).await?;
    futures::pin_mut!(stream);
    let mut rows = Vec::new();
    while let Some(r) = stream.try_next().await? {
        rows.push(r);
    }
    Ok((rows, stream.rows_affected().unwrap_or(0)))
}

/// SQLite's `?1` parameters as PostgreSQL's `$1` (a bare `?` takes the next number), outside
/// string literals and quoted names.
pub fn placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut quote: Option<char> = None;
    let mut next = 0;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                out.push(c);
            }
            (Some(_), c) => out.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                out.push(c);
            }
            (None, '?') => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                if digits.is_empty() {
                    next += 1;
                    digits = next.to_string();
                }
                out.push('$');
                out.push_str(&digits);
            }
            (None, c) => out.push(c),
        }
    }
    out
}

/// One result row as cells, by each column's type.
fn row(r: &tokio_postgres::Row, sql: &str) -> Result<Row> {
    let mut cells = Vec::with_capacity(r.len());
    for (i, column) in r.columns().iter().enumerate() {
        let bad = |e: tokio_postgres::Error| StoreError::Corrupt(format!("column {}: {e}", column.name()));
        let ty = column.type_();
        let cell = match *ty {
            Type::INT8 => r.try_get::<_, Option<i64>>(i).map_err(bad)?.map(Cell::Int),
            Type::INT4 => r.try_get::<_, Option<i32>>(i).map_err(bad)?.map(|v| Cell::Int(v.into())),
            Type::INT2 => r.try_get::<_, Option<i16>>(i).map_err(bad)?.map(|v| Cell::Int(v.into())),
            Type::BOOL => r.try_get::<_, Option<bool>>(i).map_err(bad)?.map(|v| Cell::Int(v.into())),
            Type::FLOAT8 => r.try_get::<_, Option<f64>>(i).map_err(bad)?.map(Cell::Real),
            Type::FLOAT4 => r.try_get::<_, Option<f32>>(i).map_err(bad)?.map(|v| Cell::Real(v.into())),
            Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR | Type::UNKNOWN => {
                r.try_get::<_, Option<String>>(i).map_err(bad)?.map(Cell::Text)
            }
            Type::BYTEA => r.try_get::<_, Option<Vec<u8>>>(i).map_err(bad)?.map(Cell::Blob),
            // A programming error, named so that the statement can be given a cast.
            _ => {
                return Err(StoreError::Corrupt(format!(
                    "column {} of `{sql}` has PostgreSQL type {ty}, which the store does not read (cast it)",
                    column.name()
                )));
            }
        };
        cells.push(cell.unwrap_or(Cell::Null));
    }
    Ok(Row::new(cells))
}

/// A value goes into a parameter of whatever type PostgreSQL inferred for it: an integer into
/// BIGINT, INTEGER, SMALLINT, BOOLEAN (SQLite keeps booleans as 0/1) or a float column.
impl ToSql for ArgValue<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match (self, ty) {
            (ArgValue::Null, _) => Ok(IsNull::Yes),
            (ArgValue::Int(v), &Type::INT8) => v.to_sql(ty, out),
            (ArgValue::Int(v), &Type::INT4) => i32::try_from(*v)?.to_sql(ty, out),
            (ArgValue::Int(v), &Type::INT2) => i16::try_from(*v)?.to_sql(ty, out),
            (ArgValue::Int(v), &Type::BOOL) => (*v != 0).to_sql(ty, out),
            (ArgValue::Int(v), &Type::FLOAT8) => (*v as f64).to_sql(ty, out),
            (ArgValue::Int(v), &Type::TEXT | &Type::VARCHAR) => v.to_string().to_sql(ty, out),
            (ArgValue::Real(v), &Type::FLOAT8) => v.to_sql(ty, out),
            (ArgValue::Real(v), &Type::FLOAT4) => (*v as f32).to_sql(ty, out),
            (ArgValue::Text(v), _) if <&str as ToSql>::accepts(ty) => v.as_ref().to_sql(ty, out),
            (ArgValue::Blob(v), &Type::BYTEA) => v.to_sql(ty, out),
            (v, ty) => Err(format!("a {} value cannot go into a parameter of type {ty}", kind(v)).into()),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

fn kind(v: &ArgValue) -> &'static str {
    match v {
        ArgValue::Null => "NULL",
        ArgValue::Int(_) => "integer",
        ArgValue::Real(_) => "real",
        ArgValue::Text(_) => "text",
        ArgValue::Blob(_) => "blob",
    }
}

impl From<PgError> for StoreError {
    fn from(e: PgError) -> Self {
        match e {
            PgError::Unreachable { .. } => StoreError::Unavailable(e.to_string()),
            e => StoreError::Backend(Box::new(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::with_test_database;
    use crate::store::sql::args;
    use crate::store::{NewMessage, NewSession, Store};

    fn session(key: &str) -> NewSession {
        use crate::keys::{AgentId, SessionKey, SessionKind};
        NewSession::new(SessionKey::from_canonical(key), AgentId::parse("main").unwrap(), SessionKind::Other, false)
    }

    /// A pipeline answers each of its statements in order (rows, rows changed; none for a
    /// locking `SELECT`), and one ending in its commit commits all of it; one whose statement
    /// failed leaves nothing, fails with that statement's error (not the refusals of the ones
    /// after it), and leaves its connection ready for the next write. Another process hears of
    /// a pipelined commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_pipeline_answers_each_statement_and_its_commit_keeps_all_or_nothing() {
        use crate::store::Survives;
        use crate::store::sql::{AfterPipeline, Statement};
        with_test_database(async |target| {
            let (dir, other_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let store = Store::open_postgres(target.clone(), dir.path()).unwrap();
            let other = Store::open_postgres(target, other_dir.path()).unwrap();
            let mut heard = other.remote_changes();
            store.write(|tx| tx.insert_session(&session("agent:main:a"))).unwrap();
            let key = crate::keys::SessionKey::from_canonical("agent:main:a");
            let id = store.session_by_key(&key).unwrap().unwrap().id;
            let label = |l: &str| Statement::new("UPDATE sessions SET label = ?2 WHERE id = ?1", args![id, l]);
            let stored =
                || -> String { store.read(|c| c.one("SELECT label FROM sessions WHERE id = ?1", args![id])).unwrap() };
            let pipeline = [
                Statement::new("SELECT id FROM sessions WHERE id = ?1 FOR UPDATE", args![id]),
                label("one"),
                Statement::new(
                    "UPDATE sessions SET label = label || ?2 WHERE id = ?1 RETURNING label",
                    args![id, "+two"],
                ),
                Statement::new("UPDATE sessions SET label = 'x' WHERE id < 0", args![]),
            ];
            let answers = store
                .write_sql_row_locked(Survives::PowerLoss, true, |tx| tx.pipeline(&pipeline, AfterPipeline::Commit))
                .unwrap();
            assert_eq!(answers.iter().map(|a| a.changed).collect::<Vec<_>>(), [0, 1, 1, 0]);
            assert_eq!(answers[0].rows[0].get::<i64>(0).unwrap(), id);
            assert_eq!(answers[2].rows[0].get::<String>(0).unwrap(), "one+two");
            assert_eq!(stored(), "one+two", "committed with the pipeline");
            // The listener may connect after the first commit: pipelined commits until it hears one.
            for i in 0.. {
                let again = [label(&format!("one+two{i}"))];
                store
                    .write_sql_row_locked(Survives::PowerLoss, true, |tx| tx.pipeline(&again, AfterPipeline::Commit))
                    .unwrap();
                if tokio::time::timeout(std::time::Duration::from_millis(200), heard.changed()).await.is_ok() {
                    break;
                }
                assert!(i < 50, "the other process never heard a pipelined commit");
            }
            store
                .write_sql_row_locked(Survives::PowerLoss, true, |tx| {
                    tx.pipeline(&pipeline[1..3], AfterPipeline::Commit)
                })
                .unwrap();

            let failing =
                [label("three"), Statement::new("INSERT INTO sessions (id) VALUES (?1)", args![id]), label("four")];
            for after in [AfterPipeline::Commit, AfterPipeline::Open] {
                let failed = store
                    .write_sql_row_locked(Survives::PowerLoss, true, |tx| tx.pipeline(&failing, after))
                    .unwrap_err()
                    .to_string();
                assert!(failed.contains("violates"), "the failed statement's own error: {failed}");
                assert_eq!(stored(), "one+two", "nothing of a failed pipeline stays ({after:?})");
            }
            store.write(|tx| tx.insert_session(&session("agent:main:b"))).unwrap();
            let opened = store
                .write_sql_row_locked(Survives::PowerLoss, true, |tx| -> Result<usize> {
                    tx.pipeline(&[label("five")], AfterPipeline::Open)?;
                    tx.execute("UPDATE sessions SET label = label || '!' WHERE id = ?1", args![id])
                })
                .unwrap();
            assert_eq!((opened, stored()), (1, "five!".to_string()), "an open pipeline's transaction goes on");
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_store_reads_back_what_it_wrote_and_a_failed_write_leaves_nothing() {
        with_test_database(async |target| {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_postgres(target, dir.path()).unwrap();
            let key = crate::keys::SessionKey::from_canonical("agent:main:main");
            store
                .write(|tx| -> Result<()> {
                    tx.insert_session(&session(key.as_str()))?;
                    let id = tx.session_id(&key)?;
                    for text in ["one", "two"] {
                        tx.append_message(id, &NewMessage::user_text(text, None, serde_json::json!({}), None))?;
                    }
                    Ok(())
                })
                .unwrap();
            let before = store.fingerprint().unwrap();
            let failed = store.write(|tx| -> Result<()> {
                let id = tx.session_id(&key)?;
                tx.append_message(id, &NewMessage::user_text("three", None, serde_json::json!({}), None))?;
                Err(StoreError::Corrupt("made to fail".into()))
            });
            assert!(failed.is_err());
            assert_eq!(store.fingerprint().unwrap(), before, "the failed write was rolled back whole");
            assert_eq!(store.last_seq_of(&key).unwrap(), 2);
            assert!(store.session_by_key(&key).unwrap().is_some());
        })
        .await;
    }

    /// A list page's tails in one statement are the tails read one session at a time: the
    /// visible messages only, the newest `limit`, oldest first, in the order the ids were given.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_list_tails_in_one_statement_are_each_sessions_own_tail() {
        with_test_database(async |target| {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_postgres(target, dir.path()).unwrap();
            let keys: Vec<String> = (0..4).map(|i| format!("agent:main:t{i}")).collect();
            store
                .write(|tx| -> Result<()> {
                    for (i, key) in keys.iter().enumerate() {
                        tx.insert_session(&session(key))?;
                        let id = tx.session_id(&crate::keys::SessionKey::from_canonical(key.clone()))?;
                        for n in 0..i * 2 {
                            let mut m = NewMessage::user_text(&format!("m{n}"), None, serde_json::json!({}), None);
                            if n % 3 == 1 {
                                m.role = "toolResult".into();
                            }
                            m.silent = n % 4 == 3;
                            tx.append_message(id, &m)?;
                        }
                    }
                    Ok(())
                })
                .unwrap();
            let mut ids: Vec<i64> = keys
                .iter()
                .map(|k| store.session_by_key(&crate::keys::SessionKey::from_canonical(k.clone())).unwrap().unwrap().id)
                .collect();
            ids.reverse();
            let seqs = |rows: &[crate::store::MessageRow]| rows.iter().map(|m| m.seq).collect::<Vec<_>>();
            let tails = store.last_messages(&ids, 2).unwrap();
            assert_eq!(tails.len(), ids.len());
            for (id, tail) in ids.iter().zip(&tails) {
                assert_eq!(seqs(tail), seqs(&store.history_tail(*id, 2, false).unwrap().messages), "session {id}");
            }
            assert!(tails.last().unwrap().is_empty(), "a session without messages has an empty tail");
            assert!(store.last_messages(&[], 2).unwrap().is_empty());
        })
        .await;
    }

    fn finished_ok() -> crate::store::Finished {
        crate::store::Finished {
            status: crate::store::RunStatus::Ok,
            reply: Some("done".into()),
            messages: vec![],
            usage: None,
            cost: None,
            model: None,
            error: None,
            exit_status: Some(0),
            external_session_id: None,
            cli_usage_total: None,
        }
    }

    /// Three nodes (three stores on one database), three claimers each, claiming and finishing a
    /// queue of sends and spawns over three agents in 11 sessions: every run claimed once, never
    /// two running in one session, each session's runs started in the order they were queued,
    /// and no cap ever over: the per-agent and spawn caps over all nodes, the global cap per
    /// owner. The claims hold no global lock (`claim_locking_rows`), so they race for real.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_claimers_on_three_nodes_never_share_a_run_overlap_a_session_break_its_order_or_exceed_a_cap() {
        use crate::keys::{AgentId, SessionKey, SessionKind};
        use crate::store::{Caps, NewRun, RunMode, RunOwner};
        const RUNS: usize = 90;
        with_test_database(async |target| {
            let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            nodes[0]
                .write(|tx| -> Result<()> {
                    for n in 0..RUNS {
                        let (agent, mode) =
                            (["a", "b", "c"][n % 3], if n % 4 == 0 { RunMode::Spawn } else { RunMode::Send });
                        let key = SessionKey::from_canonical(format!("agent:{agent}:s{}", n % 11));
                        if tx.session_id(&key).is_err() {
                            tx.insert_session(&NewSession::new(
                                key.clone(),
                                AgentId::parse(agent).unwrap(),
                                SessionKind::Other,
                                false,
                            ))?;
                        }
                        let input = serde_json::json!({"role": "user", "content": format!("t{n}")});
                        tx.enqueue(&NewRun::new(format!("run-{n}"), tx.session_id(&key)?, mode, input))?;
                    }
                    Ok(())
                })
                .unwrap();
            let caps = Caps { global: 2, per_agent: [("a".to_string(), 2)].into(), default_agent: 3, spawns: 1 };
            let claimers: Vec<_> = (0..9)
                .map(|i| {
                    let (store, caps) = (nodes[i % 3].clone(), caps.clone());
                    std::thread::spawn(move || {
                        let owner = RunOwner::new(&format!("node{}", i % 3));
                        let mut mine = Vec::new();
                        for _ in 0..600 {
                            let claimed = store.claim_ready(owner.as_str(), &caps).unwrap();
                            assert_caps_hold(&store);
                            for (run, _) in claimed {
                                store.finish_run(&run.run_id, owner.as_str(), &finished_ok()).unwrap();
                                mine.push(run.run_id);
                            }
                            let queued =
                                store.read(|c| c.one::<i64>("SELECT count(*) FROM runs WHERE status = 'queued'", &[]));
                            if queued.unwrap() == 0 {
                                break;
                            }
                        }
                        mine
                    })
                })
                .collect();
            let mut all: Vec<String> = claimers.into_iter().flat_map(|c| c.join().unwrap()).collect();
            all.sort();
            let before = all.len();
            all.dedup();
            assert_eq!((before, all.len()), (RUNS, RUNS), "every run claimed once");
            // Each input is appended when its run is claimed: the transcript is the claim order.
            let inputs: Vec<(i64, String)> = nodes[1]
                .read(|c| {
                    c.query_map(
                        "SELECT session, run_id FROM messages WHERE role = 'user' ORDER BY session, seq",
                        args![],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                })
                .unwrap();
            assert_eq!(inputs.len(), RUNS, "each input appended once");
            let number = |run: &str| run.trim_start_matches("run-").parse::<usize>().unwrap();
            for pair in inputs.windows(2) {
                if pair[0].0 == pair[1].0 {
                    assert!(number(&pair[0].1) < number(&pair[1].1), "session {} out of order: {pair:?}", pair[0].0);
                }
            }
        })
        .await;
    }

    /// What runs now, read in one snapshot, is under every cap of the claim test above.
    fn assert_caps_hold(store: &Store) {
        let counts: Vec<(String, i64)> = store
            .read(|c| {
                c.query_map(
                    "SELECT 'agent ' || s.agent_id, count(*) FROM runs r JOIN sessions s ON s.id = r.session
                     WHERE r.status = 'running' GROUP BY s.agent_id
                     UNION ALL SELECT 'spawns', count(*) FROM runs WHERE status = 'running' AND mode = 'spawn'
                     UNION ALL SELECT 'owner ' || owner, count(*) FROM runs WHERE status = 'running' GROUP BY owner
                     UNION ALL SELECT 'session ' || session, count(*) FROM runs WHERE status = 'running' GROUP BY session",
                    args![],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
            })
            .unwrap();
        for (what, n) in &counts {
            let cap = match what.as_str() {
                "agent a" => 2,
                "spawns" => 1,
                w if w.starts_with("owner ") => 2,
                w if w.starts_with("session ") => 1,
                _ => 3,
            };
            assert!(*n <= cap, "{what}: {n} running, over its cap {cap} ({counts:?})");
        }
    }

    /// A claim, and the one-statement records of a run (lease, supervisor, steps mark, what it
    /// waits on), do not wait for the global write lock: with [`WRITE_LOCK`] held by another
    /// connection, a node still claims its queued run and records them, and a cancel of the run
    /// goes through too (a globally ordered write, the archiving sweep, waits, as before).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_claim_and_a_runs_own_records_go_through_while_another_connection_holds_the_global_write_lock() {
        use crate::keys::{AgentId, SessionKey, SessionKind};
        use crate::store::{Caps, NewRun, RunMode, RunOwner};
        with_test_database(async |target| {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_postgres(target.clone(), dir.path()).unwrap();
            let key = SessionKey::from_canonical("agent:main:s");
            store
                .write(|tx| -> Result<()> {
                    tx.insert_session(&NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false))?;
                    let input = serde_json::json!({"role": "user", "content": "go"});
                    tx.enqueue(&NewRun::new("run-0".into(), tx.session_id(&key)?, RunMode::Send, input))?;
                    Ok(())
                })
                .unwrap();
            let (holder, connection) = target.connect_one().await.unwrap();
            tokio::spawn(connection);
            holder.execute("SELECT pg_advisory_lock($1)", &[&WRITE_LOCK]).await.unwrap();
            let caps = Caps { global: 4, per_agent: Default::default(), default_agent: 4, spawns: 4 };
            let claimer = store.clone();
            let claim = tokio::task::spawn_blocking(move || {
                let owner = RunOwner::new("node0");
                let claimed = claimer.claim_ready(owner.as_str(), &caps).unwrap();
                claimer.renew_leases(&owner).unwrap();
                claimer.set_supervisor("run-0", 4242, Some(7)).unwrap();
                claimer.steps_taken("run-0").unwrap();
                claimer.set_waiting("run-0", Some("x")).unwrap();
                claimed
            });
            let claimed = tokio::time::timeout(std::time::Duration::from_secs(60), claim)
                .await
                .expect("the claim waited for the global write lock")
                .unwrap();
            assert_eq!(claimed.iter().map(|(r, _)| r.run_id.as_str()).collect::<Vec<_>>(), ["run-0"]);
            assert_eq!(store.supervisors(&["run-0".to_string()]).unwrap(), [(4242, Some(7))]);
            assert!(matches!(store.request_cancel("run-0").unwrap(), crate::store::CancelRequest::Flagged));
            let writer = store.clone();
            let write = tokio::task::spawn_blocking(move || writer.archive_due().map(|_| ()));
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            assert!(!write.is_finished(), "a locked write still waits for the global write lock");
            holder.execute("SELECT pg_advisory_unlock($1)", &[&WRITE_LOCK]).await.unwrap();
            write.await.unwrap().unwrap();
        })
        .await;
    }

    /// A root session with a token budget of `limit`, and `children` sessions under it, each with
    /// one run claimed (running under `owner`): (run id, session) of each, and the root's id.
    fn budget_tree(store: &Store, name: &str, limit: i64, children: usize, owner: &str) -> (Vec<(String, i64)>, i64) {
        use crate::keys::{AgentId, SessionKey, SessionKind};
        use crate::policy::budget::Limits;
        use crate::store::{Caps, NewRun, RunMode};
        let root_key = SessionKey::from_canonical(format!("agent:main:{name}"));
        let root = store
            .write(|tx| -> Result<i64> {
                tx.insert_session(&NewSession::new(root_key.clone(), AgentId::main(), SessionKind::Other, false))?;
                let root = tx.session_id(&root_key)?;
                tx.set_root_budget(root, &Limits { tokens: Some(limit), cost_micros: None, runtime_ms: None })?;
                for i in 0..children {
                    let key = SessionKey::from_canonical(format!("agent:main:subagent:{name}-{i}"));
                    let mut child = NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false);
                    child.spawned_by = Some(root_key.clone());
                    tx.insert_session(&child)?;
                    let input = serde_json::json!({"role": "user", "content": "go"});
                    tx.enqueue(&NewRun::new(format!("{name}-run-{i}"), tx.session_id(&key)?, RunMode::Send, input))?;
                }
                Ok(root)
            })
            .unwrap();
        let caps = Caps { global: 64, per_agent: Default::default(), default_agent: 64, spawns: 64 };
        let mut runs: Vec<(String, i64)> =
            store.claim_ready(owner, &caps).unwrap().into_iter().map(|(r, _)| (r.run_id, r.session)).collect();
        runs.sort();
        assert_eq!(runs.len(), children, "every child's run claimed");
        (runs, root)
    }

    /// Live reports and ends of runs drawing on one account, from three nodes at once, with no
    /// global lock: every settle is counted once, and the reports that take the tree over its
    /// limit are seen to (the account is marked exceeded, nothing more starts on it). Without
    /// the account locks, concurrent reports each read a sum without the others' and none
    /// crosses (seen: the test fails then).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_live_reports_and_ends_on_three_nodes_at_once_never_pass_a_budget_unseen() {
        use crate::store::{Meter, RunStatus};
        const CHILDREN: usize = 9;
        with_test_database(async |target| {
            let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            for round in 0..6 {
                let owner = "node0:1:x";
                // 9 reports of 120 against 1,000: only together do they cross. One child more
                // starts once they did.
                let (mut runs, root) = budget_tree(&nodes[0], &format!("r{round}"), 1_000, CHILDREN + 1, owner);
                let (late, late_session) = runs.pop().unwrap();
                for (run, session) in &runs {
                    assert_eq!(nodes[0].start_meter(run, *session, None).unwrap(), Meter::Drawing);
                }
                let runs: Vec<String> = runs.into_iter().map(|(r, _)| r).collect();
                let start = std::sync::Arc::new(std::sync::Barrier::new(CHILDREN));
                let workers: Vec<_> = runs
                    .iter()
                    .enumerate()
                    .map(|(i, run)| {
                        let (store, run, start) = (nodes[i % 3].clone(), run.clone(), start.clone());
                        std::thread::spawn(move || {
                            start.wait();
                            let crossed = store.record_usage(&run, &serde_json::json!({"inputTokens": 120})).unwrap();
                            let mut end = finished_ok();
                            end.usage = Some(serde_json::json!({"inputTokens": 120}));
                            store.finish_run(&run, owner, &end).unwrap();
                            matches!(crossed, crate::store::Recorded::Crossed(_))
                        })
                    })
                    .collect();
                let crossings = workers.into_iter().map(|w| w.join().unwrap()).filter(|&crossed| crossed).count();
                assert!(crossings >= 1, "round {round}: the reports went over the budget and none saw it");
                let account = nodes[1].budget_of(root).unwrap().unwrap();
                assert_eq!(account.spent.tokens, 120 * CHILDREN as i64, "round {round}: every end settled once");
                assert!(account.exceeded.is_some(), "round {round}: the account is marked exceeded");
                for run in &runs {
                    assert_eq!(nodes[2].run(run).unwrap().unwrap().status, RunStatus::Ok);
                }
                let refused = nodes[2].start_meter(&late, late_session, None).unwrap();
                assert!(matches!(refused, Meter::Exhausted(_)), "round {round}: {refused:?}");
            }
        })
        .await;
    }

    /// A run's start on a budget, its live reports, its waits and its end hold no global lock
    /// either: with [`WRITE_LOCK`] held by another connection they all go through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_runs_meter_reports_and_end_go_through_while_another_connection_holds_the_global_write_lock() {
        use crate::store::{Meter, RunStatus};
        with_test_database(async |target| {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_postgres(target.clone(), dir.path()).unwrap();
            let owner = "node0:1:x";
            let (runs, root) = budget_tree(&store, "held", 1_000, 1, owner);
            let (holder, connection) = target.connect_one().await.unwrap();
            tokio::spawn(connection);
            holder.execute("SELECT pg_advisory_lock($1)", &[&WRITE_LOCK]).await.unwrap();
            let runner = store.clone();
            let run = tokio::task::spawn_blocking(move || {
                let (run, session) = &runs[0];
                assert_eq!(runner.start_meter(run, *session, None).unwrap(), Meter::Drawing);
                let recorded = runner.record_usage(run, &serde_json::json!({"inputTokens": 300})).unwrap();
                assert!(matches!(recorded, crate::store::Recorded::Within(_)), "{recorded:?}");
                runner.hold_runtime(run, true).unwrap();
                runner.hold_runtime(run, false).unwrap();
                runner.finish_run(run, owner, &finished_ok()).unwrap();
                run.clone()
            });
            let run = tokio::time::timeout(std::time::Duration::from_secs(60), run)
                .await
                .expect("a run's records waited for the global write lock")
                .unwrap();
            holder.execute("SELECT pg_advisory_unlock($1)", &[&WRITE_LOCK]).await.unwrap();
            assert_eq!(store.run(&run).unwrap().unwrap().status, RunStatus::Ok);
            assert_eq!(store.budget_of(root).unwrap().unwrap().spent.tokens, 300, "settled at its last report");
        })
        .await;
    }

    /// Two row-locked writes on two nodes that lock two rows in opposite orders deadlock;
    /// PostgreSQL ends one (40P01), which is run again whole and then commits: both writes land,
    /// each once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_row_locked_write_ended_by_a_deadlock_is_run_again_and_commits() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        with_test_database(async |target| {
            let dirs = [(); 2].map(|_| tempfile::tempdir().unwrap());
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            let ids: Vec<i64> = ["a", "b"]
                .iter()
                .map(|k| {
                    let key = crate::keys::SessionKey::from_canonical(format!("agent:main:{k}"));
                    nodes[0].write(|tx| tx.insert_session(&session(key.as_str()))).unwrap();
                    nodes[0].session_by_key(&key).unwrap().unwrap().id
                })
                .collect();
            let both_hold_one = std::sync::Arc::new(std::sync::Barrier::new(2));
            let attempts = std::sync::Arc::new(AtomicUsize::new(0));
            let writers: Vec<_> = [(ids[0], ids[1]), (ids[1], ids[0])]
                .into_iter()
                .zip(nodes.iter().cloned())
                .map(|((first, second), store)| {
                    let (both_hold_one, attempts) = (both_hold_one.clone(), attempts.clone());
                    std::thread::spawn(move || {
                        let tried = AtomicUsize::new(0);
                        store.write_sql_row_locked(crate::store::Survives::PowerLoss, true, |tx| -> Result<()> {
                            attempts.fetch_add(1, Ordering::SeqCst);
                            let label = "UPDATE sessions SET label = coalesce(label, '') || 'x' WHERE id = ?1";
                            tx.execute(label, args![first])?;
                            if tried.fetch_add(1, Ordering::SeqCst) == 0 {
                                both_hold_one.wait(); // the first time, each holds its first row
                            }
                            tx.execute(label, args![second])?;
                            Ok(())
                        })
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap().expect("the write that lost the deadlock was run again");
            }
            // At least one ran again; its new transaction may take its first row again before
            // the winner wakes to it, and deadlock once more (also run again).
            let attempts = attempts.load(Ordering::SeqCst);
            assert!(attempts >= 3, "one of the two ran again: {attempts} attempts");
            for id in ids {
                let label: String =
                    nodes[1].read(|c| c.one("SELECT label FROM sessions WHERE id = ?1", args![id])).unwrap();
                assert_eq!(label, "xx", "each write landed once on session {id}");
            }
        })
        .await;
    }

    /// Eight uses of one idempotency key at once, on two nodes, each claiming the key and then
    /// queueing a run in one row-locked transaction (a send's commit): one run is queued, and
    /// every other use is answered with it. A key older than its 24 h is taken again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_concurrent_uses_of_one_idempotency_key_on_two_nodes_start_one_run() {
        use crate::keys::{AgentId, SessionKey, SessionKind};
        use crate::store::{IdempotencyHit, NewRun, RememberedKey, RunMode};
        with_test_database(async |target| {
            let dirs = [(); 2].map(|_| tempfile::tempdir().unwrap());
            let nodes: Vec<Store> =
                dirs.iter().map(|d| Store::open_postgres(target.clone(), d.path()).unwrap()).collect();
            let key = SessionKey::from_canonical("agent:main:target");
            nodes[0]
                .write(|tx| {
                    tx.insert_session(&NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false))
                })
                .unwrap();
            let session = nodes[0].session_by_key(&key).unwrap().unwrap().id;
            let send = move |store: &Store, run_id: &str| -> Result<Option<IdempotencyHit>> {
                store.write_row_locked(|tx| -> Result<Option<IdempotencyHit>> {
                    let result = serde_json::json!({"inbox": false});
                    let use_of_key = RememberedKey {
                        caller: "agent:main:caller",
                        key: "k1",
                        tool: "sessions_send",
                        args_hash: "h",
                        run_id,
                        result: &result,
                    };
                    if let Some(hit) = tx.claim_key(&use_of_key)? {
                        return Ok(Some(hit));
                    }
                    let input = serde_json::json!({"role": "user", "content": "once"});
                    tx.enqueue(&NewRun::new(run_id.to_string(), session, RunMode::Send, input))?;
                    Ok(None)
                })
            };
            let start = std::sync::Arc::new(std::sync::Barrier::new(8));
            let senders: Vec<_> = (0..8)
                .map(|i| {
                    let (store, start) = (nodes[i % 2].clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        let run_id = format!("run-{i}");
                        (send(&store, &run_id).unwrap(), run_id)
                    })
                })
                .collect();
            let answers: Vec<(Option<IdempotencyHit>, String)> =
                senders.into_iter().map(|s| s.join().unwrap()).collect();
            let queued: Vec<String> =
                nodes[1].read(|c| c.query_map("SELECT run_id FROM runs", args![], |r| r.get(0))).unwrap();
            assert_eq!(queued.len(), 1, "one run for the key: {queued:?}");
            for (hit, run_id) in &answers {
                let answered = hit.as_ref().map_or(run_id.as_str(), |h| h.run_id.as_deref().unwrap());
                assert_eq!(answered, queued[0], "every use answers the one run");
            }
            nodes[0]
                .write_sql(|tx| tx.execute("UPDATE idempotency SET created_at = created_at - 86400001", args![]))
                .unwrap();
            assert!(send(&nodes[0], "run-late").unwrap().is_none(), "an expired key is taken again");
        })
        .await;
    }

    /// A run of a node that stopped renewing is interrupted by another node once its lease
    /// passed, not before; its node's next owner interrupts it at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_dead_nodes_run_is_interrupted_after_its_lease_or_at_once_by_its_own_node() {
        use crate::keys::{AgentId, SessionKey, SessionKind};
        use crate::store::run_queue::claim_case;
        use crate::store::{Caps, NewRun, RunMode, RunOwner, RunStatus};
        with_test_database(async |target| {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_postgres(target, dir.path()).unwrap();
            store
                .write(|tx| -> Result<()> {
                    for i in 0..2 {
                        let key = SessionKey::from_canonical(format!("agent:main:s{i}"));
                        tx.insert_session(&NewSession::new(key.clone(), AgentId::main(), SessionKind::Other, false))?;
                        let input = serde_json::json!({"role": "user", "content": "x"});
                        tx.enqueue(&NewRun::new(format!("run-{i}"), tx.session_id(&key)?, RunMode::Send, input))?;
                    }
                    Ok(())
                })
                .unwrap();
            // One run per owner: node-a's and node-c's owners each claim one.
            let caps = Caps { global: 1, per_agent: Default::default(), default_agent: 10, spawns: 10 };
            let (dead_a, dead_c, other) = (RunOwner::new("node-a"), RunOwner::new("node-c"), RunOwner::new("node-b"));
            assert_eq!(claim_case::ids(&store.claim_ready(dead_a.as_str(), &caps).unwrap()), ["run-0"]);
            assert_eq!(claim_case::ids(&store.claim_ready(dead_c.as_str(), &caps).unwrap()), ["run-1"]);
            assert!(store.interrupt_orphans(&other).unwrap().is_empty(), "their leases hold");
            let wrong = store.finish_run("run-0", other.as_str(), &finished_ok()).unwrap_err();
            assert!(matches!(wrong, StoreError::NotRunning { .. }), "only its owner records its end: {wrong}");
            store
                .write_sql(|tx| {
                    tx.execute("UPDATE node_leases SET lease_until = 0 WHERE owner = ?1", args![dead_c.as_str()])
                })
                .unwrap();
            let orphans = store.interrupt_orphans(&other).unwrap();
            assert_eq!(orphans.len(), 1);
            assert_eq!((orphans[0].run.run_id.as_str(), orphans[0].of_node), ("run-1", false));
            assert_eq!(
                orphans[0].run.error.as_deref(),
                Some("interrupted: its node node-c stopped renewing its lease; it was not re-run")
            );
            let late = store.finish_run("run-1", dead_c.as_str(), &finished_ok()).unwrap_err();
            assert!(matches!(late, StoreError::NotRunning { .. }), "{late}");
            assert_eq!(store.run("run-1").unwrap().unwrap().status, RunStatus::Interrupted, "the end stands");
            let leases: Vec<String> = store
                .read(|c| c.query_map("SELECT owner FROM node_leases ORDER BY owner", args![], |r| r.get(0)))
                .unwrap();
            assert_eq!(leases, [dead_a.as_str()], "the passed lease went with its runs");
            store.renew_leases(&dead_a).unwrap();
            let next_a = RunOwner::new("node-a");
            let orphans = store.interrupt_orphans(&next_a).unwrap();
            assert_eq!(
                orphans.iter().map(|o| (o.run.run_id.as_str(), o.of_node)).collect::<Vec<_>>(),
                [("run-0", true)],
                "a node's next owner interrupts its predecessor's runs, lease or not"
            );
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_one_process_holds_the_sweeps_and_others_hear_its_commits() {
        with_test_database(async |target| {
            let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let a = Store::open_postgres(target.clone(), a_dir.path()).unwrap();
            let b = Store::open_postgres(target, b_dir.path()).unwrap();
            assert!(a.hold_database_sweeps().unwrap());
            assert!(!b.hold_database_sweeps().unwrap(), "a holds it");
            a.release_database_sweeps();
            assert!(!b.hold_database_sweeps().unwrap(), "b asks again only after a pause");
            std::thread::sleep(SWEEP_RETRY);
            assert!(b.hold_database_sweeps().unwrap(), "free once a let it go");
            let mut heard = b.remote_changes();
            let own = a.remote_changes();
            a.write(|tx| tx.insert_session(&session("agent:main:x"))).unwrap();
            tokio::time::timeout(std::time::Duration::from_secs(10), heard.changed())
                .await
                .expect("b hears a's commit")
                .unwrap();
            assert!(!own.has_changed().unwrap(), "a's own commit is no news to a");
        })
        .await;
    }

    /// Only news wakes the other nodes: a claim that finds nothing is a read, a write that
    /// changed no row and a lease renewal notify nobody, and a burst of commits is told of at
    /// most once per [`NOTIFY_EVERY`], its last commit included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_only_commits_that_changed_something_wake_the_other_nodes_and_bursts_are_spaced() {
        use crate::store::{Caps, RunOwner};
        with_test_database(async |target| {
            let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let a = Store::open_postgres(target.clone(), a_dir.path()).unwrap();
            let b = Store::open_postgres(target, b_dir.path()).unwrap();
            let mut heard = b.remote_changes();
            // b's listener is connected once it hears a commit of a.
            for i in 0.. {
                a.write(|tx| tx.insert_session(&session(&format!("agent:main:first{i}")))).unwrap();
                let wait = std::time::Duration::from_millis(200);
                if tokio::time::timeout(wait, heard.changed()).await.is_ok() {
                    break;
                }
                assert!(i < 50, "b never heard a");
            }
            tokio::time::sleep(NOTIFY_EVERY * 3).await;
            heard.borrow_and_update();

            let caps = Caps { global: 4, per_agent: Default::default(), default_agent: 4, spawns: 4 };
            let writes = a.activity().1;
            assert!(a.claim_ready("node-a:1:x", &caps).unwrap().is_empty());
            assert_eq!(a.activity().1, writes, "an empty claim is a read");
            a.renew_leases(&RunOwner::new("node-a")).unwrap();
            a.write_sql(|tx| tx.execute("UPDATE sessions SET channel = 'x' WHERE id < 0", args![])).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            assert!(!heard.has_changed().unwrap(), "nothing that changed was news");

            let (base, started) = (*heard.borrow_and_update(), std::time::Instant::now());
            const BURST: usize = 40;
            for i in 0..BURST {
                a.write(|tx| tx.insert_session(&session(&format!("agent:main:burst{i}")))).unwrap();
            }
            // The last commit is told of too: b sees it once it hears the last notification.
            let last = crate::keys::SessionKey::from_canonical(format!("agent:main:burst{}", BURST - 1));
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                tokio::time::timeout(std::time::Duration::from_secs(10), heard.changed()).await.unwrap().unwrap();
                if b.session_by_key(&last).unwrap().is_some() {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "the burst's last commit was never told of");
            }
            tokio::time::sleep(NOTIFY_EVERY * 3).await;
            let told = *heard.borrow_and_update() - base;
            let most = started.elapsed().as_millis() / NOTIFY_EVERY.as_millis() + 2;
            assert!(told as u128 <= most, "{told} notifications for {BURST} commits, at most {most} expected");
        })
        .await;
    }

    #[test]
    fn parameters_are_renumbered_outside_literals_and_quoted_names() {
        assert_eq!(placeholders("SELECT ?1, ?12 FROM t WHERE a = ?2"), "SELECT $1, $12 FROM t WHERE a = $2");
        assert_eq!(placeholders("SELECT '?1', \"a?\" , ?"), "SELECT '?1', \"a?\" , $1");
        assert_eq!(placeholders("x = 'it''s ?' AND y = ?3"), "x = 'it''s ?' AND y = $3");
    }
}
