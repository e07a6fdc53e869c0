//! Copying an SQLite store into PostgreSQL (`sessions-mcp migrate --to`) without losing a row.
//! The SQLite side is read in one read transaction (one consistent snapshot, however the store
//! changes meanwhile); the PostgreSQL side is written in one transaction (the schema included),
//! and before it commits every table is compared on both sides: its row count and a sha256 over
//! a canonical encoding of every row ([`TableDigest`]). Any difference rolls all of it back, so
//! a failed copy leaves the database as it was. Ids are kept; identity sequences are set past
//! them. The SQLite store is only read.

use std::path::{Path, PathBuf};

use bytes::BytesMut;
use futures::TryStreamExt;
use rusqlite::Connection;
use rusqlite::types::ValueRef;
use sha2::{Digest, Sha256};
use tokio_postgres::Transaction;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::{PgError, PgTarget, SchemaState, schema};
use crate::store::{SCHEMA_VERSION, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("no SQLite store at {0}: nothing to migrate (point --state-dir at the state directory that holds it)")]
    NoStore(PathBuf),
    #[error(
        "the SQLite store {path} has schema version {found} and this sessions-mcp copies version {expected}: open it once with this version (e.g. `sessions-mcp ls`), then migrate"
    )]
    SqliteVersion { path: PathBuf, found: i64, expected: i64 },
    #[error("{target} already holds sessions-mcp data ({rows} rows in {table}); migrate only into an empty database")]
    NotEmpty { target: String, table: String, rows: i64 },
    #[error(transparent)]
    Pg(#[from] PgError),
    #[error(transparent)]
    Sqlite(#[from] StoreError),
    #[error("table {table}, row {row}: column {column} {problem}; nothing was written")]
    Row { table: String, row: u64, column: String, problem: String },
    #[error("the SQLite and PostgreSQL schemas differ: {0}; nothing was written")]
    Schema(String),
    #[error(
        "table {table} differs after the copy (SQLite: {sqlite_rows} rows, sha256 {sqlite_sha}; PostgreSQL: {pg_rows} rows, sha256 {pg_sha}); rolled back, nothing was written"
    )]
    Mismatch { table: String, sqlite_rows: u64, sqlite_sha: String, pg_rows: u64, pg_sha: String },
}

impl MigrateError {
    /// Whether the copy was refused before anything was tried (a usage or setup problem: exit 2)
    /// rather than failed on the way (exit 1). Either way nothing was written.
    pub fn is_refusal(&self) -> bool {
        match self {
            MigrateError::NoStore(_) | MigrateError::SqliteVersion { .. } | MigrateError::NotEmpty { .. } => true,
            MigrateError::Pg(e) => !matches!(e, PgError::Backend { .. }),
            _ => false,
        }
    }
}

/// One table as it was copied: its rows and their digest (the same on both sides).
#[derive(Debug, Clone)]
pub struct TableCopied {
    pub table: String,
    pub rows: u64,
    pub sha256: String,
}

/// One value, as both sides store it (the store's own, [`crate::store::sql::Cell`]).
pub use crate::store::sql::Cell;

impl Cell {
    /// Appends the canonical encoding: a tag byte, then the value (an integer as 8 big-endian
    /// bytes, a float by its bits so that no rounding hides a change, text and blobs prefixed by
    /// their length), so that no two different rows encode alike.
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Cell::Null => out.push(b'N'),
            Cell::Int(v) => {
                out.push(b'I');
                out.extend_from_slice(&v.to_be_bytes());
            }
            Cell::Real(v) => {
                out.push(b'R');
                out.extend_from_slice(&v.to_bits().to_be_bytes());
            }
            Cell::Text(v) => encode_bytes(b'T', v.as_bytes(), out),
            Cell::Blob(v) => encode_bytes(b'B', v, out),
        }
    }
}

fn encode_bytes(tag: u8, bytes: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// A cell is written into a column of its own type (the copy converted it so), through that
/// type's own encoding.
impl ToSql for Cell {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Cell::Null => Ok(IsNull::Yes),
            Cell::Int(v) => v.to_sql(ty, out),
            Cell::Real(v) => v.to_sql(ty, out),
            Cell::Text(v) => v.to_sql(ty, out),
            Cell::Blob(v) => v.to_sql(ty, out),
        }
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::INT8 | Type::FLOAT8 | Type::TEXT | Type::BYTEA)
    }

    to_sql_checked!();
}

/// The rows of one table, as a count and a sha256 that does not depend on their order (the two
/// databases need not return rows alike): each row's canonical encoding is hashed, the row
/// hashes are sorted, and the digest is taken over the count and the sorted hashes.
#[derive(Default)]
pub struct TableDigest {
    rows: Vec<[u8; 32]>,
    buf: Vec<u8>,
}

