//! The one SQL surface every store module writes against, whichever database is behind it:
//! [`Sql`] runs a statement with [`Arg`]s and hands back owned [`Row`]s of [`Cell`]s. SQLite
//! ([`rusqlite::Connection`]) and PostgreSQL (`postgres::PgSql`) implement it, so a store
//! operation is written once, in SQL both understand, and reads the same values back from
//! either.
//!
//! The statements are written in SQLite's spelling of parameters (`?1`, `?2`, …); PostgreSQL's
//! side rewrites them to `$1`, `$2` (outside string literals). What the two dialects spell
//! differently is asked of [`Sql::dialect`] where it is needed (a JSON field, a case-insensitive
//! match, the order runs were queued in), never hidden in a text rewrite.

use std::borrow::Cow;

use super::{Result, StoreError};

/// One value as both databases store it.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// One value given to a statement, borrowed where it can be.
#[derive(Debug, Clone)]
pub enum ArgValue<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(Cow<'a, str>),
    Blob(&'a [u8]),
}

/// What can be bound to a statement's parameter.
pub trait Arg {
    fn arg(&self) -> ArgValue<'_>;
}

/// The arguments of a statement: `args![a, b]` as `rusqlite::params!` is used.
macro_rules! args {
    () => { &[] as &[&dyn $crate::store::sql::Arg] };
    ($($a:expr),+ $(,)?) => { &[$(&$a as &dyn $crate::store::sql::Arg),+] as &[&dyn $crate::store::sql::Arg] };
}
pub(crate) use args;

macro_rules! int_arg {
    ($($t:ty),+) => {$(
        impl Arg for $t {
            fn arg(&self) -> ArgValue<'_> {
                ArgValue::Int(*self as i64)
            }
        }
    )+};
}
int_arg!(i64, i32, u32, u16, u8, usize, u64);

impl Arg for bool {
    fn arg(&self) -> ArgValue<'_> {
        ArgValue::Int(i64::from(*self))
    }
}

impl Arg for f64 {
    fn arg(&self) -> ArgValue<'_> {
        ArgValue::Real(*self)
    }
}

impl Arg for str {
    fn arg(&self) -> ArgValue<'_> {
        ArgValue::Text(Cow::Borrowed(self))
    }
}

impl Arg for String {
    fn arg(&self) -> ArgValue<'_> {
        ArgValue::Text(Cow::Borrowed(self))
    }
}

impl Arg for [u8] {
    fn arg(&self) -> ArgValue<'_> {
        ArgValue::Blob(self)
    }
}

impl Arg for Vec<u8> {
    fn arg(&self) -> ArgValue<'_> {
        ArgValue::Blob(self)
    }
}

/// JSON is stored as its text.
impl Arg for serde_json::Value {
    fn arg(&self) -> ArgValue<'_> {
        ArgValue::Text(Cow::Owned(self.to_string()))
    }
}

impl<T: Arg + ?Sized> Arg for &T {
    fn arg(&self) -> ArgValue<'_> {
        (**self).arg()
    }
}

impl<T: Arg> Arg for Option<T> {
    fn arg(&self) -> ArgValue<'_> {
        self.as_ref().map_or(ArgValue::Null, Arg::arg)
    }
}

impl Arg for ArgValue<'_> {
    fn arg(&self) -> ArgValue<'_> {
        self.clone()
    }
}

/// One row of a result, its cells in column order.
#[derive(Debug, Clone)]
pub struct Row {
    cells: Vec<Cell>,
}

impl Row {
    pub fn new(cells: Vec<Cell>) -> Row {
        Row { cells }
    }

    /// Column `i` as a `T`; a value of another type is the store's corruption, named.
    pub fn get<T: FromCell>(&self, i: usize) -> Result<T> {
        let cell = self.cells.get(i).ok_or_else(|| StoreError::Corrupt(format!("no column {i} in a row")))?;
        T::from_cell(cell).ok_or_else(|| StoreError::Corrupt(format!("column {i}: {} is not {}", cell.kind(), T::WHAT)))
    }

    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }
}

impl Cell {
    fn kind(&self) -> &'static str {
        match self {
            Cell::Null => "NULL",
            Cell::Int(_) => "an integer",
            Cell::Real(_) => "a real",
            Cell::Text(_) => "text",
            Cell::Blob(_) => "a blob",
        }
    }
}

