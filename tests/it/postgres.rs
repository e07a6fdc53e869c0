//! PostgreSQL, black-box: `migrate --to` and `doctor --store-url` of the real binary against the
//! server of `SESSIONS_MCP_TEST_PG` (a `postgres://` URL of a user that may create databases; CI
//! starts one with .ci/postgres.sh). Each test creates a database of its own and drops it.
//! Without the variable the tests fail under CI (`CI` set) and are skipped elsewhere.

use crate::common;

use std::process::Output;
use std::str::FromStr;

use common::TestEnv;
use serde_json::json;

/// The server under test: how to reach it as its admin user.
struct Server {
    user: String,
    password: String,
    host: String,
    port: u16,
    admin: String,
}

fn server() -> Option<Server> {
    let Some(admin) = std::env::var("SESSIONS_MCP_TEST_PG").ok().filter(|v| !v.is_empty()) else {
        if std::env::var_os("CI").is_some() {
            panic!("SESSIONS_MCP_TEST_PG is unset under CI: .ci/run starts the test database with .ci/postgres.sh");
        }
        eprintln!("skipped: SESSIONS_MCP_TEST_PG is unset (a postgres:// URL of a server to test against)");
        return None;
    };
    let config = tokio_postgres::Config::from_str(&admin).expect("SESSIONS_MCP_TEST_PG is a postgres:// URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        other => panic!("SESSIONS_MCP_TEST_PG names no TCP host: {other:?}"),
    };
    Some(Server {
        user: config.get_user().expect("a user").to_string(),
        password: String::from_utf8(config.get_password().unwrap_or_default().to_vec()).unwrap(),
        host,
        port: config.get_ports().first().copied().unwrap_or(5432),
        admin,
    })
}

/// Runs `f` with a fresh connection to `url`.
fn with_client<T>(url: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (client, conn) =
            tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect to the test server");
        let conn = tokio::spawn(conn);
        let out = f(&client).await;
        drop(client);
        let _ = conn.await;
        out
    })
}

fn execute(url: &str, sql: &str) {
    with_client(url, async |c| c.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")));
}

fn query(url: &str, sql: &str) -> Vec<tokio_postgres::Row> {
    with_client(url, async |c| c.query(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}")))
}

fn count(url: &str, table: &str) -> i64 {
    query(url, &format!("SELECT count(*) FROM \"{table}\""))[0].get(0)
}

/// A database of one test, dropped at its end.
struct Db<'a> {
    server: &'a Server,
    name: String,
}

impl<'a> Db<'a> {
    fn create(server: &'a Server) -> Db<'a> {
        let name = format!("smcp_test_{}", uuid::Uuid::new_v4().simple());
        execute(&server.admin, &format!("CREATE DATABASE \"{name}\" ENCODING 'UTF8' TEMPLATE template0"));
        Db { server, name }
    }

    fn url(&self) -> String {
        self.url_with(&self.server.password)
    }

    fn url_with(&self, password: &str) -> String {
        let s = self.server;
        format!("postgres://{}:{password}@{}:{}/{}", s.user, s.host, s.port, self.name)
    }

    /// How the target is shown: no password.
    fn shown(&self) -> String {
        let s = self.server;
        format!("postgres://{}@{}:{}/{}", s.user, s.host, s.port, self.name)
    }
}

impl Drop for Db<'_> {
    fn drop(&mut self) {
        execute(&self.server.admin, &format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name));
    }
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// The one line a refused command prints on stderr (and exit code 2).
fn refused(out: &Output) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "refused with exit 2: {err}{}", text(&out.stdout));
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(out.stdout.is_empty(), "nothing on stdout: {}", text(&out.stdout));
    lines[0].to_string()
}