impl TableDigest {
    pub fn add(&mut self, row: &[Cell]) {
        self.buf.clear();
        self.buf.extend_from_slice(&(row.len() as u64).to_be_bytes());
        for cell in row {
            cell.encode(&mut self.buf);
        }
        self.rows.push(Sha256::digest(&self.buf).into());
    }

    /// The row count and the table's sha256 (hex).
    pub fn finish(mut self) -> (u64, String) {
        self.rows.sort_unstable();
        let mut hasher = Sha256::new();
        hasher.update((self.rows.len() as u64).to_be_bytes());
        for row in &self.rows {
            hasher.update(row);
        }
        (self.rows.len() as u64, hex::encode(hasher.finalize()))
    }
}

/// A column's type, the same on both sides: INTEGER/BIGINT, REAL/DOUBLE PRECISION, TEXT/TEXT,
/// BLOB/BYTEA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColType {
    Int,
    Real,
    Text,
    Blob,
}

impl ColType {
    /// The type of an `information_schema.columns.data_type`.
    fn from_pg(data_type: &str) -> Option<ColType> {
        match data_type {
            "bigint" => Some(ColType::Int),
            "double precision" => Some(ColType::Real),
            "text" => Some(ColType::Text),
            "bytea" => Some(ColType::Blob),
            _ => None,
        }
    }

    fn pg_type(self) -> Type {
        match self {
            ColType::Int => Type::INT8,
            ColType::Real => Type::FLOAT8,
            ColType::Text => Type::TEXT,
            ColType::Blob => Type::BYTEA,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ColType::Int => "an integer",
            ColType::Real => "a real",
            ColType::Text => "text",
            ColType::Blob => "a blob",
        }
    }
}

/// An SQLite value as the cell of a column of type `ty`. SQLite stores any value in any column;
/// the store writes each column's own type, and anything else is reported, never converted.
pub fn sqlite_cell(v: ValueRef<'_>, ty: ColType) -> Result<Cell, String> {
    match (v, ty) {
        (ValueRef::Null, _) => Ok(Cell::Null),
        (ValueRef::Integer(i), ColType::Int) => Ok(Cell::Int(i)),
        (ValueRef::Real(f), ColType::Real) => Ok(Cell::Real(f)),
        (ValueRef::Text(b), ColType::Text) => {
            let s = std::str::from_utf8(b).map_err(|_| "holds text that is not UTF-8".to_string())?;
            if s.contains('\0') {
                return Err("holds text with a NUL character, which PostgreSQL text cannot store".into());
            }
            Ok(Cell::Text(s.to_string()))
        }
        (ValueRef::Blob(b), ColType::Blob) => Ok(Cell::Blob(b.to_vec())),
        (v, ty) => {
            let held = match v {
                ValueRef::Integer(_) => "an integer",
                ValueRef::Real(_) => "a real",
                ValueRef::Text(_) => "text",
                _ => "a blob",
            };
            Err(format!("holds {held} where {} is expected", ty.name()))
        }
    }
}

fn pg_cell(row: &tokio_postgres::Row, i: usize, ty: ColType) -> Result<Cell, tokio_postgres::Error> {
    Ok(match ty {
        ColType::Int => row.try_get::<_, Option<i64>>(i)?.map_or(Cell::Null, Cell::Int),
        ColType::Real => row.try_get::<_, Option<f64>>(i)?.map_or(Cell::Null, Cell::Real),
        ColType::Text => row.try_get::<_, Option<String>>(i)?.map_or(Cell::Null, Cell::Text),
        ColType::Blob => row.try_get::<_, Option<Vec<u8>>>(i)?.map_or(Cell::Null, Cell::Blob),
    })
}

/// An SQLite column: its name and declared type.
#[derive(Debug, Clone)]
pub struct SqliteColumn {
    pub name: String,
    pub decl: String,
}

/// Every data table of an SQLite store (not `schema_version`) and its columns, by name.
pub fn sqlite_columns(conn: &Connection) -> rusqlite::Result<Vec<(String, Vec<SqliteColumn>)>> {
    let tables: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> 'schema_version' ORDER BY name",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut out = Vec::new();
    for table in tables {
        let columns = conn
            .prepare("SELECT name, type FROM pragma_table_info(?1) ORDER BY cid")?
            .query_map([&table], |r| Ok(SqliteColumn { name: r.get(0)?, decl: r.get(1)? }))?
            .collect::<rusqlite::Result<_>>()?;
        out.push((table, columns));
    }
    Ok(out)
}

