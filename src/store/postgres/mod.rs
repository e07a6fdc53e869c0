//! PostgreSQL: connecting to a `postgres://` URL through a deadpool pool, the schema as embedded
//! versioned migrations of its own ([`schema`]), the check that a database is ours, copying an
//! SQLite store into one ([`copy`], behind `sessions-mcp migrate --to`), and serving
//! [`crate::store::Store`] from it ([`backend`]).
//!
//! Every failure is one line that names what is wrong and what to do, as [`StoreError`]'s are:
//! the server unreachable (host and port), authentication failed (the user), no such database, a
//! schema written by a newer version, a database that is not ours. The password of a URL is never
//! shown: a target prints as `postgres://user@host:port/db`.
//!
//! [`StoreError`]: crate::store::StoreError

pub mod backend;
pub mod copy;
pub mod schema;
pub mod stats;
pub mod tls;

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::Transaction;
use tokio_postgres::error::SqlState;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long connecting may take before the server counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections a pool keeps: a serving process's one writer and its concurrent readers (SQLite's
/// side keeps 8 readers); the operator's commands use one.
const POOL_SIZE: usize = 16;
/// The advisory lock under which the schema is inspected and migrated, so that two processes
/// starting on one empty database do not both create it (`"smcp"` in ASCII).
const SCHEMA_LOCK: i64 = 0x736d_6370;

#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("the store URL is not a PostgreSQL URL ({0}); write postgres://USER:PASSWORD@HOST:PORT/DATABASE")]
    BadUrl(String),
    #[error(
        "cannot reach PostgreSQL at {addr} ({detail}); start the server, or fix the host and port of the store URL"
    )]
    Unreachable { addr: String, detail: String },
    #[error(
        "PostgreSQL at {addr} refused user {user:?}: authentication failed ({detail}); fix the user or password of the store URL"
    )]
    AuthFailed { addr: String, user: String, detail: String },
    #[error("PostgreSQL at {addr} has no database {db:?}; create it (createdb -E UTF8 {db}) or fix the store URL")]
    NoDatabase { addr: String, db: String },
    /// The URL's TLS parameters, or a file they name (`tls`).
    #[error("the store URL's TLS settings: {0}")]
    TlsSettings(String),
    #[error("TLS with PostgreSQL at {addr} failed ({detail}); {advice}")]
    Tls { addr: String, detail: String, advice: &'static str },
    #[error(
        "{target} has schema version {found}, newer than this sessions-mcp writes ({supported}); upgrade sessions-mcp"
    )]
    TooNew { target: String, found: i64, supported: i64 },
    #[error(
        "{target} is not a sessions-mcp database (it has tables, e.g. {tables}, but no {marker} marker table); point the store URL at an empty database",
        marker = schema::MARKER_TABLE
    )]
    NotOurs { target: String, tables: String },
    #[error(
        "{target} has encoding {found}; sessions-mcp stores text as UTF8: create the database with createdb -E UTF8 -T template0"
    )]
    Encoding { target: String, found: String },
    /// Anything else the server or the driver said, with the target it concerns.
    #[error("{target}: {detail}")]
    Backend { target: String, detail: String },
}

/// The schema version this build writes into PostgreSQL.
pub const PG_SCHEMA_VERSION: i64 = schema::MIGRATIONS.len() as i64;

/// What the server is told of each session, so that a node that vanishes — its machine or its
/// network, not only its process, whose kernel would close the socket — lets go within about
/// 25 s of the write lock of a transaction it was in and of the sweep lock it held, instead of
/// when the server's OS gives up on the socket (two hours by default): the server probes an
/// idle client after 10 s, every 5 s, 3 times, and ends a transaction left idle for 30 s (none
/// of ours is: a write runs its statements back to back).
const SESSION_OPTIONS: &str = "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3 -c idle_in_transaction_session_timeout=30000";
/// This side's view of the same: a server that vanishes fails this node's statements within
/// seconds (then `cannot reach PostgreSQL`), not after TCP's retransmissions.
const CLIENT_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const CLIENT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const CLIENT_KEEPALIVE_RETRIES: u32 = 3;
const CLIENT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);
/// tokio-postgres's default `keepalives_idle`, to tell whether the URL set one.
const DRIVER_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// Sets [`SESSION_OPTIONS`] and the client's keepalives on `config`, except what the URL set
/// itself (its `options` come after ours, so they win).
fn notice_vanished_peers(config: &mut tokio_postgres::Config) {
    let options = match config.get_options() {
        Some(own) if !own.is_empty() => format!("{SESSION_OPTIONS} {own}"),
        _ => SESSION_OPTIONS.to_string(),
    };
    config.options(&options);
    if config.get_keepalives_idle() == DRIVER_KEEPALIVE_IDLE {
        config.keepalives_idle(CLIENT_KEEPALIVE_IDLE);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(CLIENT_KEEPALIVE_INTERVAL);
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(CLIENT_KEEPALIVE_RETRIES);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(CLIENT_TCP_USER_TIMEOUT);
    }
}

