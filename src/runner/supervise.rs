//! `sessions-mcp supervise`: the process every run starts through (docs/RUNNER-PROTOCOL.md,
//! Supervision). It makes itself the leader of a new process group, asks the kernel to signal it
//! when the server dies (Linux: the parent-death signal), starts the agent in its group with its
//! own stdin/stdout/stderr (the server talks to the agent through them directly) with core dumps
//! off, and ends the run: on SIGTERM, on the server's death, or at the deadline it signals the
//! group SIGINT → SIGTERM → SIGKILL a step apart; when the agent exits by itself it kills whatever
//! the agent left behind. On Linux it is also the run's child subreaper, so every descendant that
//! leaves the group (`setsid`, a daemon's double fork, with or without a cleared environment) is
//! re-parented to it and killed with the tree. Finally it kills every process of its uid that still
//! carries the run's `SESSIONS_MCP_RUN_ID` (what left the tree through some other service; best
//! effort).

use std::process::{Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use clap::Args;

#[derive(Args, Debug)]
pub struct SuperviseArgs {
    /// Kill the run at this many milliseconds after start (0 = no deadline).
    #[arg(long, default_value_t = 0)]
    deadline_ms: u64,
    /// Time between SIGINT, SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 1000)]
    step_ms: u64,
    /// Run the agent as this uid (and --gid): sandboxed runs when the server is root.
    #[arg(long)]
    uid: Option<u32>,
    #[arg(long)]
    gid: Option<u32>,
    /// The agent's umask (the user's; the server itself runs with 077).
    #[arg(long)]
    umask: Option<u32>,
    /// The agent's program and arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The signal that asked us to stop (0 = none yet).
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    let _ = STOP.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

fn install_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Dies with the server, and adopts every orphan of the run (Linux).
#[cfg(target_os = "linux")]
fn die_with_parent_and_adopt_orphans() {
    // SAFETY: plain prctl/getppid calls with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
        if libc::getppid() == 1 {
            STOP.store(libc::SIGTERM, Ordering::SeqCst);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent_and_adopt_orphans() {}

pub fn run(args: &SuperviseArgs) -> ExitCode {
    install_handlers();
    die_with_parent_and_adopt_orphans();
    // SAFETY: setsid has no memory-safety preconditions; failure only means we already lead one.
    unsafe {
        libc::setsid();
    }
    // No core dumps of agent processes (they may hold secrets from the environment).
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit reads a properly initialised struct.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
    }
    if let Some(mask) = args.umask {
        crate::privacy::restore_umask(mask);
    }
    let pgid = std::process::id() as i32;
    let run_id = std::env::var("SESSIONS_MCP_RUN_ID").unwrap_or_default();
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    {
        use std::os::unix::process::CommandExt;
        if let Some(gid) = args.gid {
            cmd.gid(gid);
        }
        if let Some(uid) = args.uid {
            cmd.uid(uid); // std also drops supplementary groups when it changes the uid
        }
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sessions-mcp supervise: cannot start {:?}: {e}", args.command[0]);
            return ExitCode::from(127);
        }
    };
    let started = Instant::now();
    let deadline = (args.deadline_ms > 0).then(|| started + Duration::from_millis(args.deadline_ms));
    // A thread blocks in wait(2), so an exit is seen at once (polling cost each run up to a poll
    // interval, see BENCHMARKS.md); this thread only watches for stop signals and the deadline.
    let (exited, exit) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exited.send(child.wait());
    });
    let status = loop {
        match exit.recv_timeout(Duration::from_millis(10)) {
            Ok(status) => break status.ok(),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break None,
        }
        if STOP.load(Ordering::SeqCst) != 0 || deadline.is_some_and(|d| Instant::now() >= d) {
            break None;
        }
    };
    let step = Duration::from_millis(args.step_ms);
    let status = match status {
        Some(s) => s,
        None => escalate(&exit, pgid, step),
    };
    kill_leftovers(pgid, &run_id);
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code.clamp(0, 255) as u8),
        (None, Some(sig)) => ExitCode::from((128 + sig).clamp(0, 255) as u8),
        _ => ExitCode::FAILURE,
    }
}

/// SIGINT → SIGTERM → SIGKILL to the group, `step` apart, until the agent is gone.
fn escalate(exit: &Receiver<std::io::Result<ExitStatus>>, pgid: i32, step: Duration) -> ExitStatus {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
        signal_group(pgid, sig);
        if let Ok(Ok(status)) = exit.recv_timeout(step) {
            return status;
        }
    }
    exit.recv()
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL))
}

/// Signals every member of the group except this process (we must live to escalate).
fn signal_group(pgid: i32, sig: i32) {
    if !std::path::Path::new("/proc/self").exists() {
        // No /proc (macOS): our own handlers absorb INT/TERM; SIGKILL would take us too.
        if sig != libc::SIGKILL {
            // SAFETY: killpg has no memory-safety preconditions.
            unsafe {
                libc::killpg(pgid, sig);
            }
        }
        return;
    }
    for pid in processes() {
        // SAFETY: getpgid/kill on a pid have no memory-safety preconditions.
        if pid != pgid && unsafe { libc::getpgid(pid) } == pgid {
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }
}

/// Kills what is left in our group and below us, then every process of ours that carries the
/// run id.
fn kill_leftovers(pgid: i32, run_id: &str) {
    signal_group(pgid, libc::SIGKILL);
    kill_descendants();
    kill_processes_of_run(run_id);
}

/// SIGKILLs every process this user may signal whose environment carries the run's
/// `SESSIONS_MCP_RUN_ID` (Linux; best effort). The server calls it too, for a run whose
/// supervisor died before it could.
pub fn kill_processes_of_run(run_id: &str) {
    if run_id.is_empty() {
        return;
    }
    let needle = format!("SESSIONS_MCP_RUN_ID={run_id}");
    let me = std::process::id() as i32;
    for pid in processes() {
        if pid == me {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if environ.split(|b| *b == 0).any(|var| var == needle.as_bytes()) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Kills our children until none is left. As the subreaper we inherit the children of each one
/// killed, so this reaches the whole tree a level per round; the agent itself is already reaped.
fn kill_descendants() {
    for _ in 0..MAX_TREE_ROUNDS {
        reap_exited();
        let children = children();
        if children.is_empty() {
            return;
        }
        for pid in children {
            // SAFETY: kill/waitpid on our own child have no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Deeper than any real process tree; a fork bomb is left to the env sweep and the rlimits.
const MAX_TREE_ROUNDS: usize = 64;

/// Reaps the orphans that already exited, so they are not counted as children.
fn reap_exited() {
    // SAFETY: waitpid with WNOHANG and no status pointer.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

/// Our live children, from each of our threads' `children` list (Linux; none elsewhere).
fn children() -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| list.split_whitespace().filter_map(|pid| pid.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

/// Every pid in /proc (Linux); elsewhere only the group signal applies.
fn processes() -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}