/// The SQLite store being read: one connection inside one read transaction.
struct Source<'a> {
    conn: &'a Connection,
    path: &'a Path,
}

impl Source<'_> {
    fn fail(&self, e: rusqlite::Error) -> MigrateError {
        MigrateError::Sqlite(StoreError::classify(self.path, e))
    }
}

/// Copies the SQLite store at `sqlite` into the database of `target`, which must be empty or
/// hold an empty sessions-mcp schema. Returns each table as it was copied, in copy order.
pub async fn copy_store(sqlite: &Path, target: &PgTarget) -> Result<Vec<TableCopied>, MigrateError> {
    if !sqlite.is_file() {
        return Err(MigrateError::NoStore(sqlite.to_path_buf()));
    }
    let conn = crate::store::open_connection(sqlite, true)?;
    let source = Source { conn: &conn, path: sqlite };
    // The first read fixes the snapshot that every table is read from.
    conn.execute_batch("BEGIN DEFERRED").map_err(|e| source.fail(e))?;
    let found = crate::store::current_version(&conn).map_err(|e| source.fail(e))?;
    if found != SCHEMA_VERSION {
        return Err(MigrateError::SqliteVersion { path: sqlite.to_path_buf(), found, expected: SCHEMA_VERSION });
    }
    let tables = sqlite_columns(&conn).map_err(|e| source.fail(e))?;
    for (table, _) in &tables {
        if !schema::DATA_TABLES.contains(&table.as_str()) {
            return Err(MigrateError::Schema(format!("the SQLite store has a table {table} that PostgreSQL lacks")));
        }
    }
    let pool = target.connect().await?;
    let mut client = target.client(&pool).await?;
    let pg = |e: tokio_postgres::Error| MigrateError::Pg(target.classify(&e));
    let tx = client.transaction().await.map_err(pg)?;
    super::check_encoding(&tx, target).await?;
    if let SchemaState::Ours { .. } = super::ensure_schema(&tx, target).await? {
        refuse_data(&tx, target).await?;
    }
    // session_tree arrives as SQLite holds it: its triggers stand aside for this transaction.
    // Between two tables it waits on SQLite, which for a large store can exceed the idle
    // limit every other transaction has (SESSION_OPTIONS).
    tx.batch_execute("SET LOCAL sessions_mcp.copying = 'on'; SET LOCAL idle_in_transaction_session_timeout = 0")
        .await
        .map_err(pg)?;
    let mut copied = Vec::new();
    for table in schema::DATA_TABLES {
        let columns = tables
            .iter()
            .find(|(t, _)| t == table)
            .map(|(_, c)| c.as_slice())
            .ok_or_else(|| MigrateError::Schema(format!("the SQLite store has no table {table}")))?;
        let done = copy_table(&source, &tx, target, table, columns).await?;
        tracing::info!(table, rows = done.rows, "copied");
        copied.push(done);
    }
    tx.commit().await.map_err(pg)?;
    if let Err(e) = conn.execute_batch("COMMIT") {
        tracing::warn!(error = %e, "ending the SQLite read transaction failed (the copy is committed)");
    }
    Ok(copied)
}

/// An existing sessions-mcp schema is copied into only while every table is empty.
async fn refuse_data(tx: &Transaction<'_>, target: &PgTarget) -> Result<(), MigrateError> {
    for table in schema::DATA_TABLES {
        let sql = format!("SELECT count(*) FROM \"{table}\"");
        let rows: i64 = tx.query_one(sql.as_str(), &[]).await.map_err(|e| target.classify(&e))?.get(0);
        if rows > 0 {
            return Err(MigrateError::NotEmpty { target: target.to_string(), table: table.to_string(), rows });
        }
    }
    Ok(())
}

/// The PostgreSQL types of `columns` of `table`, which must have exactly these columns (and
/// those of [`schema::PG_ONLY_COLUMNS`], left to their defaults).
async fn column_types(
    tx: &Transaction<'_>,
    target: &PgTarget,
    table: &str,
    columns: &[SqliteColumn],
) -> Result<Vec<ColType>, MigrateError> {
    let rows = tx
        .query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1",
            &[&table],
        )
        .await
        .map_err(|e| target.classify(&e))?;
    let pg: Vec<(String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .filter(|(name, _): &(String, String)| !schema::PG_ONLY_COLUMNS.contains(&(table, name.as_str())))
        .collect();
    if pg.len() != columns.len() {
        return Err(MigrateError::Schema(format!(
            "table {table} has {} columns in SQLite and {} in PostgreSQL",
            columns.len(),
            pg.len()
        )));
    }
    columns
        .iter()
        .map(|c| {
            let (_, data_type) = pg
                .iter()
                .find(|(name, _)| *name == c.name)
                .ok_or_else(|| MigrateError::Schema(format!("PostgreSQL table {table} has no column {}", c.name)))?;
            ColType::from_pg(data_type)
                .ok_or_else(|| MigrateError::Schema(format!("PostgreSQL column {table}.{} is {data_type}", c.name)))
        })
        .collect()
}