/// The half of a connection that does its I/O ([`PgTarget::connect_one`]).
pub type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

/// A PostgreSQL database named by a `postgres://` URL, and how to show it without its password.
#[derive(Clone)]
pub struct PgTarget {
    config: tokio_postgres::Config,
    tls: tls::TlsOptions,
    /// Made from `tls` once, at parse: the CA and client files are read then.
    connector: MakeRustlsConnect,
    /// `host:port` (or the socket directory) of the server.
    addr: String,
    user: String,
    db: String,
}

impl std::fmt::Display for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "postgres://{}@{}/{}", self.user, self.addr, self.db)
    }
}

impl std::fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgTarget({self})")
    }
}

impl PgTarget {
    /// Parses a `postgres://` (or `postgresql://`) URL. It must name a user and a host; the
    /// database defaults to the user's name, as PostgreSQL's does.
    pub fn parse(url: &str) -> Result<PgTarget, PgError> {
        let url = url.trim();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(PgError::BadUrl("it does not start with postgres://".into()));
        }
        let (driver_url, mut tls) = tls::TlsOptions::split_url(url).map_err(PgError::TlsSettings)?;
        let mut config = tokio_postgres::Config::from_str(&driver_url)
            .map_err(|e| PgError::BadUrl(redact(&e.to_string(), password_of(url))))?;
        let user = config.get_user().map(str::to_string).ok_or_else(|| PgError::BadUrl("it names no user".into()))?;
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            Some(tokio_postgres::config::Host::Unix(p)) => {
                tls.mode = tls::SslMode::Disable; // libpq's rule: no TLS on a Unix socket
                p.display().to_string()
            }
            None => return Err(PgError::BadUrl("it names no host".into())),
        };
        config.ssl_mode(tls.mode.for_driver());
        let connector = tls.connector().map_err(PgError::TlsSettings)?;
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let db = config.get_dbname().map_or_else(|| user.clone(), str::to_string);
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name("sessions-mcp");
        notice_vanished_peers(&mut config);
        Ok(PgTarget { config, tls, connector, addr: format!("{host}:{port}"), user, db })
    }

    /// The URL's TLS parameters.
    pub fn tls(&self) -> &tls::TlsOptions {
        &self.tls
    }

    /// Whether the server is on this machine (a Unix socket, or a loopback address or name), so
    /// that what crosses the connection does not cross a network.
    pub fn is_local(&self) -> bool {
        if let Some(ip) = self.config.get_hostaddrs().first() {
            return ip.is_loopback();
        }
        match self.config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => {
                h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
            }
            _ => true,
        }
    }

    /// One connection outside any pool (the listener's, the sweep lock's), its failure classified;
    /// its `Connection` half must be polled for the client to work.
    pub async fn connect_one(&self) -> Result<(tokio_postgres::Client, Connection), PgError> {
        self.config.connect(self.connector.clone()).await.map_err(|e| self.classify(&e))
    }

    /// A pool of connections to the database, checked by taking one: the first failure says
    /// what is wrong in one line.
    pub async fn connect(&self) -> Result<Pool, PgError> {
        let manager = Manager::from_config(
            self.config.clone(),
            self.connector.clone(),
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| self.backend(e))?;
        drop(self.client(&pool).await?);
        Ok(pool)
    }

    /// One connection of `pool`, its failure classified.
    pub async fn client(&self, pool: &Pool) -> Result<deadpool_postgres::Object, PgError> {
        pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => self.classify(&e),
            deadpool_postgres::PoolError::Timeout(_) => PgError::Unreachable {
                addr: self.addr.clone(),
                detail: format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
            },
            other => self.backend(other),
        })
    }

    /// A driver error as one line about this target.
    /// The server's `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn classify(&self, e: &tokio_postgres::Error) -> PgError {
        if let Some((detail, advice)) = tls::advice(e) {
            return PgError::Tls { addr: self.addr.clone(), detail, advice };
        }
        let cause = match e.as_db_error() {
            Some(db) => Cause::Server { code: db.code().clone(), message: db.message().to_string() },
            None => match io_cause(e) {
                Some(io) => Cause::Io(io),
                None => Cause::Other(e.to_string()),
            },
        };
        self.classify_cause(cause)
    }

    fn classify_cause(&self, cause: Cause) -> PgError {
        let addr = self.addr.clone();
        match cause {
            Cause::Io(detail) => PgError::Unreachable { addr, detail },
            Cause::Server { code, message }
                if code == SqlState::INVALID_PASSWORD || code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
            {
                PgError::AuthFailed { addr, user: self.user.clone(), detail: message }
            }
            Cause::Server { code, .. } if code == SqlState::INVALID_CATALOG_NAME => {
                PgError::NoDatabase { addr, db: self.db.clone() }
            }
            // The server asked for a password the URL does not carry (the driver says so itself).
            Cause::Other(text) if text.contains("password missing") => PgError::AuthFailed {
                addr,
                user: self.user.clone(),
                detail: "the server asks for a password and the store URL has none".into(),
            },
            Cause::Server { message, .. } | Cause::Other(message) => {
                PgError::Backend { target: self.to_string(), detail: message }
            }
        }
    }

    fn backend(&self, e: impl std::fmt::Display) -> PgError {
        PgError::Backend { target: self.to_string(), detail: e.to_string() }
    }
}