/// A store with sessions (one spawned by the other), messages, runs, run tokens and an
/// idempotency key.
fn seeded() -> TestEnv {
    let env = TestEnv::sqlite();
    env.seed(json!({
        "sessions": [
            {"key": "agent:main:main", "label": "the main one", "messages": [
                {"role": "user", "content": "hello, ünïcode ✓"},
                {"role": "assistant", "content": [{"type": "text", "text": "hi"}], "model": "m1"},
                {"role": "user", "content": "quote ' and \" and \\ backslash"}
            ]},
            {"key": "agent:main:subagent:child", "spawnedBy": "agent:main:main", "messages": [
                {"role": "user", "content": "child task"}
            ]},
            {"key": "agent:main:cron:nightly"}
        ],
        "runs": [
            {"runId": "run-done", "sessionKey": "agent:main:subagent:child", "status": "ok", "input": "child task"},
            {"runId": "run-live", "sessionKey": "agent:main:main", "status": "running", "input": "go"}
        ],
        "runTokens": [
            {"token": "tok-secret-1", "sessionKey": "agent:main:subagent:child", "runId": "run-done"}
        ],
        "idempotencyKeys": [
            {"caller": "agent:main:main", "key": "k1", "tool": "sessions_send", "argsHash": "abc", "runId": "run-live"}
        ]
    }));
    env
}

/// The row count of every data table of the SQLite store.
fn sqlite_counts(env: &TestEnv) -> Vec<(String, i64)> {
    let conn = rusqlite::Connection::open(env.state_dir().join("sessions.db")).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'schema_version' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    tables
        .into_iter()
        .map(|t| {
            let n: i64 = conn.query_row(&format!("SELECT count(*) FROM \"{t}\""), [], |r| r.get(0)).unwrap();
            (t, n)
        })
        .collect()
}

fn migrate(env: &TestEnv, url: &str) -> Output {
    env.run(&["migrate", "--to", url])
}

#[test]
fn migrate_copies_every_row_keeps_ids_and_leaves_the_sqlite_store_as_it_was() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let env = seeded();
    let before = env.fingerprint();
    let counts = sqlite_counts(&env);
    let out = migrate(&env, &db.url());
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}{stdout}", text(&out.stderr));
    assert!(!stdout.contains(&server.password) && !text(&out.stderr).contains(&server.password));

    // One line per table and the total.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), counts.len() + 1, "{stdout}");
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    assert!(
        lines.last().unwrap().starts_with(&format!(
            "migrated {total} rows in {} tables to {}",
            counts.len(),
            db.shown()
        )),
        "{stdout}"
    );
    for (table, n) in &counts {
        let line = lines.iter().find(|l| l.split_whitespace().next() == Some(table.as_str())).expect(table);
        assert!(line.contains(&format!(" {n} rows  sha256 ")), "{line}");
        assert_eq!(count(&db.url(), table), *n, "every row of {table} arrived");
    }
    let expect = |table: &str, min: i64| {
        let n = counts.iter().find(|(t, _)| t == table).unwrap().1;
        assert!(n >= min, "the world has {min}+ rows in {table}: {n}");
    };
    expect("sessions", 3);
    expect("messages", 4);
    expect("runs", 2);
    expect("tokens", 1);
    expect("idempotency", 1);
    expect("session_tree", 1);

    // A few values, as they were.
    let url = db.url();
    let rows = query(
        &url,
        "SELECT s.key, s.label, m.seq, m.role, m.content FROM messages m JOIN sessions s ON s.id = m.session
         WHERE s.key = 'agent:main:main' ORDER BY m.seq",
    );
    let got: Vec<(String, Option<String>, i64, String, String)> =
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].1.as_deref(), Some("the main one"));
    assert_eq!((got[0].2, got[0].3.as_str()), (1, "user"));
    assert!(got[0].4.contains("hello, ünïcode ✓"), "{}", got[0].4);
    // Every message's content, byte for byte as SQLite holds it.
    let conn = rusqlite::Connection::open(env.state_dir().join("sessions.db")).unwrap();
    let in_sqlite: Vec<(i64, String)> = conn
        .prepare("SELECT id, content FROM messages ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let in_pg: Vec<(i64, String)> =
        query(&url, "SELECT id, content FROM messages ORDER BY id").iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(in_pg, in_sqlite);
    let status: String = query(&url, "SELECT status FROM runs WHERE run_id = 'run-live'")[0].get(0);
    assert_eq!(status, "running");
    let token: String = query(&url, "SELECT session_key FROM tokens")[0].get(0);
    assert_eq!(token, "agent:main:subagent:child");
    let version: i64 = query(&url, "SELECT max(version) FROM schema_version")[0].get(0);
    assert_eq!(version, 10);
    let marker: String = query(&url, "SELECT product FROM sessions_mcp")[0].get(0);
    assert_eq!(marker, "sessions-mcp");

    // Ids are kept, and the next one is past them.
    let max: i64 = query(&url, "SELECT max(id) FROM sessions")[0].get(0);
    let next: i64 = query(
        &url,
        "INSERT INTO sessions (key, session_id, agent_id, kind, driver, created_at, updated_at)
         VALUES ('agent:main:new', 'n', 'main', 'other', 'driven', 0, 0) RETURNING id",
    )[0]
    .get(0);
    assert_eq!(next, max + 1);

    assert_eq!(env.fingerprint(), before, "the SQLite store is unchanged");
}

