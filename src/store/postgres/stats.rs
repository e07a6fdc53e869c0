//! What PostgreSQL itself counted for one database, for the nodes benchmark: its committed and
//! rolled-back transactions (`pg_stat_database`) and, where the server loads
//! `pg_stat_statements`, its statements and those that took the write lock. Counters of a backend
//! reach the shared statistics when it goes idle (at most once a second) or exits.

/// One database's counters.
#[derive(Debug, Clone, Copy)]
pub struct DatabaseCounts {
    pub commits: i64,
    pub rollbacks: i64,
    /// (statements, those that took the write lock); None without pg_stat_statements.
    pub statements: Option<(i64, i64)>,
}

/// The counters of database `name`, read through `client` (a connection to any database of
/// the server).
pub async fn database_counts(
    client: &tokio_postgres::Client,
    name: &str,
) -> Result<DatabaseCounts, tokio_postgres::Error> {
    let row = client
        .query_one("SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1", &[&name])
        .await?;
    let statements = client
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint,
                    coalesce(sum(calls) FILTER (WHERE query LIKE '%pg_advisory_xact_lock($1)%'), 0)::bigint
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1",
            &[&name],
        )
        .await
        .ok()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)));
    Ok(DatabaseCounts { commits: row.get(0), rollbacks: row.get(1), statements })
}
