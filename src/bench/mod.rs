//! `sessions-mcp bench [--quick] [--only GROUP]`: the performance report (issue #9). It generates
//! its own stores, measures each group and prints one table — what was measured, p50 and p99 or a
//! rate, RSS where it matters, and the command that reproduces the row — then the machine line.
//! BENCHMARKS.md holds the results and their reading.
//!
//! One file per group: [`in_process`] (tool latency without a transport), [`stdio`] (cold start,
//! list and history over stdio), [`send`] (accepts, end-to-end runs, overhead over the agent),
//! [`load`] (waits, HTTP clients, memory), [`import`] (a reference store), [`soak`] (memory
//! before, during and after sustained mixed load), [`daemon`] (a send with wait and a subscription
//! update through a daemon owning the runtime, against the serve owning it), [`subagents`] (how
//! soon a `subagents` wait answers after the announce, both ways), [`fanout`] (N children spawned at
//! once: spawn rate, last announce, the server's memory, fds and threads, supervision per run),
//! [`nodes`] (PostgreSQL: tool latency next to SQLite, runs per second with 1, 2 and 3 nodes, what
//! their transactions hold as [`wire`]'s delay proxy reads it),
//! [`cli_child`] (one spawned CLI child, spawn to announce: wall time and the CLI's starts). `--quick` takes small
//! sizes so that a debug build finishes within a minute on two cores (CI); figures come from the
//! full mode in a release build.

mod cli_child;
mod client;
mod daemon;
mod fanout;
mod import;
pub mod in_process;
mod load;
mod nodes;
mod send;
mod soak;
mod stdio;
mod subagents;
mod wire;
pub mod worlds;

use std::process::ExitCode;
use std::time::Instant;

use worlds::Worlds;

/// A group of rows, selectable with `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Group {
    InProcess,
    Stdio,
    Send,
    Load,
    Import,
    Soak,
    Daemon,
    Subagents,
    Fanout,
    Nodes,
    CliChild,
}

impl Group {
    const ALL: [Group; 11] = [
        Group::InProcess,
        Group::Stdio,
        Group::Send,
        Group::Load,
        Group::Import,
        Group::Soak,
        Group::Daemon,
        Group::Subagents,
        Group::Fanout,
        Group::Nodes,
        Group::CliChild,
    ];

    fn name(self) -> &'static str {
        match self {
            Group::InProcess => "in-process",
            Group::Stdio => "stdio",
            Group::Send => "send",
            Group::Load => "load",
            Group::Import => "import",
            Group::Soak => "soak",
            Group::Daemon => "daemon",
            Group::Subagents => "subagents",
            Group::Fanout => "fanout",
            Group::Nodes => "nodes",
            Group::CliChild => "cli-child",
        }
    }
}

/// The sizes of one mode.
pub struct Sizes {
    /// Stores for sessions_list (the last is "the large store" of cold start and memory).
    pub list_sessions: &'static [u64],
    /// Transcript lengths for sessions_history.
    pub history_messages: &'static [u64],
    /// Calls per latency row (after a warm-up of a tenth as many).
    pub calls: usize,
    /// Process starts per cold-start row.
    pub starts: usize,
    /// Fire-and-forget sends, and outstanding waits.
    pub sends: usize,
    /// End-to-end runs, and direct agent starts.
    pub runs: usize,
    pub http_clients: usize,
    pub http_calls_each: usize,
    /// Messages of the generated reference store.
    pub import_messages: u64,
    /// Length of one soak round, and of the rest after it.
    pub soak_seconds: u64,
    pub rest_seconds: u64,
}

impl Sizes {
    fn of(quick: bool) -> Self {
        if quick {
            Sizes {
                list_sessions: &[100, 1_000],
                history_messages: &[1_000, 10_000],
                calls: 50,
                starts: 10,
                sends: 100,
                runs: 10,
                http_clients: 20,
                http_calls_each: 5,
                import_messages: 5_000,
                soak_seconds: 5,
                rest_seconds: 2,
            }
        } else {
            Sizes {
                list_sessions: &[100, 1_000, 10_000, 100_000],
                history_messages: &[1_000, 10_000, 100_000],
                calls: 1_000,
                starts: 50,
                sends: 1_000,
                runs: 100,
                http_clients: 200,
                http_calls_each: 20,
                import_messages: 100_000,
                soak_seconds: 60,
                rest_seconds: 15,
            }
        }
    }

    /// The largest list store.
    pub fn big(&self) -> u64 {
        self.list_sessions.last().copied().unwrap_or(0)
    }
}

/// One line of the table.
pub struct Row {
    group: Group,
    what: String,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    rate: String,
    rss: String,
}

