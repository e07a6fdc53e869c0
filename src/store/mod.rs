//! The store: one type, [`Store`], over one of two backends: an SQLite database (WAL,
//! `synchronous=FULL`; the default) or PostgreSQL ([`postgres`], when `store.url` names one).
//! Every operation is written once against [`sql::Sql`], which both implement.
//!
//! Everything durable lives here: sessions, messages, runs, deliveries, tokens, idempotency keys
//! and attachment receipts. Reads go through a small pool of read connections (WAL lets them run
//! beside the writer); writes go through one writer connection in `BEGIN IMMEDIATE`
//! transactions. Schema changes are embedded, versioned migrations; a backup is taken before an
//! existing store is migrated, and a store written by a newer version is refused.
//!
//! What follows of SQLite holds for PostgreSQL too, as [`postgres`] says: read snapshots,
//! embedded versioned migrations, a newer schema refused. Its writers keep their rules by the
//! rows they lock ([`Store::write_row_locked`]: a run's claim, end and reports, a send, a
//! spawn's admission, steers, asks, cancels, a child's close, a bridge's message, the flows'
//! steps and deliveries), except the sweeps and `import`, one writer at a time across every
//! process sharing the database ([`Store::write`]);
//! `sessions-mcp migrate --to` copies an SQLite store into PostgreSQL.

mod access_tokens;
mod asks;
mod budgets;
mod cancel;
mod dashboard;
mod import;
mod ledger;
mod live_usage;
mod messages;
mod operator;
pub mod postgres;
mod run_queue;
mod runs;
mod schema;
mod seed;
mod sessions;
mod spawn;
pub(crate) mod sql;
mod steer;
mod subagents;
mod text_enum;
mod threads;
mod tokens;
mod tx;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags};
use sha2::{Digest, Sha256};
use sql::{Sql, args};

pub use access_tokens::{AccessKind, AccessToken, MintRefused};
pub use asks::{Answer, AnsweredVia, AskDecision, AskKind, AskRow, AskState, NewAsk};
pub use budgets::{Crossing, Meter, Recorded, Room};
pub use cancel::CancelRequest;
pub use dashboard::{DeliveryLine, LatestRun, LedgerAct, RunLine, Scope, TreeNode, TreesPage, UsageBucket};
pub use import::{ImportedSession, Merged, SessionExtras};
pub use ledger::{DeliveryKind, DeliveryMode, DeliveryStatus, IdempotencyHit, NewDelivery, RememberedKey};
pub use messages::{HistoryPage, MessageRow, NewMessage, PendingInput};
pub use operator::Pruned;
pub use run_queue::{AnnounceKind, Caps, Finished, LEASE_MS, NewRun, Orphan, RunMode, RunOwner, RunRow, RunStatus};
pub use seed::{SeedKey, SeedRows, SeedRun, SeedSession, SeedToken, Stated};
pub use sessions::{ListQuery, NewSession, Route, SendPolicyOverride, SessionRow, SessionState, SliceScope};
pub use spawn::{SlotHolder, SpawnCounts, StoredAttachment};
pub use steer::{NewSteer, SteerQueued, SteerRow, SteerState, steer_input};
pub use subagents::{AnnounceRow, ChildRows, SubtreeCancel, TreeTotals};
pub use threads::{BindingMode, ThreadBinding};
pub use tokens::{TokenRow, sha256_hex};
pub use tx::{AttachmentReceipt, Tx};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = schema::MIGRATIONS.len() as i64;
/// Read connections kept open for reuse.
const READ_POOL: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "{path} is not a sessions-mcp database ({detail}); point --state-dir at another directory or move the file away"
    )]
    NotADatabase { path: PathBuf, detail: String },
    #[error(
        "{path} has schema version {found}, newer than this sessions-mcp supports ({supported}); upgrade sessions-mcp"
    )]
    TooNew { path: PathBuf, found: i64, supported: i64 },
    #[error("cannot create the state directory {path}: {source}")]
    StateDir { path: PathBuf, source: std::io::Error },
    #[error(
        "store is read-only or the disk is full ({0}); nothing of this request was stored: free space or fix the permissions of the state directory, then retry"
    )]
    Unwritable(String),
    /// Any other failure of the database, kept as its own error (no backend type in the API).
    #[error("store: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    #[error("store: stored data is corrupt: {0}")]
    Corrupt(String),
    /// The database server cannot be reached (PostgreSQL); nothing of the request was stored.
    #[error("{0}; nothing of this request was stored: retry once the database is back")]
    Unavailable(String),
    /// A run's end came after another node had ended it (its lease passed meanwhile).
    #[error(
        "run {run_id} is {status}, no longer running here: its lease passed while it ran, and another node ended it"
    )]
    NotRunning { run_id: String, status: String },
    /// A query that had to return a row returned none (see [`sql::Optional`]).
    #[error("store: no such row")]
    NoRow,
}