/// A Rust value read from a cell.
pub trait FromCell: Sized {
    const WHAT: &'static str;
    fn from_cell(cell: &Cell) -> Option<Self>;
}

macro_rules! int_from_cell {
    ($($t:ty),+) => {$(
        impl FromCell for $t {
            const WHAT: &'static str = "an integer";
            fn from_cell(cell: &Cell) -> Option<Self> {
                match cell {
                    Cell::Int(v) => <$t>::try_from(*v).ok(),
                    _ => None,
                }
            }
        }
    )+};
}
int_from_cell!(i64, i32, u32, u64, usize);

impl FromCell for bool {
    const WHAT: &'static str = "a boolean";
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Int(v) => Some(*v != 0),
            _ => None,
        }
    }
}

/// An integer column read as real is its value, as SQLite's own conversion does.
impl FromCell for f64 {
    const WHAT: &'static str = "a real";
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Real(v) => Some(*v),
            Cell::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
}

impl FromCell for String {
    const WHAT: &'static str = "text";
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Text(v) => Some(v.clone()),
            _ => None,
        }
    }
}

impl FromCell for Vec<u8> {
    const WHAT: &'static str = "a blob";
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Blob(v) => Some(v.clone()),
            Cell::Text(v) => Some(v.as_bytes().to_vec()),
            _ => None,
        }
    }
}

impl FromCell for Cell {
    const WHAT: &'static str = "a value";
    fn from_cell(cell: &Cell) -> Option<Self> {
        Some(cell.clone())
    }
}

impl<T: FromCell> FromCell for Option<T> {
    const WHAT: &'static str = T::WHAT;
    fn from_cell(cell: &Cell) -> Option<Self> {
        match cell {
            Cell::Null => Some(None),
            c => T::from_cell(c).map(Some),
        }
    }
}

/// Which database a statement goes to, for what the two spell differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The text at `path` (fields joined by `.`) of the JSON text in column `column`, NULL when
    /// absent.
    pub fn json_text(self, column: &str, path: &str) -> String {
        match self {
            Dialect::Sqlite => format!("json_extract({column}, '$.{path}')"),
            Dialect::Postgres => format!("(({column})::jsonb #>> '{{{}}}')", path.replace('.', ",")),
        }
    }

    /// The integer at `path` of the JSON text in column `column`, NULL when absent.
    pub fn json_int(self, column: &str, path: &str) -> String {
        match self {
            Dialect::Sqlite => self.json_text(column, path),
            Dialect::Postgres => format!("{}::bigint", self.json_text(column, path)),
        }
    }

    /// `column` equal to `param` ignoring ASCII case, as each schema's index on it has it.
    pub fn eq_nocase(self, column: &str, param: &str) -> String {
        match self {
            Dialect::Sqlite => format!("{column} = {param} COLLATE NOCASE"),
            Dialect::Postgres => format!("lower({column}) = lower({param})"),
        }
    }

    /// `LIKE` that ignores ASCII case, as SQLite's does by default.
    pub fn like_nocase(self) -> &'static str {
        match self {
            Dialect::Sqlite => "LIKE",
            Dialect::Postgres => "ILIKE",
        }
    }

    /// The database's clock in milliseconds since the epoch, read when the statement runs.
    /// Leases are set and compared on it: the nodes sharing a PostgreSQL database may have
    /// clocks apart (doctor reports the skew), and a lease set on one clock and compared on
    /// another would expire early or never. `clock_timestamp()`, not `now()`: `now()` is when
    /// the transaction began, before it waited for the write lock.
    pub fn clock_ms(self) -> &'static str {
        match self {
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            Dialect::Postgres => "(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
        }
    }

    /// What ends a `SELECT` that locks the rows it reads until the transaction ends
    /// (PostgreSQL's `FOR UPDATE`, with `of` the tables whose rows it locks, or all when empty);
    /// nothing on SQLite, whose one writer holds the whole database.
    pub fn for_update(self, of: &str) -> String {
        match (self, of) {
            (Dialect::Sqlite, _) => String::new(),
            (Dialect::Postgres, "") => " FOR UPDATE".to_string(),
            (Dialect::Postgres, of) => format!(" FOR UPDATE OF {of}"),
        }
    }

    /// The function that picks the larger of two values (SQLite's two-argument `max`).
    pub fn greatest(self) -> &'static str {
        match self {
            Dialect::Sqlite => "max",
            Dialect::Postgres => "GREATEST",
        }
    }

    /// `column + amount` that stops at the largest 64-bit integer instead of overflowing
    /// (SQLite would turn the column into a REAL, PostgreSQL fail the statement). `amount` must
    /// not be negative.
    pub fn saturating_add(self, column: &str, amount: &str) -> String {
        format!("CASE WHEN {column} > {MAX} - ({amount}) THEN {MAX} ELSE {column} + ({amount}) END", MAX = i64::MAX)
    }

    /// The sum of an integer expression over a group, 0 for none, stopping at the largest 64-bit
    /// integer (SQLite's `sum` fails on overflow; `total` adds in floating point, exact below 2^53).
    pub fn sum_int(self, expr: &str) -> String {
        match self {
            Dialect::Sqlite => format!("CAST(min(total({expr}), 9.2e18) AS INTEGER)"),
            Dialect::Postgres => format!("CAST(LEAST(coalesce(sum({expr}), 0), {}) AS BIGINT)", i64::MAX),
        }
    }

    /// The column that orders a table's rows by insertion (SQLite's rowid; PostgreSQL keeps
    /// `runs.enqueued` for it).
    pub fn runs_order(self) -> &'static str {
        match self {
            Dialect::Sqlite => "rowid",
            Dialect::Postgres => "enqueued",
        }
    }
}