#[test]
fn a_second_migrate_into_the_same_database_is_refused_and_changes_nothing() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let env = seeded();
    let first = migrate(&env, &db.url());
    assert!(first.status.success(), "{}", text(&first.stderr));
    let snapshot = || -> Vec<(String, i64)> {
        ["sessions", "messages", "runs", "tokens", "schema_version"]
            .iter()
            .map(|t| (t.to_string(), count(&db.url(), t)))
            .collect()
    };
    let before = snapshot();
    env.seed(json!({"sessions": [{"key": "agent:main:later", "messages": [{"role": "user", "content": "new"}]}]}));
    // This time the URL comes from the environment, as an operator keeps a password out of `ps`.
    let line = refused(&env.command(&["migrate"]).env("SESSIONS_MCP_STORE_URL", db.url()).output().unwrap());
    assert!(line.starts_with(&format!("sessions-mcp: {} already holds sessions-mcp data (", db.shown())), "{line}");
    assert!(line.ends_with("migrate only into an empty database"), "{line}");
    assert_eq!(snapshot(), before, "nothing changed");
}

#[test]
fn an_unreachable_server_is_one_line_in_migrate_and_doctor() {
    let Some(server) = server() else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://{}:{}@127.0.0.1:{port}/nowhere", server.user, server.password);
    let env = seeded();
    let line = refused(&migrate(&env, &url));
    assert!(line.starts_with(&format!("sessions-mcp: cannot reach PostgreSQL at 127.0.0.1:{port} (")), "{line}");
    assert!(!line.contains(&server.password));
    let out = env.run(&["doctor", "--store-url", &url]);
    let stdout = text(&out.stdout);
    assert!(!out.status.success());
    let problem = stdout.lines().find(|l| l.starts_with("store url problem:")).expect(&stdout);
    assert!(problem.contains(&format!("cannot reach PostgreSQL at 127.0.0.1:{port}")), "{problem}");
    assert!(!stdout.contains(&server.password));
}

#[test]
fn a_wrong_password_is_one_line_naming_the_user_in_migrate_and_doctor() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let url = db.url_with("not-the-password-42");
    let env = seeded();
    let line = refused(&migrate(&env, &url));
    let expected =
        format!("PostgreSQL at {}:{} refused user {:?}: authentication failed", server.host, server.port, server.user);
    assert!(line.starts_with(&format!("sessions-mcp: {expected}")), "{line}");
    assert!(!line.contains("not-the-password-42"), "{line}");
    let out = env.run(&["doctor", "--store-url", &url]);
    let stdout = text(&out.stdout);
    assert!(stdout.lines().any(|l| l.starts_with(&format!("store url problem: {expected}"))), "{stdout}");
    assert!(!stdout.contains("not-the-password-42"));
    assert_eq!(query(&db.url(), "SELECT 1 FROM information_schema.tables WHERE table_schema = 'public'").len(), 0);
}

