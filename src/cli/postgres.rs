//! The PostgreSQL commands: `migrate --to postgres://…` (the SQLite store of the state dir into
//! an empty PostgreSQL database) and what `doctor --store-url` reports of one. Both need only a
//! small runtime of their own: they are one connection's work.

use std::process::ExitCode;

use crate::cli::Paths;
use crate::store::Store;
use crate::store::postgres::copy::{self, MigrateError};
use crate::store::postgres::tls::{TlsOptions, Verification};
use crate::store::postgres::{self, PgTarget, SchemaState};

/// Above this clock difference `doctor` warns: run leases will be stamped by the database clock
/// and checked against this machine's.
const SKEW_WARN_MS: i64 = 1_000;

/// A current-thread runtime: the copy holds the SQLite snapshot (not `Send`) across its awaits.
fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime").block_on(f)
}

/// `sessions-mcp migrate --to URL`: refuses (exit 2, nothing written) while a serve or daemon
/// runs for the state dir, or when the target is not ours, newer, or already holds data; copies
/// and verifies every table in one transaction; prints one line per table and a total.
pub fn migrate(paths: &Paths, to: &str) -> ExitCode {
    let target = match PgTarget::parse(to) {
        Ok(t) => t,
        Err(e) => return crate::cli::fail(e),
    };
    let state_dir = paths.state_dir();
    let sqlite = Store::path_in(&state_dir);
    if !sqlite.is_file() {
        return crate::cli::fail(MigrateError::NoStore(sqlite));
    }
    // Held until the copy is committed: no process becomes the owner and writes meanwhile.
    let _hold = match crate::engine::scheduler::hold_runtime(&state_dir) {
        Ok(h) => h,
        Err(e) => return crate::cli::fail(format!("{e}; migrate copies a store nobody is using")),
    };
    let started = std::time::Instant::now();
    match run(copy::copy_store(&sqlite, &target)) {
        Ok(tables) => {
            for t in &tables {
                println!("{:<16} {:>9} rows  sha256 {}", t.table, t.rows, t.sha256);
            }
            let total: u64 = tables.iter().map(|t| t.rows).sum();
            println!(
                "migrated {total} rows in {} tables to {target} in {:.2}s, every table compared; {} is unchanged",
                tables.len(),
                started.elapsed().as_secs_f64(),
                sqlite.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) if e.is_refusal() => crate::cli::fail(e),
        Err(e) => {
            eprintln!("sessions-mcp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `doctor --store-url URL`: the connection, the schema and the clock skew, one line each;
/// returns the number of problems.
pub fn doctor(url: &str) -> usize {
    let target = match PgTarget::parse(url) {
        Ok(t) => t,
        Err(e) => {
            println!("store url problem: {e}");
            return 1;
        }
    };
    let facts = match run(postgres::facts(&target)) {
        Ok(f) => f,
        Err(e) => {
            println!("store url problem: {e}");
            return 1;
        }
    };
    println!("store url: {target} (PostgreSQL {})", facts.server_version);
    let mut problems = 0;
    match &facts.schema {
        SchemaState::Ours { version } if *version == postgres::PG_SCHEMA_VERSION => {
            println!("store schema: version {version}, ours");
        }
        SchemaState::Ours { version } => {
            println!(
                "store schema: version {version}, ours (this build migrates it to {})",
                postgres::PG_SCHEMA_VERSION
            );
        }
        SchemaState::Empty => println!("store schema: empty (`sessions-mcp migrate --to` fills it)"),
        state => {
            let refusal = state.refusal(&target).map(|e| e.to_string()).unwrap_or_default();
            println!("store schema problem: {refusal}");
            problems += 1;
        }
    }
    let (line, problem) = clock_line(facts.skew_ms);
    println!("{line}");
    problems += usize::from(problem);
    let (line, problem) = tls_line(target.tls(), facts.tls.as_ref(), target.is_local());
    println!("{line}");
    problems + usize::from(problem)
}

/// doctor's line about the connection's TLS, and whether it is a problem: a plain connection
/// that crosses a network is one (what the store holds would be readable on the way).
fn tls_line(options: &TlsOptions, tls: Option<&(String, String)>, local: bool) -> (String, bool) {
    let mode = options.mode.as_str();
    let Some((version, cipher)) = tls else {
        if local {
            return (format!("store tls: off (sslmode {mode}), the server is on this machine"), false);
        }
        return (
            format!(
                "store tls problem: off (sslmode {mode}): what the store holds crosses the network readable; turn ssl on in the server's postgresql.conf and set sslmode=verify-full with sslrootcert"
            ),
            true,
        );
    };
    let checked = match options.verification() {
        Verification::ChainAndName => "the server's certificate and host name checked".to_string(),
        Verification::Chain => "the server's certificate checked, not its host name".to_string(),
        Verification::None => {
            "the server's certificate not checked (add sslrootcert and sslmode=verify-full to check it)".to_string()
        }
    };
    (format!("store tls: {version} {cipher}, {checked} (sslmode {mode})"), false)
}

/// doctor's line about the clock skew (the database's clock minus this machine's), and whether
/// it is a problem.
fn clock_line(skew_ms: i64) -> (String, bool) {
    if skew_ms.abs() <= SKEW_WARN_MS {
        return (format!("store clock: {skew_ms:+} ms from this machine's"), false);
    }
    let way = if skew_ms > 0 { "ahead of" } else { "behind" };
    let secs = skew_ms.unsigned_abs() as f64 / 1000.0;
    (
        format!(
            "store clock problem: the database clock is {way} this machine's by {secs:.1} s (over 1 s): run leases will depend on it; sync both clocks (NTP)"
        ),
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::{TlsOptions, clock_line, tls_line};

    #[test]
    fn plain_over_a_network_is_a_problem_and_on_this_machine_is_not() {
        let options = |q: &str| TlsOptions::split_url(&format!("postgres://u@h/db?{q}")).unwrap().1;
        let (line, problem) = tls_line(&options("sslmode=disable"), None, true);
        assert_eq!(
            (line.as_str(), problem),
            ("store tls: off (sslmode disable), the server is on this machine", false)
        );
        let (line, problem) = tls_line(&options(""), None, false);
        assert!(problem && line.starts_with("store tls problem: off (sslmode prefer): what the store holds"), "{line}");
        let on = ("TLSv1.3".to_string(), "TLS_AES_256_GCM_SHA384".to_string());
        let (line, problem) = tls_line(&options("sslmode=verify-full&sslrootcert=/ca.pem"), Some(&on), false);
        assert_eq!(
            (line.as_str(), problem),
            (
                "store tls: TLSv1.3 TLS_AES_256_GCM_SHA384, the server's certificate and host name checked (sslmode verify-full)",
                false
            )
        );
        let (line, _) = tls_line(&options("sslmode=require"), Some(&on), false);
        assert!(line.contains("certificate not checked (add sslrootcert"), "{line}");
    }

    #[test]
    fn a_skew_over_a_second_either_way_is_a_problem_and_up_to_one_is_not() {
        assert_eq!(clock_line(3), ("store clock: +3 ms from this machine's".to_string(), false));
        assert_eq!(clock_line(-1000), ("store clock: -1000 ms from this machine's".to_string(), false));
        let (ahead, problem) = clock_line(1_500);
        assert!(problem && ahead.contains("ahead of this machine's by 1.5 s (over 1 s): run leases"), "{ahead}");
        let (behind, problem) = clock_line(-62_000);
        assert!(problem && behind.contains("behind this machine's by 62.0 s"), "{behind}");
    }
}