/// Owned values are arguments too (a [`Statement`] keeps its own).
impl Arg for Cell {
    fn arg(&self) -> ArgValue<'_> {
        match self {
            Cell::Null => ArgValue::Null,
            Cell::Int(v) => ArgValue::Int(*v),
            Cell::Real(v) => ArgValue::Real(*v),
            Cell::Text(v) => ArgValue::Text(Cow::Borrowed(v)),
            Cell::Blob(v) => ArgValue::Blob(v),
        }
    }
}

impl From<ArgValue<'_>> for Cell {
    fn from(v: ArgValue<'_>) -> Cell {
        match v {
            ArgValue::Null => Cell::Null,
            ArgValue::Int(v) => Cell::Int(v),
            ArgValue::Real(v) => Cell::Real(v),
            ArgValue::Text(v) => Cell::Text(v.into_owned()),
            ArgValue::Blob(v) => Cell::Blob(v.to_vec()),
        }
    }
}

/// One statement of a [`Sql::pipeline`] with its arguments, owned: a pipeline is built whole
/// before any of it runs.
#[derive(Debug, Clone)]
pub struct Statement {
    sql: String,
    args: Vec<Cell>,
}

impl Statement {
    pub fn new(sql: impl Into<String>, args: &[&dyn Arg]) -> Statement {
        Statement { sql: sql.into(), args: args.iter().map(|a| Cell::from(a.arg())).collect() }
    }

    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The arguments, as [`Sql::execute`] and [`Sql::rows`] take them.
    pub fn args(&self) -> Vec<&dyn Arg> {
        self.args.iter().map(|a| a as &dyn Arg).collect()
    }

    /// The arguments' values, borrowed.
    pub fn values(&self) -> Vec<ArgValue<'_>> {
        self.args.iter().map(Arg::arg).collect()
    }
}

/// What one statement of a [`Sql::pipeline`] answered.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    /// The rows it returned (none for a write without `RETURNING`).
    pub rows: Vec<Row>,
    /// How many rows it inserted, updated or deleted (0 for a plain `SELECT`, locking or not).
    pub changed: usize,
}

/// How a [`Sql::pipeline`] leaves the transaction it runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPipeline {
    /// Open: more statements may follow.
    Open,
    /// Ended: committed if every statement succeeded, rolled back otherwise. On PostgreSQL the
    /// `COMMIT` goes out with the statements (the row locks are let go one round trip sooner);
    /// on SQLite the transaction commits when the write returns, as any other. Nothing may run
    /// in the transaction after it, and the write must return what the pipeline answered.
    Commit,
}

/// Whether `sql` is a plain `SELECT`, which changes no row even when it locks some (the rest
/// is taken for a change, a `WITH` included, to be safe).
pub fn is_plain_select(sql: &str) -> bool {
    sql.trim_start().get(..6).is_some_and(|w| w.eq_ignore_ascii_case("SELECT"))
}