/// What a driver error came from, as far as telling the operator goes.
#[derive(Debug)]
enum Cause {
    /// The server answered with an error.
    Server {
        code: SqlState,
        message: String,
    },
    /// The socket failed: refused, timed out, no route.
    Io(String),
    Other(String),
}

/// The I/O error under a driver error, if the socket is what failed.
fn io_cause(e: &tokio_postgres::Error) -> Option<String> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return Some(io.to_string());
        }
        source = s.source();
    }
    None
}

/// The password of a URL's user info, to keep it out of any message.
fn password_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split(['/', '?']).next()?.rsplit_once('@')?.0;
    userinfo.split_once(':').map(|(_, p)| p).filter(|p| !p.is_empty())
}

fn redact(text: &str, password: Option<&str>) -> String {
    match password {
        Some(p) => text.replace(p, "***"),
        None => text.to_string(),
    }
}

/// What a database holds, as far as sessions-mcp is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaState {
    /// No tables: a migration creates the schema.
    Empty,
    /// Ours, at this version (at most [`PG_SCHEMA_VERSION`]).
    Ours { version: i64 },
    /// Ours, written by a newer sessions-mcp.
    Newer { version: i64 },
    /// Tables, but not our marker (the first few names).
    Foreign { tables: Vec<String> },
}

impl SchemaState {
    /// The state as a refusal when this build cannot use the database.
    pub fn refusal(&self, target: &PgTarget) -> Option<PgError> {
        match self {
            SchemaState::Newer { version } => {
                Some(PgError::TooNew { target: target.to_string(), found: *version, supported: PG_SCHEMA_VERSION })
            }
            SchemaState::Foreign { tables } => {
                Some(PgError::NotOurs { target: target.to_string(), tables: tables.join(", ") })
            }
            SchemaState::Empty | SchemaState::Ours { .. } => None,
        }
    }
}