/// Copies one table (binary `COPY`), reads it back, and compares both sides.
async fn copy_table(
    source: &Source<'_>,
    tx: &Transaction<'_>,
    target: &PgTarget,
    table: &str,
    columns: &[SqliteColumn],
) -> Result<TableCopied, MigrateError> {
    let pg = |e: tokio_postgres::Error| MigrateError::Pg(target.classify(&e));
    let types = column_types(tx, target, table, columns).await?;
    let list = columns.iter().map(|c| format!("\"{}\"", c.name)).collect::<Vec<_>>().join(", ");
    let copy = format!("COPY \"{table}\" ({list}) FROM STDIN (FORMAT binary)");
    let sink = tx.copy_in(copy.as_str()).await.map_err(pg)?;
    let pg_types: Vec<Type> = types.iter().map(|t| t.pg_type()).collect();
    let mut writer = std::pin::pin!(BinaryCopyInWriter::new(sink, &pg_types));
    let mut read = TableDigest::default();
    {
        let mut stmt = source.conn.prepare(&format!("SELECT {list} FROM \"{table}\"")).map_err(|e| source.fail(e))?;
        let mut rows = stmt.query([]).map_err(|e| source.fail(e))?;
        let mut n = 0u64;
        while let Some(row) = rows.next().map_err(|e| source.fail(e))? {
            n += 1;
            let mut cells = Vec::with_capacity(types.len());
            for (i, ty) in types.iter().enumerate() {
                let value = row.get_ref(i).map_err(|e| source.fail(e))?;
                let cell = sqlite_cell(value, *ty).map_err(|problem| MigrateError::Row {
                    table: table.to_string(),
                    row: n,
                    column: columns[i].name.clone(),
                    problem,
                })?;
                cells.push(cell);
            }
            read.add(&cells);
            let refs: Vec<&(dyn ToSql + Sync)> = cells.iter().map(|c| c as &(dyn ToSql + Sync)).collect();
            writer.as_mut().write(&refs).await.map_err(pg)?;
        }
    }
    let written = writer.as_mut().finish().await.map_err(pg)?;
    let stored = digest_stored(tx, table, &list, &types).await.map_err(pg)?;
    let ((sqlite_rows, sqlite_sha), (pg_rows, pg_sha)) = (read.finish(), stored.finish());
    if sqlite_rows != pg_rows || sqlite_sha != pg_sha || written != sqlite_rows {
        return Err(MigrateError::Mismatch { table: table.to_string(), sqlite_rows, sqlite_sha, pg_rows, pg_sha });
    }
    if schema::IDENTITY_TABLES.contains(&table) {
        set_identity_past_max(tx, table).await.map_err(pg)?;
    }
    Ok(TableCopied { table: table.to_string(), rows: sqlite_rows, sha256: sqlite_sha })
}

/// The digest of `table` as PostgreSQL now holds it (inside the copy's transaction).
async fn digest_stored(
    tx: &Transaction<'_>,
    table: &str,
    list: &str,
    types: &[ColType],
) -> Result<TableDigest, tokio_postgres::Error> {
    let sql = format!("SELECT {list} FROM \"{table}\"");
    let stream = tx.query_raw(sql.as_str(), std::iter::empty::<i64>()).await?;
    let mut stream = std::pin::pin!(stream);
    let mut digest = TableDigest::default();
    while let Some(row) = stream.try_next().await? {
        let cells = types.iter().enumerate().map(|(i, t)| pg_cell(&row, i, *t)).collect::<Result<Vec<_>, _>>()?;
        digest.add(&cells);
    }
    Ok(digest)
}