#[test]
fn a_missing_database_is_one_line() {
    let Some(server) = server() else { return };
    let url = format!("postgres://{}:{}@{}:{}/smcp_no_such_db", server.user, server.password, server.host, server.port);
    let line = refused(&migrate(&seeded(), &url));
    assert!(line.contains("has no database \"smcp_no_such_db\""), "{line}");
}

#[test]
fn a_newer_schema_is_refused_in_migrate_and_doctor() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let first = migrate(&seeded(), &db.url());
    assert!(first.status.success(), "{}", text(&first.stderr));
    execute(&db.url(), "INSERT INTO schema_version (version, applied_at) VALUES (99, 0)");
    let env = seeded();
    let line = refused(&migrate(&env, &db.url()));
    assert_eq!(
        line,
        format!(
            "sessions-mcp: {} has schema version 99, newer than this sessions-mcp writes (10); upgrade sessions-mcp",
            db.shown()
        )
    );
    let out = env.run(&["doctor", "--store-url", &db.url()]);
    let stdout = text(&out.stdout);
    assert!(!out.status.success());
    assert_schema_problem(&stdout, "has schema version 99, newer");
}

/// Doctor's output has a schema problem line saying `what`.
fn assert_schema_problem(stdout: &str, what: &str) {
    assert!(stdout.lines().any(|l| l.starts_with("store schema problem: ") && l.contains(what)), "{stdout}");
}

#[test]
fn a_database_that_is_not_ours_is_refused_and_left_alone() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    execute(&db.url(), "CREATE TABLE accounts (id int); INSERT INTO accounts VALUES (1)");
    let env = seeded();
    let line = refused(&migrate(&env, &db.url()));
    assert!(
        line.starts_with(&format!("sessions-mcp: {} is not a sessions-mcp database (it has tables, e.g. accounts, but no sessions_mcp marker table)", db.shown())),
        "{line}"
    );
    let tables: Vec<String> =
        query(&db.url(), "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'")
            .iter()
            .map(|r| r.get(0))
            .collect();
    assert_eq!(tables, ["accounts"], "nothing was written");
    let out = env.command(&["doctor"]).env("SESSIONS_MCP_STORE_URL", db.url()).output().unwrap();
    let stdout = text(&out.stdout);
    assert_schema_problem(&stdout, "is not a sessions-mcp database");
}

#[test]
fn doctor_reports_the_connection_the_schema_and_the_clock() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let env = seeded();
    let empty = env.run(&["doctor", "--store-url", &db.url()]);
    let stdout = text(&empty.stdout);
    assert!(stdout.contains("store schema: empty"), "{stdout}");
    assert!(migrate(&env, &db.url()).status.success());
    // The URL from the environment, as `serve` will take it.
    let out = env.command(&["doctor"]).env("SESSIONS_MCP_STORE_URL", db.url()).output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(&format!("store url: {} (PostgreSQL ", db.shown())), "{stdout}");
    assert!(stdout.contains("store schema: version 10, ours"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("store clock: ") && l.ends_with(" ms from this machine's")),
        "{stdout}"
    );
    assert!(!stdout.contains(&server.password));
    assert_eq!(stdout.lines().last(), Some("ok"));
}