/// Reads what the database's current schema holds.
pub async fn inspect(tx: &Transaction<'_>) -> Result<SchemaState, tokio_postgres::Error> {
    let tables: Vec<String> = tx
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if tables.is_empty() {
        return Ok(SchemaState::Empty);
    }
    if !tables.iter().any(|t| t == schema::MARKER_TABLE) {
        return Ok(SchemaState::Foreign { tables: tables.into_iter().take(3).collect() });
    }
    let version: i64 = tx.query_one("SELECT coalesce(max(version), 0) FROM schema_version", &[]).await?.get(0);
    Ok(if version > PG_SCHEMA_VERSION { SchemaState::Newer { version } } else { SchemaState::Ours { version } })
}

/// Inside `tx`: takes the schema lock, refuses a database that is not ours or is newer, and
/// applies the migrations it lacks (an empty database gets the schema and the marker). Returns
/// the state found before migrating. Nothing is visible before `tx` commits.
pub async fn ensure_schema(tx: &Transaction<'_>, target: &PgTarget) -> Result<SchemaState, PgError> {
    let fail = |e: tokio_postgres::Error| target.classify(&e);
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK]).await.map_err(fail)?;
    let found = inspect(tx).await.map_err(fail)?;
    if let Some(refusal) = found.refusal(target) {
        return Err(refusal);
    }
    let from = match found {
        SchemaState::Ours { version } => version,
        _ => 0,
    };
    for (i, sql) in schema::MIGRATIONS.iter().enumerate().skip(from as usize) {
        let version = i as i64 + 1;
        tx.batch_execute(sql).await.map_err(fail)?;
        if version == 1 {
            tx.execute(
                "INSERT INTO sessions_mcp (product, created_at) VALUES ('sessions-mcp', $1)",
                &[&super::now_ms()],
            )
            .await
            .map_err(fail)?;
        }
        tx.execute("INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)", &[&version, &super::now_ms()])
            .await
            .map_err(fail)?;
        tracing::info!(version, %target, "PostgreSQL schema migrated");
    }
    Ok(found)
}

/// Opens a pool on `target` with the schema at [`PG_SCHEMA_VERSION`] (created in an empty
/// database, migrated forward in an older one); a database that is not ours or is newer is refused.
pub async fn open(target: &PgTarget) -> Result<Pool, PgError> {
    let pool = target.connect().await?;
    let mut client = target.client(&pool).await?;
    let tx = client.transaction().await.map_err(|e| target.classify(&e))?;
    ensure_schema(&tx, target).await?;
    tx.commit().await.map_err(|e| target.classify(&e))?;
    drop(client);
    Ok(pool)
}

/// What `doctor` reports of a PostgreSQL store.
#[derive(Debug)]
pub struct Facts {
    /// `server_version`, e.g. `15.14 (Debian 15.14-0+deb12u1)`.
    pub server_version: String,
    /// The database's clock minus this machine's, in milliseconds (halfway through the query).
    pub skew_ms: i64,
    pub schema: SchemaState,
    /// The connection's TLS version and cipher (`pg_stat_ssl`), `None` when it is plain.
    pub tls: Option<(String, String)>,
}

/// Looks at `target` without changing anything: its version, its clock, its schema.
pub async fn facts(target: &PgTarget) -> Result<Facts, PgError> {
    let fail = |e: tokio_postgres::Error| target.classify(&e);
    let pool = target.connect().await?;
    let mut client = target.client(&pool).await?;
    let server_version: String = client.query_one("SHOW server_version", &[]).await.map_err(fail)?.get(0);
    let before = super::now_ms();
    let db_ms: i64 =
        client.query_one("SELECT (extract(epoch FROM now()) * 1000)::bigint", &[]).await.map_err(fail)?.get(0);
    let after = super::now_ms();
    let tls = client
        .query_opt("SELECT version, cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl", &[])
        .await
        .map_err(fail)?
        .map(|r| (r.get(0), r.get(1)));
    // Only reads; rolled back all the same.
    let tx = client.transaction().await.map_err(fail)?;
    let schema = inspect(&tx).await.map_err(fail)?;
    tx.rollback().await.map_err(fail)?;
    Ok(Facts { server_version, skew_ms: db_ms - (before + after) / 2, schema, tls })
}