/// The next id the database hands out is past every copied one (or 1 for an empty table).
async fn set_identity_past_max(tx: &Transaction<'_>, table: &str) -> Result<(), tokio_postgres::Error> {
    let sql = format!(
        "SELECT setval(pg_get_serial_sequence($1, 'id'), coalesce((SELECT max(id) FROM \"{table}\"), 1),
                       (SELECT max(id) FROM \"{table}\") IS NOT NULL)"
    );
    tx.query_one(sql.as_str(), &[&table]).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(rows: &[Vec<Cell>]) -> (u64, String) {
        let mut d = TableDigest::default();
        rows.iter().for_each(|r| d.add(r));
        d.finish()
    }

    fn text(s: &str) -> Cell {
        Cell::Text(s.to_string())
    }

    #[test]
    fn the_digest_counts_rows_and_does_not_depend_on_their_order() {
        let a = vec![Cell::Int(1), text("hello")];
        let b = vec![Cell::Int(2), Cell::Null];
        let (n, one) = digest(&[a.clone(), b.clone()]);
        assert_eq!(n, 2);
        assert_eq!(digest(&[b.clone(), a.clone()]).1, one, "order does not matter");
        assert_ne!(digest(std::slice::from_ref(&a)).1, one, "a missing row does");
        assert_ne!(digest(&[a.clone(), b.clone(), b]).1, one, "so does a row twice");
        assert_eq!(digest(&[]).0, 0);
    }

    #[test]
    fn no_two_different_rows_encode_alike() {
        let rows = [
            vec![text("ab"), text("c")],
            vec![text("a"), text("bc")],
            vec![Cell::Null, text("abc")],
            vec![text(""), text("abc")],
            vec![Cell::Blob(b"ab".to_vec()), text("c")],
            vec![Cell::Int(1), text("c")],
            vec![Cell::Real(1.0), text("c")],
            vec![Cell::Real(-0.0), text("c")],
            vec![Cell::Real(0.0), text("c")],
            vec![text("abc")],
        ];
        let digests: std::collections::BTreeSet<String> =
            rows.iter().map(|r| digest(std::slice::from_ref(r)).1).collect();
        assert_eq!(digests.len(), rows.len(), "every row has its own digest");
    }

    #[test]
    fn the_encoding_of_a_row_is_pinned() {
        let mut out = Vec::new();
        for cell in [Cell::Null, Cell::Int(258), text("é"), Cell::Blob(vec![0xff]), Cell::Real(1.5)] {
            cell.encode(&mut out);
        }
        let mut expected = vec![b'N', b'I', 0, 0, 0, 0, 0, 0, 1, 2, b'T', 0, 0, 0, 0, 0, 0, 0, 2, 0xc3, 0xa9];
        expected.extend_from_slice(&[b'B', 0, 0, 0, 0, 0, 0, 0, 1, 0xff, b'R']);
        expected.extend_from_slice(&1.5f64.to_bits().to_be_bytes());
        assert_eq!(out, expected);
    }

    #[test]
    fn sqlite_values_are_taken_only_in_their_column_type() {
        assert_eq!(sqlite_cell(ValueRef::Integer(5), ColType::Int), Ok(Cell::Int(5)));
        assert_eq!(sqlite_cell(ValueRef::Null, ColType::Text), Ok(Cell::Null));
        assert_eq!(sqlite_cell(ValueRef::Text(b"hi"), ColType::Text), Ok(text("hi")));
        assert_eq!(sqlite_cell(ValueRef::Real(0.25), ColType::Real), Ok(Cell::Real(0.25)));
        assert_eq!(sqlite_cell(ValueRef::Blob(b"\x00"), ColType::Blob), Ok(Cell::Blob(vec![0])));
        assert_eq!(
            sqlite_cell(ValueRef::Text(b"7"), ColType::Int),
            Err("holds text where an integer is expected".to_string())
        );
        assert_eq!(
            sqlite_cell(ValueRef::Integer(7), ColType::Real),
            Err("holds an integer where a real is expected".into())
        );
        assert!(sqlite_cell(ValueRef::Text(b"a\0b"), ColType::Text).unwrap_err().contains("NUL"));
        assert!(sqlite_cell(ValueRef::Text(b"\xff"), ColType::Text).unwrap_err().contains("not UTF-8"));
    }

    #[test]
    fn refusals_and_failures_are_told_apart() {
        assert!(MigrateError::NoStore(PathBuf::from("/x")).is_refusal());
        assert!(MigrateError::NotEmpty { target: "t".into(), table: "sessions".into(), rows: 1 }.is_refusal());
        assert!(MigrateError::Pg(PgError::Unreachable { addr: "h:1".into(), detail: "refused".into() }).is_refusal());
        assert!(!MigrateError::Pg(PgError::Backend { target: "t".into(), detail: "x".into() }).is_refusal());
        let mismatch = MigrateError::Mismatch {
            table: "messages".into(),
            sqlite_rows: 2,
            sqlite_sha: "a".into(),
            pg_rows: 1,
            pg_sha: "b".into(),
        };
        assert!(!mismatch.is_refusal());
        assert!(mismatch.to_string().contains("rolled back, nothing was written"));
    }
}