impl StoreError {
    fn classify(path: &Path, e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode as C;
        match e.sqlite_error_code() {
            Some(C::NotADatabase) => Self::NotADatabase { path: path.to_path_buf(), detail: e.to_string() },
            _ => e.into(),
        }
    }
}

/// Every failed write says what the operator can do about it, wherever it surfaced. A write
/// error (`SQLITE_IOERR`, e.g. EFBIG or EIO) rolls the transaction back like a full disk does.
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode as C;
        match e.sqlite_error_code() {
            Some(C::ReadOnly | C::DiskFull | C::CannotOpen | C::SystemIoFailure) => Self::Unwritable(e.to_string()),
            _ => Self::Backend(Box::new(e)),
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// What a commit survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Survives {
    PowerLoss,
    ProcessDeath,
}

/// Where the rows live.
enum Backend {
    Sqlite { writer: Mutex<Connection>, readers: Mutex<Vec<Connection>> },
    Postgres(Box<postgres::backend::PgBackend>),
}

/// The durable store. Cheap to clone; every clone shares the same connections.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    /// The SQLite file; for PostgreSQL, where it would be in the state directory (its parent is
    /// the state directory either way).
    path: PathBuf,
    backend: Backend,
    /// Reads and writes served, so that a rest can be told from a burst.
    reads: AtomicU64,
    writes: AtomicU64,
    /// Counts changes: each commit here, and each change another process announced.
    changes: tokio::sync::watch::Sender<u64>,
    /// Counts the commits other processes told of through the database (PostgreSQL's
    /// notifications): work another node queued.
    remote_changes: tokio::sync::watch::Sender<u64>,
}