impl Row {
    pub fn latency(group: Group, what: impl Into<String>, samples: &Samples) -> Row {
        let (p50, p99) = (samples.pct(0.5), samples.pct(0.99));
        Row { group, what: what.into(), p50_ms: Some(p50), p99_ms: Some(p99), rate: String::new(), rss: String::new() }
    }

    pub fn rate(group: Group, what: impl Into<String>, rate: String) -> Row {
        Row { group, what: what.into(), p50_ms: None, p99_ms: None, rate, rss: String::new() }
    }

    pub fn with_rate(mut self, rate: String) -> Row {
        self.rate = rate;
        self
    }

    pub fn with_rss(mut self, m: client::Memory) -> Row {
        self.rss = mib(m.rss_kb);
        self
    }
}

pub fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

/// Durations in milliseconds.
#[derive(Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn push_since(&mut self, t: Instant) {
        self.0.push(t.elapsed().as_secs_f64() * 1e3);
    }

    pub fn push_ms(&mut self, ms: f64) {
        self.0.push(ms);
    }

    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }

    /// The nearest-rank percentile `q` (0..=1).
    pub fn pct(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(((v.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or(f64::NAN)
    }
}

/// Times `n` calls of `f` after a warm-up of `n / 10` (caches, prepared statements, page cache).
pub async fn sample<F, Fut>(n: usize, mut f: F) -> anyhow::Result<Samples>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut samples = Samples::default();
    for i in 0..n + n / 10 {
        let t = Instant::now();
        f().await?;
        if i >= n / 10 {
            samples.push_since(t);
        }
    }
    Ok(samples)
}

/// Runs the store holds, whatever their status (every send to a driven session enqueues one).
fn runs_stored(store: &crate::store::Store) -> anyhow::Result<i64> {
    Ok(store.run_counts()?.iter().map(|(_, n)| n).sum())
}

/// What every group gets: the mode, its sizes, the cached stores, and the rows so far.
pub struct Bench {
    pub quick: bool,
    pub sizes: Sizes,
    pub worlds: Worlds,
    pub rows: Vec<Row>,
}

impl Bench {
    pub fn push(&mut self, row: Row) {
        tracing::info!(what = %row.what, "bench: measured");
        self.rows.push(row);
    }
}

pub async fn run(quick: bool, only: Option<Group>) -> ExitCode {
    let started = Instant::now();
    let mut bench = match Worlds::new() {
        Ok(worlds) => Bench { quick, sizes: Sizes::of(quick), worlds, rows: Vec::new() },
        Err(e) => return fail(anyhow::anyhow!("cannot create a temporary directory for the stores: {e}")),
    };
    for group in Group::ALL.into_iter().filter(|g| only.is_none_or(|o| o == *g)) {
        let result = match group {
            Group::InProcess => in_process::run(&mut bench).await,
            Group::Stdio => stdio::run(&mut bench).await,
            Group::Send => send::run(&mut bench).await,
            Group::Load => load::run(&mut bench).await,
            Group::Import => import::run(&mut bench).await,
            Group::Soak => soak::run(&mut bench).await,
            Group::Daemon => daemon::run(&mut bench).await,
            Group::Subagents => subagents::run(&mut bench).await,
            Group::Fanout => fanout::run(&mut bench).await,
            Group::Nodes => nodes::run(&mut bench).await,
            Group::CliChild => cli_child::run(&mut bench).await,
        };
        if let Err(e) = result {
            print_table(&bench);
            return fail(e.context(format!("group {}", group.name())));
        }
    }
    if only.is_none() {
        let peak = client::peak_hwm_kb();
        bench.push(Row::rate(Group::Load, "RSS: peak (VmHWM) of any server during the rows above", mib(peak)));
    }
    print_table(&bench);
    println!("bench took {:.0} s", started.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn fail(e: anyhow::Error) -> ExitCode {
    eprintln!("sessions-mcp bench: {e:#}");
    ExitCode::FAILURE
}

fn print_table(bench: &Bench) {
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_default();
    let quick = if bench.quick { " --quick" } else { "" };
    println!("| what | p50 ms | p99 ms | rate / value | RSS | reproduce |");
    println!("|---|---:|---:|---:|---:|---|");
    for r in &bench.rows {
        println!(
            "| {} | {} | {} | {} | {} | `sessions-mcp bench{quick} --only {}` |",
            r.what,
            ms(r.p50_ms),
            ms(r.p99_ms),
            r.rate,
            r.rss,
            r.group.name()
        );
    }
    println!("{}", machine());
}

/// Cores, memory and CPU model of this machine, from /proc.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model =
        cpuinfo.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).unwrap_or(" unknown");
    let build = if cfg!(debug_assertions) { "debug" } else { "release" };
    format!(
        "machine: {cores} cores, {:.1} GiB memory, CPU{model}; {build} build; load average {}",
        mem_kb as f64 / 1048576.0,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}