#[test]
fn migrate_is_refused_while_a_daemon_or_serve_runs_and_without_a_store() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let none = TestEnv::sqlite();
    let line = refused(&migrate(&none, &db.url()));
    assert!(line.starts_with("sessions-mcp: no SQLite store at "), "{line}");
    let env = seeded();
    let daemon = env.daemon_http(&[]);
    let line = refused(&migrate(&env, &db.url()));
    assert!(line.contains("a daemon runs for "), "{line}");
    drop(daemon);
    let serve = env.serve(None);
    // Refused each time: a refused migrate never makes the serve hand its runtime over.
    for _ in 0..3 {
        let line = refused(&migrate(&env, &db.url()));
        assert!(line.contains("a serve or daemon process owns the runtime of "), "{line}");
        std::thread::sleep(std::time::Duration::from_millis(700));
    }
    serve.close();
    assert_eq!(
        query(&db.url(), "SELECT 1 FROM information_schema.tables WHERE table_schema = 'public'").len(),
        0,
        "nothing written"
    );
    let out = migrate(&env, &db.url());
    assert!(out.status.success(), "once the daemon is gone: {}", text(&out.stderr));
}

#[test]
fn a_row_postgresql_cannot_hold_fails_the_copy_and_rolls_all_of_it_back() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let env = seeded();
    let conn = rusqlite::Connection::open(env.state_dir().join("sessions.db")).unwrap();
    conn.execute("UPDATE messages SET content = 'a' || char(0) || 'b' WHERE id = (SELECT max(id) FROM messages)", [])
        .unwrap();
    drop(conn);
    let out = migrate(&env, &db.url());
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a failed copy exits 1: {err}");
    assert!(
        err.contains("table messages, row ") && err.contains("column content holds text with a NUL character"),
        "{err}"
    );
    assert!(err.trim_end().ends_with("nothing was written"), "{err}");
    let tables = query(&db.url(), "SELECT 1 FROM information_schema.tables WHERE table_schema = 'public'");
    assert!(tables.is_empty(), "the schema was rolled back with the rows");
}

#[test]
fn the_spawn_tree_is_kept_by_triggers_in_postgresql_as_in_sqlite() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let env = seeded();
    assert!(migrate(&env, &db.url()).status.success());
    // The same writes on both sides: a grandchild before its parent (the parent adopts it), then
    // a session's updated_at moving.
    let writes = [
        "INSERT INTO sessions (key, session_id, agent_id, kind, driver, spawned_by, created_at, updated_at)
         VALUES ('agent:main:subagent:g2', 'g2', 'main', 'other', 'driven', 'agent:main:subagent:c2', 1, 10)",
        "INSERT INTO sessions (key, session_id, agent_id, kind, driver, spawned_by, created_at, updated_at)
         VALUES ('agent:main:subagent:c2', 'c2', 'main', 'other', 'driven', 'agent:main:subagent:child', 1, 20)",
        "UPDATE sessions SET updated_at = 777 WHERE key = 'agent:main:subagent:g2'",
    ];
    let conn = rusqlite::Connection::open(env.state_dir().join("sessions.db")).unwrap();
    for w in writes {
        conn.execute(w, []).unwrap();
        execute(&db.url(), w);
    }
    let tree = "SELECT ancestor, session, updated_at FROM session_tree ORDER BY ancestor, session";
    let in_sqlite: Vec<(i64, i64, i64)> = conn
        .prepare(tree)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    let in_pg: Vec<(i64, i64, i64)> = query(&db.url(), tree).iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert!(in_sqlite.len() >= 6, "main→child, and main, child, c2 above g2, main and child above c2: {in_sqlite:?}");
    assert!(in_sqlite.iter().any(|r| r.2 == 777), "{in_sqlite:?}");
    assert_eq!(in_pg, in_sqlite);
}