impl Store {
    /// Opens (creating if needed) the store at `path`, migrating it to [`SCHEMA_VERSION`].
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::privacy::create_private_dir(dir)
                .map_err(|source| StoreError::StateDir { path: dir.to_path_buf(), source })?;
        }
        let writer = open_connection(path, false)?;
        migrate(&writer, path)?;
        Ok(Store::with(path, Backend::Sqlite { writer: Mutex::new(writer), readers: Mutex::new(Vec::new()) }))
    }

    /// Opens the store of `state_dir`: the PostgreSQL database `url` names when there is one
    /// (its schema created or migrated), else the SQLite file in the directory.
    pub fn open_in(state_dir: &Path, url: Option<&str>) -> Result<Store> {
        let Some(url) = url else { return Store::open(&Store::path_in(state_dir)) };
        Store::open_postgres(postgres::PgTarget::parse(url)?, state_dir)
    }

    /// Opens the PostgreSQL store `target` names, for the state directory `state_dir`.
    pub fn open_postgres(target: postgres::PgTarget, state_dir: &Path) -> Result<Store> {
        crate::privacy::create_private_dir(state_dir)
            .map_err(|source| StoreError::StateDir { path: state_dir.to_path_buf(), source })?;
        let backend = postgres::backend::PgBackend::open(target)?;
        let store = Store::with(&Store::path_in(state_dir), Backend::Postgres(Box::new(backend)));
        let Backend::Postgres(pg) = &store.inner.backend else { unreachable!("just made") };
        // Weak: the listener must not keep the store alive.
        let inner = Arc::downgrade(&store.inner);
        pg.listen(move || {
            if let Some(inner) = inner.upgrade() {
                inner.changes.send_modify(|n| *n = n.wrapping_add(1));
                inner.remote_changes.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        Ok(store)
    }

    fn with(path: &Path, backend: Backend) -> Store {
        Store {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                backend,
                reads: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                changes: tokio::sync::watch::Sender::new(0),
                remote_changes: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// Whether other nodes (state directories, machines) may share this store: PostgreSQL.
    /// SQLite's file is one state directory's, whose runtime lock makes its owner the only one.
    pub fn is_shared(&self) -> bool {
        matches!(self.inner.backend, Backend::Postgres(_))
    }

    /// Takes the sweeps of the database for this process: of all the nodes sharing a
    /// PostgreSQL database one at a time takes the work that is nobody's run (deliveries,
    /// archiving, catching up lost steps, interrupting a dead node's runs) — an advisory lock,
    /// released when the process or its connection dies. With SQLite the runtime owner of the
    /// state directory is the only one anyway. True when held.
    pub fn hold_database_sweeps(&self) -> Result<bool> {
        match &self.inner.backend {
            Backend::Sqlite { .. } => Ok(true),
            Backend::Postgres(pg) => pg.hold_sweeps(),
        }
    }

    pub fn release_database_sweeps(&self) {
        if let Backend::Postgres(pg) = &self.inner.backend {
            pg.release_sweeps();
        }
    }

    /// The SQL dialect of the backend.
    fn dialect(&self) -> sql::Dialect {
        match &self.inner.backend {
            Backend::Sqlite { .. } => sql::Dialect::Sqlite,
            Backend::Postgres(_) => sql::Dialect::Postgres,
        }
    }

    /// The store file inside a state directory.
    pub fn path_in(state_dir: &Path) -> PathBuf {
        state_dir.join("sessions.db")
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on a read connection (a consistent snapshot for the duration of `f`).
    fn read<T>(&self, f: impl FnOnce(&dyn Sql) -> Result<T>) -> Result<T> {
        self.inner.reads.fetch_add(1, Ordering::Relaxed);
        let readers = match &self.inner.backend {
            Backend::Sqlite { readers, .. } => readers,
            Backend::Postgres(pg) => return pg.read(f),
        };
        let conn = readers.lock().expect("reader pool").pop();
        let conn = match conn {
            Some(c) => c,
            None => open_connection(&self.inner.path, true)?,
        };
        let out = (|| {
            conn.execute_batch("BEGIN DEFERRED")?;
            let r = f(&conn);
            conn.execute_batch("COMMIT")?;
            r
        })();
        let mut pool = readers.lock().expect("reader pool");
        if pool.len() < READ_POOL && conn.is_autocommit() {
            pool.push(conn);
        }
        out.map_err(|e| self.classify(e))
    }

    /// A failure of the store file itself (not a database) named with its path.
    fn classify(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Backend(b) => match b.downcast::<rusqlite::Error>() {
                Ok(e) => StoreError::classify(&self.inner.path, *e),
                Err(b) => StoreError::Backend(b),
            },
            e => e,
        }
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction; commits when `f` returns `Ok`. The commit
    /// survives a power loss (`synchronous=FULL`): what a caller is told was done stays done.
    fn write_sql<T, E>(&self, f: impl FnOnce(&dyn Sql) -> std::result::Result<T, E>) -> std::result::Result<T, E>
    where
        E: From<StoreError>,
    {
        self.write_surviving(Survives::PowerLoss, f)
    }

    /// As [`Store::write_sql`], for a record nobody is told of and that matters only while this
    /// machine's processes live (a run's supervisor pid, its token, that its steps were taken):
    /// the commit survives this process dying but not the machine (`synchronous=NORMAL` in WAL:
    /// no fsync of its own; the next full commit makes it durable with everything before it).
    /// After a power loss no run is left to supervise or call back, and steps are idempotent.
    /// One fsync saved for each of a run's three such records (BENCHMARKS.md, fan-out).
    ///
    /// On a shared database it holds no global lock ([`Store::write_sql_row_locked`]): `f` must
    /// be one statement on rows named by their key that reads nothing first (every caller is).
    fn write_sql_for_this_boot<T>(&self, f: impl Fn(&dyn Sql) -> Result<T>) -> Result<T> {
        self.write_sql_row_locked(Survives::ProcessDeath, false, f)
    }

    /// As [`Store::write_sql`], for a record no waiter looks at (a lease renewal): on a shared
    /// database the other nodes are not woken for it. As [`Store::write_sql_for_this_boot`], it
    /// holds no global lock there: `f` must be one keyed statement that reads nothing first.
    fn write_sql_untold<T>(&self, f: impl Fn(&dyn Sql) -> Result<T>) -> Result<T> {
        self.write_sql_row_locked(Survives::PowerLoss, false, f)
    }

    /// On a shared database, a write that holds no global lock
    /// ([`postgres::backend::WriteOrder::RowLocks`]): `f` keeps its invariants by the row
    /// locks of its statements and the advisory locks it takes itself (the claim), taken in the
    /// store's lock order (docs/ARCHITECTURE.md, PostgreSQL: session row, run rows, budget
    /// accounts root to leaf), or needs none (one statement on rows named by their key, nothing
    /// read first). `f` may run more than once: a transaction PostgreSQL ended for a
    /// serialization failure or a deadlock is run again whole. SQLite has one writer: there it
    /// is any write.
    fn write_sql_row_locked<T, E>(
        &self,
        survives: Survives,
        news: bool,
        f: impl Fn(&dyn Sql) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<StoreError>,
    {
        let Backend::Postgres(pg) = &self.inner.backend else { return self.write_surviving_as(survives, news, f) };
        self.inner.writes.fetch_add(1, Ordering::Relaxed);
        let (value, changed) = pg.write_row_locked(survives == Survives::PowerLoss, news, f)?;
        if changed {
            self.announce_change();
        }
        Ok(value)
    }

    fn write_surviving<T, E>(
        &self,
        survives: Survives,
        f: impl FnOnce(&dyn Sql) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<StoreError>,
    {
        self.write_surviving_as(survives, true, f)
    }

    /// A write transaction; with `news` the other nodes sharing the database are told of it
    /// when it changed a row.
    fn write_surviving_as<T, E>(
        &self,
        survives: Survives,
        news: bool,
        f: impl FnOnce(&dyn Sql) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E>
    where
        E: From<StoreError>,
    {
        self.inner.writes.fetch_add(1, Ordering::Relaxed);
        let writer = match &self.inner.backend {
            Backend::Sqlite { writer, .. } => writer,
            Backend::Postgres(pg) => {
                let (value, changed) =
                    pg.write(postgres::backend::WriteOrder::Global, survives == Survives::PowerLoss, news, f)?;
                if changed {
                    self.announce_change();
                }
                return Ok(value);
            }
        };
        let classify = |e| E::from(StoreError::classify(&self.inner.path, e));
        let mut conn = writer.lock().unwrap_or_else(|p| p.into_inner());
        if survives == Survives::ProcessDeath {
            conn.pragma_update(None, "synchronous", "NORMAL").map_err(classify)?;
        }
        let value = (|| -> std::result::Result<T, E> {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(classify)?;
            let value = f(&tx)?;
            tx.commit().map_err(classify)?;
            Ok(value)
        })();
        if survives == Survives::ProcessDeath {
            // Restored before the lock goes: every other write stays a full one.
            conn.pragma_update(None, "synchronous", "FULL").map_err(classify)?;
        }
        drop(conn);
        let value = value?;
        self.announce_change();
        Ok(value)
    }

    /// Watches the store's changes: every commit through this `Store` (and its clones), and every
    /// change [`Store::announce_change`] reports. A receiver sees that something changed since it
    /// last looked, never what: it reads the store for that.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Watches the commits of other processes that the database told of (PostgreSQL only;
    /// SQLite's processes tell each other through the runtime owner's socket).
    pub fn remote_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.remote_changes.subscribe()
    }

    /// Tells the watchers of [`Store::changes`] that the store changed (another process said so).
    pub fn announce_change(&self) {
        self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// (reads, writes) served so far.
    pub fn activity(&self) -> (u64, u64) {
        (self.inner.reads.load(Ordering::Relaxed), self.inner.writes.load(Ordering::Relaxed))
    }

    /// Gives back the connections' page caches (`PRAGMA shrink_memory`): each fills up to
    /// SQLite's 2 MiB default as the store grows, and keeps it. The next reads take their pages
    /// from the OS page cache again.
    pub fn shrink_memory(&self) {
        let shrink = |c: &Connection| {
            if let Err(e) = c.execute_batch("PRAGMA shrink_memory") {
                tracing::warn!(error = %e, "shrinking a store connection's cache failed");
            }
        };
        // PostgreSQL's caches are the server's.
        let Backend::Sqlite { writer, readers } = &self.inner.backend else { return };
        readers.lock().expect("reader pool").iter().for_each(shrink);
        shrink(&writer.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// An ordered content hash of every table: equal fingerprints mean equal stores. The node
    /// leases are left out: they are the live nodes' heartbeats, rewritten every few seconds
    /// whatever is asked of the store, not anything stored.
    pub fn fingerprint(&self) -> Result<String> {
        self.read(|c| {
            let (tables_sql, width_sql) = match c.dialect() {
                sql::Dialect::Sqlite => (
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
                    "SELECT count(*) FROM pragma_table_info(?1)",
                ),
                sql::Dialect::Postgres => (
                    "SELECT table_name::text FROM information_schema.tables
                     WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1",
                    "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ?1",
                ),
            };
            let mut tables: Vec<String> = c.query_map(tables_sql, args![], |r| r.get(0))?;
            tables.retain(|t| t != "schema_version" && t != "node_leases");
            let mut hasher = Sha256::new();
            for table in tables {
                hasher.update(table.as_bytes());
                let cols: i64 = c.one(width_sql, args![table])?;
                let order: Vec<String> = (1..=cols).map(|i| i.to_string()).collect();
                for row in c.rows(&format!("SELECT * FROM \"{table}\" ORDER BY {}", order.join(", ")), args![])? {
                    for v in row.cells() {
                        hasher.update(format!("{v:?}\u{1f}").as_bytes());
                    }
                    hasher.update(b"\x1e");
                }
            }
            Ok(hex::encode(hasher.finalize()))
        })
    }
}

/// Turns off SQLite's allocation statistics before its first connection. They are kept under one
/// process-wide mutex that every allocation takes: with several reader threads, contention on it
/// was 11% of the property tests' CPU (perf). Nothing here reads the statistics.
fn configure_sqlite_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config takes the option and one int for MEMSTATUS; called before any
        // connection of ours, it applies; if SQLite is already initialised it returns MISUSE and
        // changes nothing.
        unsafe {
            rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 0 as std::ffi::c_int);
        }
    });
}

fn open_connection(path: &Path, read_only: bool) -> Result<Connection> {
    configure_sqlite_once();
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI
    };
    let conn = Connection::open_with_flags(path, flags).map_err(|e| StoreError::classify(path, e))?;
    let setup = || -> rusqlite::Result<()> {
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        if !read_only {
            // journal_mode reads the header: a file that is not a database fails here.
            conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        }
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY;")?;
        // Without the planner stability guarantee SQLite plans `LIMIT ?n` with the bound value,
        // so every new binding re-prepares the statement: 40% of a sessions_list with
        // messageLimit went to re-parsing the same SQL (BENCHMARKS.md). No plan here depends on
        // bound values (no ANALYZE, partial indexes are matched by literals).
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))?;
        Ok(())
    };
    setup().map_err(|e| StoreError::classify(path, e))?;
    Ok(conn)
}

fn current_version(conn: &Connection) -> rusqlite::Result<i64> {
    let has_table: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(0);
    }
    conn.query_row("SELECT coalesce(max(version), 0) FROM schema_version", [], |r| r.get(0))
}

fn migrate(conn: &Connection, path: &Path) -> Result<()> {
    let found = current_version(conn).map_err(|e| StoreError::classify(path, e))?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::TooNew { path: path.to_path_buf(), found, supported: SCHEMA_VERSION });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    if found > 0 {
        backup(conn, path, found)?;
    }
    for (i, sql) in schema::MIGRATIONS.iter().enumerate().skip(found as usize) {
        let version = i as i64 + 1;
        let run = || -> rusqlite::Result<()> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            conn.execute_batch(sql)?;
            conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)", (version, now_ms()))?;
            conn.execute_batch("COMMIT")
        };
        if let Err(e) = run() {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(StoreError::classify(path, e));
        }
        tracing::info!(version, "store migrated");
    }
    Ok(())
}