/// A connection (or a transaction on one) that runs statements.
pub trait Sql {
    /// Runs a statement that returns no rows; the number of rows it changed.
    fn execute(&self, sql: &str, args: &[&dyn Arg]) -> Result<usize>;
    /// Runs a query; every row it returned.
    fn rows(&self, sql: &str, args: &[&dyn Arg]) -> Result<Vec<Row>>;
    /// Runs `statements` in order, as many round trips as one on PostgreSQL: all are sent
    /// before any answer is awaited (none's text or arguments may depend on another's answer;
    /// each still runs after the one before it, in its own `READ COMMITTED` snapshot, so a
    /// `SELECT` after a lock reads what the lock holder committed). Each one's answer, in order;
    /// the first failure is the pipeline's (the statements after it did not run), and it leaves
    /// the transaction failed, as a failed statement does. SQLite runs them one by one.
    fn pipeline(&self, statements: &[Statement], after: AfterPipeline) -> Result<Vec<Answer>>;
    fn dialect(&self) -> Dialect;
}

impl dyn Sql + '_ {
    /// The first row, mapped; [`StoreError::NoRow`] when there is none.
    pub fn query_row<T>(&self, sql: &str, args: &[&dyn Arg], f: impl FnOnce(&Row) -> Result<T>) -> Result<T> {
        match self.rows(sql, args)?.first() {
            Some(row) => f(row),
            None => Err(StoreError::NoRow),
        }
    }

    /// The first row mapped, if there is one.
    pub fn query_opt<T>(&self, sql: &str, args: &[&dyn Arg], f: impl FnOnce(&Row) -> Result<T>) -> Result<Option<T>> {
        self.rows(sql, args)?.first().map(f).transpose()
    }

    /// Every row, mapped.
    pub fn query_map<T>(&self, sql: &str, args: &[&dyn Arg], f: impl FnMut(&Row) -> Result<T>) -> Result<Vec<T>> {
        self.rows(sql, args)?.iter().map(f).collect()
    }

    /// Column 0 of the first row.
    pub fn one<T: FromCell>(&self, sql: &str, args: &[&dyn Arg]) -> Result<T> {
        self.query_row(sql, args, |r| r.get(0))
    }
}

/// Turns "no such row" into `None`, as `rusqlite::OptionalExtension` does.
pub trait Optional<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> Optional<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(StoreError::NoRow) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

mod sqlite {
    use rusqlite::types::{ToSqlOutput, ValueRef};

    use super::*;