#[test]
fn an_empty_sessions_mcp_schema_takes_a_copy_and_a_database_not_in_utf8_is_refused() {
    let Some(server) = server() else { return };
    let db = Db::create(&server);
    let empty = TestEnv::sqlite();
    assert!(empty.run(&["ls"]).status.success(), "creates the empty store");
    let out = migrate(&empty, &db.url());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).lines().last().unwrap().starts_with("migrated 0 rows in 15 tables"),
        "{}",
        text(&out.stdout)
    );
    let env = seeded();
    let out = migrate(&env, &db.url());
    assert!(out.status.success(), "ours and empty: it takes the copy: {}", text(&out.stderr));
    assert_eq!(count(&db.url(), "sessions"), 3);

    let ascii = Db { server: &server, name: format!("smcp_test_{}", uuid::Uuid::new_v4().simple()) };
    execute(&server.admin, &format!("CREATE DATABASE \"{}\" ENCODING 'SQL_ASCII' TEMPLATE template0", ascii.name));
    let line = refused(&migrate(&env, &ascii.url()));
    assert!(line.contains("has encoding SQL_ASCII; sessions-mcp stores text as UTF8"), "{line}");
}

/// The test server's TLS files (ca.crt, client.crt, client.key; .ci/postgres.sh makes them):
/// a failure under CI without them, a skip elsewhere.
fn tls_dir() -> Option<String> {
    match std::env::var("SESSIONS_MCP_TEST_PG_TLS").ok().filter(|v| !v.is_empty()) {
        Some(dir) => Some(dir),
        None if std::env::var_os("CI").is_some() => {
            panic!("SESSIONS_MCP_TEST_PG_TLS is unset under CI: .ci/postgres.sh makes the server's TLS files")
        }
        None => {
            eprintln!("skipped: SESSIONS_MCP_TEST_PG_TLS is unset (the test server's CA)");
            None
        }
    }
}

#[test]
fn migrate_and_doctor_go_over_tls_checked_as_the_url_says() {
    let Some(server) = server() else { return };
    let Some(tls) = tls_dir() else { return };
    let db = Db::create(&server);
    let ca = format!("sslmode=verify-full&sslrootcert={tls}/ca.crt");
    // The server's certificate is for localhost only.
    let by_name = format!("{}?hostaddr=127.0.0.1&{ca}", db.url().replacen("@127.0.0.1:", "@localhost:", 1));
    let env = seeded();
    let out = migrate(&env, &by_name);
    assert!(out.status.success(), "{}{}", text(&out.stderr), text(&out.stdout));
    let out = env.run(&["doctor", "--store-url", &by_name]);
    let stdout = text(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("store tls: ")).expect(&stdout);
    assert!(line.starts_with("store tls: TLSv1."), "{line}");
    assert!(line.ends_with(", the server's certificate and host name checked (sslmode verify-full)"), "{line}");
    assert!(stdout.contains("store schema: version 10, ours"), "{stdout}");

    // The same server by its address: its certificate does not name it, and nothing is copied.
    let by_address = format!("{}?{ca}", db.url());
    let line = refused(&migrate(&seeded(), &by_address));
    let expected = format!("TLS with PostgreSQL at {}:{} failed (", server.host, server.port);
    assert!(line.starts_with(&format!("sessions-mcp: {expected}")), "{line}");
    assert!(line.ends_with("the server's certificate is not for the host of the URL: connect by a name it carries (host=NAME, with hostaddr=IP if need be) or use sslmode=verify-ca"), "{line}");
    let stdout = text(&env.run(&["doctor", "--store-url", &by_address]).stdout);
    assert!(stdout.lines().any(|l| l.starts_with(&format!("store url problem: {expected}"))), "{stdout}");

    // Plain on loopback is said, and is not a problem.
    let out = env.run(&["doctor", "--store-url", &format!("{}?sslmode=disable", db.url())]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("\nstore tls: off (sslmode disable), the server is on this machine\n"), "{stdout}");
    assert!(out.status.success(), "{stdout}");

    // A TLS parameter the URL gets wrong: one line, which one and what is allowed.
    let line = refused(&migrate(&seeded(), &format!("{}?sslmode=verify", db.url())));
    assert_eq!(
        line,
        "sessions-mcp: the store URL's TLS settings: sslmode \"verify\" is not one of disable, prefer, require, verify-ca or verify-full"
    );
}