/// Whether the database stores text as UTF-8 (what every string of the store is).
pub async fn check_encoding(tx: &Transaction<'_>, target: &PgTarget) -> Result<(), PgError> {
    let found: String = tx.query_one("SHOW server_encoding", &[]).await.map_err(|e| target.classify(&e))?.get(0);
    if found.eq_ignore_ascii_case("UTF8") {
        Ok(())
    } else {
        Err(PgError::Encoding { target: target.to_string(), found })
    }
}

/// The test database of `SESSIONS_MCP_TEST_PG`, or why there is none: a failure under CI (the
/// CI script starts one), a skip elsewhere.
#[cfg(test)]
pub(crate) fn test_url() -> Option<String> {
    match std::env::var("SESSIONS_MCP_TEST_PG").ok().filter(|v| !v.is_empty()) {
        Some(url) => Some(url),
        None if std::env::var_os("CI").is_some() => {
            panic!("SESSIONS_MCP_TEST_PG is unset under CI: .ci/postgres.sh starts the test database")
        }
        None => {
            eprintln!("skipped: SESSIONS_MCP_TEST_PG is unset (a postgres:// URL of a server to test against)");
            None
        }
    }
}

/// Creates a database on the test server, runs `f` on a target naming it, and drops it (a
/// skip, or a failure under CI, without `SESSIONS_MCP_TEST_PG`: see [`test_url`]).
#[cfg(test)]
pub(crate) async fn with_test_database(f: impl AsyncFnOnce(PgTarget)) {
    let Some(url) = test_url() else { return };
    let admin = PgTarget::parse(&url).unwrap();
    let pool = admin.connect().await.unwrap();
    let client = admin.client(&pool).await.unwrap();
    let name = format!("smcp_lib_{}", uuid::Uuid::new_v4().simple());
    client.batch_execute(&format!("CREATE DATABASE \"{name}\" ENCODING 'UTF8' TEMPLATE template0")).await.unwrap();
    let mut config = admin.config.clone();
    config.dbname(&name);
    f(PgTarget { config, db: name.clone(), ..admin.clone() }).await;
    client.batch_execute(&format!("DROP DATABASE \"{name}\" WITH (FORCE)")).await.unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> PgTarget {
        PgTarget::parse("postgres://alice:s3cret@db.example:6543/sessions").unwrap()
    }

    #[test]
    fn a_target_shows_user_host_port_and_database_but_never_the_password() {
        let t = target();
        assert_eq!(t.to_string(), "postgres://alice@db.example:6543/sessions");
        assert!(!format!("{t:?}").contains("s3cret"));
        let t = PgTarget::parse("postgresql://bob@localhost").unwrap();
        assert_eq!(t.to_string(), "postgres://bob@localhost:5432/bob", "port and database default as PostgreSQL's do");
    }

    #[test]
    fn every_session_asks_the_server_to_notice_a_vanished_node_unless_the_url_says_otherwise() {
        let t = target();
        assert_eq!(t.config.get_options(), Some(SESSION_OPTIONS));
        assert_eq!(t.config.get_keepalives_idle(), CLIENT_KEEPALIVE_IDLE);
        assert_eq!(t.config.get_tcp_user_timeout(), Some(&CLIENT_TCP_USER_TIMEOUT));
        let own =
            PgTarget::parse("postgres://a@h/db?options=-c%20statement_timeout%3D5000&keepalives_idle=60").unwrap();
        assert_eq!(own.config.get_options(), Some(format!("{SESSION_OPTIONS} -c statement_timeout=5000").as_str()));
        assert_eq!(own.config.get_keepalives_idle(), Duration::from_secs(60));
    }

    #[tokio::test]
    async fn postgres_the_server_applies_the_session_options() {
        let Some(url) = test_url() else { return };
        let target = PgTarget::parse(&url).unwrap();
        let (client, connection) = target.connect_one().await.unwrap();
        tokio::spawn(connection);
        let show =
            async |name: &str| -> String { client.query_one(&format!("SHOW {name}"), &[]).await.unwrap().get(0) };
        assert_eq!(show("tcp_keepalives_idle").await, "10");
        assert_eq!(show("tcp_keepalives_interval").await, "5");
        assert_eq!(show("tcp_keepalives_count").await, "3");
        assert_eq!(show("idle_in_transaction_session_timeout").await, "30s");
    }

    #[test]
    fn a_url_that_is_not_postgres_is_one_line_without_its_password() {
        for bad in ["mysql://a:b@h/db", "sqlite:///tmp/x.db", "postgres://a:topsecret@h:notaport/db", "postgres:///db"]
        {
            let e = PgTarget::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("the store URL is not a PostgreSQL URL ("), "{e}");
            assert!(!e.contains("topsecret"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn the_password_of_a_url_is_found_to_be_kept_out() {
        assert_eq!(password_of("postgres://u:p%40ss@h/db"), Some("p%40ss"));
        assert_eq!(password_of("postgres://u@h/db"), None);
        assert_eq!(password_of("postgres://h/db?user=x"), None);
        assert_eq!(redact("bad port in u:pw@h", Some("pw")), "bad port in u:***@h");
    }

    fn server(code: &str, message: &str) -> Cause {
        Cause::Server { code: SqlState::from_code(code), message: message.into() }
    }

    #[test]
    fn errors_are_classified_into_one_line_each() {
        let t = target();
        let line = |c| t.classify_cause(c).to_string();
        let refused = line(Cause::Io("Connection refused (os error 111)".into()));
        assert_eq!(
            refused,
            "cannot reach PostgreSQL at db.example:6543 (Connection refused (os error 111)); start the server, or fix the host and port of the store URL"
        );
        let auth = line(server("28P01", "password authentication failed for user \"alice\""));
        assert!(
            auth.starts_with("PostgreSQL at db.example:6543 refused user \"alice\": authentication failed"),
            "{auth}"
        );
        let hba = line(server("28000", "no pg_hba.conf entry for host \"10.0.0.1\""));
        assert!(hba.contains("refused user \"alice\""), "{hba}");
        let missing = line(Cause::Other("invalid configuration: password missing".into()));
        assert!(missing.contains("the server asks for a password and the store URL has none"), "{missing}");
        let no_db = line(server("3D000", "database \"sessions\" does not exist"));
        assert_eq!(
            no_db,
            "PostgreSQL at db.example:6543 has no database \"sessions\"; create it (createdb -E UTF8 sessions) or fix the store URL"
        );
        let other = line(server("42P01", "relation \"x\" does not exist"));
        assert_eq!(other, "postgres://alice@db.example:6543/sessions: relation \"x\" does not exist");
        for l in [refused, auth, hba, missing, no_db, other] {
            assert!(!l.contains('\n') && !l.contains("s3cret"), "{l}");
        }
    }

    #[test]
    fn a_newer_or_foreign_schema_is_refused_and_ours_or_empty_is_not() {
        let t = target();
        let newer = SchemaState::Newer { version: 7 }.refusal(&t).unwrap().to_string();
        assert_eq!(
            newer,
            format!(
                "postgres://alice@db.example:6543/sessions has schema version 7, newer than this sessions-mcp writes ({PG_SCHEMA_VERSION}); upgrade sessions-mcp"
            )
        );
        let foreign = SchemaState::Foreign { tables: vec!["accounts".into(), "orders".into()] }.refusal(&t).unwrap();
        assert!(foreign.to_string().contains("is not a sessions-mcp database (it has tables, e.g. accounts, orders, but no sessions_mcp marker table)"), "{foreign}");
        assert!(SchemaState::Empty.refusal(&t).is_none());
        assert!(SchemaState::Ours { version: 1 }.refusal(&t).is_none());
    }

    #[tokio::test]
    async fn postgres_open_creates_the_schema_and_marker_once_even_when_two_open_at_once() {
        with_test_database(async |target| {
            let (a, b) = tokio::join!(open(&target), open(&target));
            let (a, b) = (a.unwrap(), b.unwrap());
            drop((a, b));
            let pool = open(&target).await.unwrap();
            let mut client = target.client(&pool).await.unwrap();
            let one = |sql: &'static str| {
                let client = &client;
                async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
            };
            assert_eq!(one("SELECT count(*) FROM schema_version").await, PG_SCHEMA_VERSION);
            assert_eq!(one("SELECT count(*) FROM sessions_mcp").await, 1);
            let tx = client.transaction().await.unwrap();
            assert_eq!(inspect(&tx).await.unwrap(), SchemaState::Ours { version: PG_SCHEMA_VERSION });
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_version_3_databases_bridge_message_ids_move_apart_from_the_tools_idempotency_keys() {
        with_test_database(async |target| {
            let pool = open(&target).await.unwrap();
            let client = target.client(&pool).await.unwrap();
            // Back to version 3 (versions 4 and 5 changed rows; 6, 7, 8 and 10 are undone here, to
            // be applied again; 9 applies again as it is), with the rows a bridge and a spawn left
            // there.
            let rows = crate::store::tests::V10_IDEMPOTENCY_ROWS.replace("{now}", &crate::store::now_ms().to_string());
            let undo_6 = "DROP TABLE access_tokens; ALTER TABLE budget_live DROP COLUMN waiting_since;
                          ALTER TABLE asks DROP COLUMN routes, DROP COLUMN answered_host;
                          DROP TABLE node_leases; DROP INDEX runs_running_owner;
                          CREATE INDEX runs_running_lease ON runs (lease_until) WHERE status = 'running';
                          ALTER TABLE runs DROP COLUMN remote_task_id;";
            client
                .batch_execute(&format!("DELETE FROM schema_version WHERE version > 3; {undo_6} {rows}"))
                .await
                .unwrap();
            drop((client, pool));
            let dir = tempfile::tempdir().unwrap();
            let store = crate::store::Store::open_postgres(target, dir.path()).unwrap();
            crate::store::tests::assert_idempotency_namespaces_apart(&store);
        })
        .await;
    }

    #[tokio::test]
    async fn postgres_facts_see_an_empty_database_and_a_small_skew() {
        with_test_database(async |target| {
            let facts = facts(&target).await.unwrap();
            assert_eq!(facts.schema, SchemaState::Empty);
            assert!(facts.skew_ms.abs() < 1_000, "{facts:?}");
            assert!(facts.server_version.chars().next().is_some_and(|c| c.is_ascii_digit()), "{facts:?}");
        })
        .await;
    }

    #[test]
    fn the_postgres_schema_follows_the_sqlite_schema_version() {
        assert_eq!(
            schema::MIRRORS_SQLITE_VERSION,
            crate::store::SCHEMA_VERSION,
            "the SQLite store has a new migration: add the same change to store/postgres/schema.rs as a new migration"
        );
    }

    #[test]
    fn the_postgres_schema_has_every_table_and_column_of_the_sqlite_schema() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(&dir.path().join("s.db")).unwrap();
        let sqlite = copy::sqlite_columns(&rusqlite::Connection::open(store.path()).unwrap()).unwrap();
        let tables: Vec<&str> = sqlite.iter().map(|(t, _)| t.as_str()).collect();
        let mut expected: Vec<&str> = schema::DATA_TABLES.to_vec();
        expected.sort_unstable();
        assert_eq!(tables, expected, "DATA_TABLES lists the SQLite store's tables");
        let ddl: String = schema::MIGRATIONS.concat();
        for (table, columns) in &sqlite {
            let head = format!("CREATE TABLE {table} (");
            let start = ddl.find(&head).unwrap_or_else(|| panic!("no table {table}")) + head.len();
            let body = &ddl[start..start + ddl[start..].find(");").unwrap()];
            for c in columns {
                let pg_type = match c.decl.as_str() {
                    "INTEGER" => "BIGINT",
                    "REAL" => "DOUBLE",
                    "TEXT" => "TEXT",
                    "BLOB" => "BYTEA",
                    other => panic!("{table}.{}: SQLite type {other} has no mapping", c.name),
                };
                // In the CREATE TABLE, or added by a later migration.
                let added = format!("ALTER TABLE {table} ADD COLUMN {} ", c.name);
                let line = body
                    .split(['\n', ','])
                    .map(str::split_whitespace)
                    .find_map(|mut w| (w.next() == Some(c.name.as_str())).then(|| w.next().unwrap_or("").to_string()))
                    .or_else(|| {
                        let at = ddl.find(&added)? + added.len();
                        ddl[at..].split_whitespace().next().map(|t| t.trim_end_matches(';').to_string())
                    });
                assert_eq!(line.as_deref(), Some(pg_type), "PostgreSQL column {table}.{}", c.name);
            }
        }
    }
}