    impl rusqlite::ToSql for ArgValue<'_> {
        fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
            Ok(ToSqlOutput::Borrowed(match self {
                ArgValue::Null => ValueRef::Null,
                ArgValue::Int(v) => ValueRef::Integer(*v),
                ArgValue::Real(v) => ValueRef::Real(*v),
                ArgValue::Text(v) => ValueRef::Text(v.as_bytes()),
                ArgValue::Blob(v) => ValueRef::Blob(v),
            }))
        }
    }

    fn cell(v: ValueRef<'_>) -> Cell {
        match v {
            ValueRef::Null => Cell::Null,
            ValueRef::Integer(i) => Cell::Int(i),
            ValueRef::Real(f) => Cell::Real(f),
            ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Cell::Blob(b.to_vec()),
        }
    }

    fn bind<'a>(args: &'a [&'a dyn Arg]) -> Vec<ArgValue<'a>> {
        args.iter().map(|a| a.arg()).collect()
    }

    /// Statements are prepared once per connection (rusqlite's statement cache).
    impl Sql for rusqlite::Connection {
        fn execute(&self, sql: &str, args: &[&dyn Arg]) -> Result<usize> {
            let values = bind(args);
            Ok(self.prepare_cached(sql)?.execute(rusqlite::params_from_iter(values.iter()))?)
        }

        fn rows(&self, sql: &str, args: &[&dyn Arg]) -> Result<Vec<Row>> {
            let values = bind(args);
            let mut stmt = self.prepare_cached(sql)?;
            let width = stmt.column_count();
            let mut rows = stmt.query(rusqlite::params_from_iter(values.iter()))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                let cells = (0..width).map(|i| row.get_ref(i).map(cell)).collect::<rusqlite::Result<_>>()?;
                out.push(Row::new(cells));
            }
            Ok(out)
        }

        /// SQLite is in process: nothing to save by sending them at once, and its commit is the
        /// write's, when it returns.
        fn pipeline(&self, statements: &[Statement], _after: AfterPipeline) -> Result<Vec<Answer>> {
            statements.iter().map(|s| answer(self, s)).collect()
        }

        fn dialect(&self) -> Dialect {
            Dialect::Sqlite
        }
    }

    /// Runs one statement of a pipeline: its rows if it returns any, and the rows it changed.
    fn answer(conn: &rusqlite::Connection, s: &Statement) -> Result<Answer> {
        let returns_rows = conn.prepare_cached(s.sql())?.column_count() > 0;
        if !returns_rows {
            return Ok(Answer { rows: vec![], changed: Sql::execute(conn, s.sql(), &s.args())? });
        }
        let rows = Sql::rows(conn, s.sql(), &s.args())?;
        // A `RETURNING` write returns one row per row it changed.
        let changed = if is_plain_select(s.sql()) { 0 } else { rows.len() };
        Ok(Answer { rows, changed })
    }

    impl Sql for rusqlite::Transaction<'_> {
        fn execute(&self, sql: &str, args: &[&dyn Arg]) -> Result<usize> {
            Sql::execute(&**self, sql, args)
        }

        fn rows(&self, sql: &str, args: &[&dyn Arg]) -> Result<Vec<Row>> {
            Sql::rows(&**self, sql, args)
        }

        fn pipeline(&self, statements: &[Statement], after: AfterPipeline) -> Result<Vec<Answer>> {
            Sql::pipeline(&**self, statements, after)
        }

        fn dialect(&self) -> Dialect {
            Dialect::Sqlite
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_reads_back_what_it_was_given_and_names_a_wrong_type() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let db: &dyn Sql = &conn;
        db.execute("CREATE TABLE t (i INTEGER, r REAL, s TEXT, b BLOB)", args![]).unwrap();
        let none: Option<i64> = None;
        db.execute("INSERT INTO t VALUES (?1, ?2, ?3, ?4)", args![7_i64, 1.5, "x", vec![1_u8, 2]]).unwrap();
        db.execute("INSERT INTO t VALUES (?1, NULL, NULL, NULL)", args![none]).unwrap();
        let rows = db.query_map("SELECT i, r, s, b FROM t ORDER BY rowid", args![], |r| {
            Ok((r.get::<Option<i64>>(0)?, r.get::<Option<f64>>(1)?, r.get::<Option<String>>(2)?))
        });
        assert_eq!(rows.unwrap(), [(Some(7), Some(1.5), Some("x".into())), (None, None, None)]);
        let wrong = db.query_row("SELECT s FROM t WHERE i = ?1", args![7], |r| r.get::<i64>(0));
        assert!(
            matches!(wrong, Err(StoreError::Corrupt(ref m)) if m == "column 0: text is not an integer"),
            "{wrong:?}"
        );
        assert!(matches!(db.one::<i64>("SELECT i FROM t WHERE i = 99", args![]), Err(StoreError::NoRow)));
        assert_eq!(db.one::<i64>("SELECT i FROM t WHERE i = 99", args![]).optional().unwrap(), None);
    }

    #[test]
    fn a_pipeline_on_sqlite_runs_its_statements_in_order_and_answers_each() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let db: &dyn Sql = &conn;
        db.execute("CREATE TABLE t (i INTEGER, s TEXT)", args![]).unwrap();
        let answers = db
            .pipeline(
                &[
                    Statement::new("INSERT INTO t VALUES (?1, ?2), (?1 + 1, ?2)", args![1, "a"]),
                    Statement::new("UPDATE t SET s = s || ?1 WHERE i = 2 RETURNING s", args!["b"]),
                    Statement::new("SELECT i FROM t ORDER BY i", args![]),
                ],
                AfterPipeline::Commit,
            )
            .unwrap();
        assert_eq!(answers.iter().map(|a| a.changed).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(answers[1].rows[0].get::<String>(0).unwrap(), "ab");
        assert_eq!(answers[2].rows.iter().map(|r| r.get::<i64>(0).unwrap()).collect::<Vec<_>>(), [1, 2]);
        let failed = db.pipeline(
            &[Statement::new("UPDATE t SET i = 0", args![]), Statement::new("SELECT nope FROM t", args![])],
            AfterPipeline::Open,
        );
        assert!(failed.unwrap_err().to_string().contains("nope"));
    }
}