/// `VACUUM INTO` a sibling file named after the old version, before touching the schema.
fn backup(conn: &Connection, path: &Path, version: i64) -> Result<()> {
    let target = path.with_extension(format!("db.bak-v{version}-{}", now_ms()));
    conn.execute("VACUUM INTO ?1", [target.to_string_lossy()]).map_err(|e| StoreError::classify(path, e))?;
    tracing::info!(backup = %target.display(), "store backed up before migration");
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A stored timestamp (ms since the epoch) in RFC 3339, as exports, tasks and the operator show it.
pub fn iso(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer_synchronous(store: &Store) -> i64 {
        let Backend::Sqlite { writer, .. } = &store.inner.backend else { unreachable!() };
        let conn = writer.lock().unwrap();
        conn.pragma_query_value(None, "synchronous", |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_write_for_this_boot_commits_and_every_other_write_stays_full() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        const FULL: i64 = 2;
        assert_eq!(writer_synchronous(&store), FULL);
        let put = |tx: &dyn Sql| tx.execute("INSERT INTO agent_ids (agent_id) VALUES ('x')", args![]);
        store.write_sql_for_this_boot(put).unwrap();
        assert_eq!(writer_synchronous(&store), FULL, "restored after a commit");
        assert!(store.write_sql_for_this_boot(put).is_err(), "the key exists: rolled back");
        assert_eq!(writer_synchronous(&store), FULL, "restored after a rollback");
        let n: i64 = store
            .read(|c| c.query_row("SELECT count(*) FROM agent_ids WHERE agent_id = 'x'", args![], |r| r.get(0)))
            .unwrap();
        assert_eq!(n, 1, "the first write committed, the failed one changed nothing");
    }

    /// Bytes of page cache a connection holds (`SQLITE_DBSTATUS_CACHE_USED`).
    fn cache_used(conn: &Connection) -> i32 {
        let (mut current, mut high) = (0, 0);
        // SAFETY: the handle is live for the borrow; the out-pointers are valid ints.
        let rc = unsafe {
            rusqlite::ffi::sqlite3_db_status(
                conn.handle(),
                rusqlite::ffi::SQLITE_DBSTATUS_CACHE_USED,
                &mut current,
                &mut high,
                0,
            )
        };
        assert_eq!(rc, 0);
        current
    }

    #[test]
    fn shrinking_gives_the_pooled_connections_page_caches_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Store::path_in(dir.path())).unwrap();
        store
            .write_sql(|tx| -> Result<()> {
                tx.execute("CREATE TABLE filler (x BLOB)", args![])?;
                for _ in 0..200 {
                    tx.execute("INSERT INTO filler VALUES (zeroblob(4000))", args![])?;
                }
                Ok(())
            })
            .unwrap();
        store.read(|c| c.query_row("SELECT sum(length(x)) FROM filler", args![], |r| r.get::<i64>(0))).unwrap();
        let Backend::Sqlite { readers, .. } = &store.inner.backend else { unreachable!() };
        let pooled = || cache_used(&readers.lock().unwrap()[0]);
        assert!(pooled() > 500_000, "the read filled the reader's cache: {}", pooled());
        store.shrink_memory();
        assert!(pooled() < 100_000, "the cache was given back: {}", pooled());
    }

    #[test]
    fn opens_migrates_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path).unwrap();
        let v: i64 = store.read(|c| c.one("SELECT coalesce(max(version), 0) FROM schema_version", args![])).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        let mode: String = store.read(|c| c.query_row("PRAGMA journal_mode", args![], |r| r.get(0))).unwrap();
        assert_eq!(mode, "wal");
        drop(store);
        Store::open(&path).unwrap();
    }

    /// Inserts a session of agent `main` spawned by `parent`.
    fn insert_spawned(store: &Store, key: &str, parent: Option<&str>) {
        use crate::keys::{AgentId, SessionKey, SessionKind};
        let mut n = NewSession::new(
            SessionKey::from_canonical(key),
            AgentId::parse("main").unwrap(),
            SessionKind::Other,
            false,
        );
        n.spawned_by = parent.map(SessionKey::from_canonical);
        store.write(|tx| tx.insert_session(&n)).unwrap();
    }

    #[test]
    fn lineage_is_known_at_any_depth_and_survives_pruning_a_middle_session() {
        use crate::keys::SessionKey;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let keys: Vec<String> = (0..24).map(|i| format!("agent:main:subagent:s{i}")).collect();
        insert_spawned(&store, "agent:main:main", None);
        for (i, k) in keys.iter().enumerate() {
            insert_spawned(&store, k, Some(if i == 0 { "agent:main:main" } else { &keys[i - 1] }));
        }
        let key = |k: &str| SessionKey::from_canonical(k);
        let (root, leaf) = (key("agent:main:main"), key(&keys[23]));
        assert!(store.is_ancestor(&root, &leaf).unwrap(), "24 levels down");
        assert!(!store.is_ancestor(&leaf, &root).unwrap());
        assert!(!store.is_ancestor(&key(&keys[5]), &key(&keys[4])).unwrap(), "a parent is not its child's descendant");
        store
            .write_sql(|tx| {
                tx.execute("UPDATE sessions SET state = 2, deleted_at = 0 WHERE key = ?1", args![&keys[10]])
            })
            .unwrap();
        assert_eq!(store.prune(1).unwrap().sessions, 1);
        assert!(store.is_ancestor(&root, &leaf).unwrap(), "pruning a middle session keeps the lineage");
        assert!(store.is_ancestor(&key(&keys[9]), &key(&keys[11])).unwrap());
    }

    #[test]
    fn a_parent_written_after_its_children_adopts_them_and_their_descendants() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        let insert = |k: &str, parent: Option<&str>| insert_spawned(&store, k, parent);
        // grandchild, then child, then the root: every link arrives late
        insert("agent:main:subagent:g", Some("agent:main:subagent:c"));
        insert("agent:main:subagent:c", Some("agent:main:main"));
        insert("agent:main:main", None);
        let links: Vec<(String, String)> = store
            .read(|c| {
                c.query_map(
                    "SELECT a.key, d.key FROM session_tree t JOIN sessions a ON a.id = t.ancestor
                     JOIN sessions d ON d.id = t.session ORDER BY a.key, d.key",
                    args![],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
            })
            .unwrap();
        let pairs: Vec<(&str, &str)> = links.iter().map(|(a, d)| (a.as_str(), d.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("agent:main:main", "agent:main:subagent:c"),
                ("agent:main:main", "agent:main:subagent:g"),
                ("agent:main:subagent:c", "agent:main:subagent:g")
            ]
        );
    }

    #[test]
    fn a_version_10_store_whose_token_totals_overflowed_into_reals_is_repaired_and_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        insert_spawned(&Store::open(&path).unwrap(), "agent:main:subagent:c", Some("agent:main:main"));
        // What one `inputTokens: i64::MAX` report left before reports were checked: the sum
        // overflowed and SQLite stored it as a REAL; and a negative report credited.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "UPDATE sessions SET tokens_in = 9223372036854775807, tokens_out = -5,
                 tokens_total = 9223372036854775807 + 2;
             DELETE FROM schema_version WHERE version >= 11;
             DROP TABLE access_tokens; ALTER TABLE budget_live DROP COLUMN waiting_since;
             ALTER TABLE asks DROP COLUMN routes;
             ALTER TABLE asks DROP COLUMN answered_host;
             ALTER TABLE runs DROP COLUMN remote_task_id;",
        )
        .unwrap();
        let kind: String = conn.query_row("SELECT typeof(tokens_total) FROM sessions", [], |r| r.get(0)).unwrap();
        assert_eq!(kind, "real", "the corruption as it was");
        drop(conn);
        let store = Store::open(&path).unwrap();
        let row = store.session_by_key(&crate::keys::SessionKey::from_canonical("agent:main:subagent:c")).unwrap();
        let row = row.expect("the row reads again");
        assert_eq!((row.tokens_in, row.tokens_out, row.tokens_total), (i64::MAX, 0, i64::MAX));
    }

    #[test]
    fn a_version_1_store_migrates_with_its_ended_runs_done_and_its_late_links_made() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(schema::MIGRATIONS[0]).unwrap();
        conn.execute_batch(
            "INSERT INTO schema_version VALUES (1, 0);
             INSERT INTO sessions (id, key, session_id, agent_id, kind, driver, spawned_by, created_at, updated_at)
                 VALUES (1, 'agent:main:subagent:c', 'c', 'main', 'other', 'driven', 'agent:main:main', 0, 0),
                        (2, 'agent:main:main', 'm', 'main', 'main', 'driven', NULL, 0, 0);
             INSERT INTO runs (run_id, session, mode, status, input, created_at, ended_at)
                 VALUES ('ended', 1, 'spawn', 'ok', '{}', 0, 5), ('waiting', 2, 'send', 'queued', '{}', 0, NULL);",
        )
        .unwrap();
        drop(conn);
        let store = Store::open(&path).unwrap();
        let (pending, links): (i64, i64) = store
            .read(|c| {
                Ok((
                    c.query_row("SELECT count(*) FROM runs WHERE steps_done_at IS NULL", args![], |r| r.get(0))?,
                    c.query_row(
                        "SELECT count(*) FROM session_tree WHERE ancestor = 2 AND session = 1",
                        args![],
                        |r| r.get(0),
                    )?,
                ))
            })
            .unwrap();
        assert_eq!(pending, 1, "only the queued run still has its steps ahead");
        assert_eq!(links, 1, "the child written before its parent is linked");
        assert!(dir.path().read_dir().unwrap().flatten().any(|e| e.file_name().to_string_lossy().contains("bak")));
    }

    /// A version 10 store's idempotency rows, as a bridge and a spawn left them in one session.
    pub(crate) const V10_IDEMPOTENCY_ROWS: &str =
        "INSERT INTO idempotency (caller, key, tool, args_hash, run_id, result, created_at) VALUES
             ('agent:main:discord:group:1', 'message:m-1', 'channel_bridge', '', 'bridged', '{}', {now}),
             ('agent:main:discord:group:1', 'message:m-2', 'sessions_spawn', 'h', 'spawned', '{}', {now})";

    /// What each namespace answers for `message:m-1` and `message:m-2` after the migration: the
    /// bridge's row is still the bridge's, the spawn's still the spawn's, neither the other's.
    pub(crate) fn assert_idempotency_namespaces_apart(store: &Store) {
        let session = crate::keys::SessionKey::from_canonical("agent:main:discord:group:1");
        let runs = store
            .write(|tx| -> Result<_> {
                let run = |hit: Option<IdempotencyHit>| hit.and_then(|h| h.run_id);
                Ok([
                    run(tx.claim_bridge_message(&session, "m-1", "new")?),
                    run(tx.idempotency(&session, "message:m-1")?),
                    run(tx.idempotency(&session, "message:m-2")?),
                    run(tx.claim_bridge_message(&session, "m-2", "new")?),
                ])
            })
            .unwrap();
        assert_eq!(runs, [Some("bridged".into()), None, Some("spawned".into()), None]);
    }

    #[test]
    fn a_version_10_stores_bridge_message_ids_move_apart_from_the_tools_idempotency_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let conn = Connection::open(&path).unwrap();
        for sql in &schema::MIGRATIONS[..10] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute_batch("INSERT INTO schema_version VALUES (10, 0)").unwrap();
        conn.execute_batch(&V10_IDEMPOTENCY_ROWS.replace("{now}", &now_ms().to_string())).unwrap();
        drop(conn);
        assert_idempotency_namespaces_apart(&Store::open(&path).unwrap());
    }

    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = Store::open(&path).unwrap();
        store.write_sql(|tx| tx.execute("INSERT INTO schema_version VALUES (999, 0)", args![])).unwrap();
        drop(store);
        let err = Store::open(&path).err().unwrap();
        assert!(matches!(err, StoreError::TooNew { found: 999, .. }), "{err}");
    }

    #[test]
    fn refuses_a_file_that_is_not_a_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        std::fs::write(&path, vec![b'x'; 4096]).unwrap();
        let err = Store::open(&path).err().unwrap();
        assert!(matches!(err, StoreError::NotADatabase { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), vec![b'x'; 4096]);
    }

    #[test]
    fn backup_copies_the_store_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        drop(Store::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        backup(&conn, &path, 1).unwrap();
        let backup = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().contains("bak-v1"))
            .expect("backup file");
        let copy = Connection::open(&backup).unwrap();
        assert_eq!(current_version(&copy).unwrap(), SCHEMA_VERSION);
    }
}
