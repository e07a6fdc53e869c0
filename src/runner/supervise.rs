//! `sessions-mcp-supervise`: the process every run starts through (docs/RUNNER-PROTOCOL.md,
//! Supervision). It makes itself the leader of a new process group, asks the kernel to signal it
//! when the server dies (Linux: the parent-death signal), starts the agent in its group with its
//! own stdin/stdout/stderr (the server talks to the agent through them directly) with core dumps
//! off, and ends the run: on SIGTERM, on the server's death, or at the deadline it signals the
//! group SIGINT → SIGTERM → SIGKILL a step apart; when the agent exits by itself it kills whatever
//! the agent left behind. On Linux it is also the run's child subreaper, so every descendant that
//! leaves the group (`setsid`, a daemon's double fork, with or without a cleared environment) is
//! re-parented to it and killed with the tree (frozen first, then killed deepest first). Should
//! the agent kill its supervisor (and any supervisor it nested inside the run), the server is the
//! next subreaper up and ends what it adopts the same way (`runner::orphans`). Last, every process of its uid that still carries
//! the run's `SESSIONS_MCP_RUN_ID` (what left the tree through some other service; best effort) is
//! killed: by the server, which batches the sweeps of many runs into one `/proc` scan
//! (`--server-sweeps`, what the server passes), or by the supervisor itself when it runs without
//! that flag or the server is gone.
//!
//! This file is compiled twice: as `runner::supervise` in the library (the server's batched sweep
//! calls [`kill_processes_of_runs`] and [`freeze_and_kill_trees`]) and, through `#[path]`, as the whole
//! of the small `sessions-mcp-supervise` binary (src/bin/sessions-mcp-supervise.rs), which links
//! none of the server. So it uses std, libc and clap only: no `crate::` paths, no tokio.
//!
//! One thread, no polling: the agent's exit (SIGCHLD), the stop signals and the deadline all wake
//! one `poll(2)` on a self-pipe that the signal handler writes to.

use std::process::{Child, Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The supervisor's file name; the server finds it beside its own binary.
pub const BINARY: &str = "sessions-mcp-supervise";

/// The supervisor's fixed, machine-only argv (the server writes it; nobody types it).
#[derive(clap::Parser, Debug, PartialEq, Eq)]
#[command(name = "sessions-mcp-supervise", version, about = "Supervises one sessions-mcp run (internal).")]
pub struct Args {
    /// Kill the run at this many milliseconds after start (0 = no deadline).
    #[arg(long, default_value_t = 0)]
    pub deadline_ms: u64,
    /// Time between SIGINT, SIGTERM and SIGKILL.
    #[arg(long, default_value_t = 1000)]
    pub step_ms: u64,
    /// Run the agent as this uid (and --gid): sandboxed runs when the server is root.
    #[arg(long)]
    pub uid: Option<u32>,
    #[arg(long)]
    pub gid: Option<u32>,
    /// The agent's umask (the user's; the server itself runs with 077).
    #[arg(long)]
    pub umask: Option<u32>,
    /// Leave the run-id sweep to the server that started us (it scans `/proc` once for many runs);
    /// we still sweep when it is gone by the time the agent has exited.
    #[arg(long)]
    pub server_sweeps: bool,
    /// The agent's program and arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The signal that asked us to stop (0 = none yet).
static STOP: AtomicI32 = AtomicI32::new(0);
/// Whether the deadline stands still: the server holds it while the run waits for an answer to
/// one of its input requests (a person reading is not the run's time), and releases it after.
static HELD: AtomicBool = AtomicBool::new(false);

/// The server's signal: the run waits for an answer; the deadline stands still.
pub const HOLD_SIGNAL: libc::c_int = libc::SIGUSR1;
/// The server's signal: the answers came; the deadline moves later by the time held.
pub const RELEASE_SIGNAL: libc::c_int = libc::SIGUSR2;
/// The write end of the self-pipe (-1 until it exists).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// Whether we are the run's child subreaper (Linux): then every process of our session, so every
/// member of our group, is one of our descendants.
static ADOPTS_ORPHANS: AtomicBool = AtomicBool::new(false);

#[cfg(target_os = "linux")]
fn errno_location() -> *mut libc::c_int {
    // SAFETY: returns this thread's errno slot.
    unsafe { libc::__errno_location() }
}

#[cfg(not(target_os = "linux"))]
fn errno_location() -> *mut libc::c_int {
    // SAFETY: returns this thread's errno slot.
    unsafe { libc::__error() }
}

extern "C" fn on_signal(sig: libc::c_int) {
    match sig {
        libc::SIGCHLD => {}
        HOLD_SIGNAL => HELD.store(true, Ordering::SeqCst),
        RELEASE_SIGNAL => HELD.store(false, Ordering::SeqCst),
        _ => {
            let _ = STOP.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) and errno access are async-signal-safe; errno is put back for the code
        // this handler interrupted. A full pipe already holds a wake-up, so a failed write is fine.
        unsafe {
            let errno = *errno_location();
            libc::write(fd, b"x".as_ptr().cast(), 1);
            *errno_location() = errno;
        }
    }
}

/// The self-pipe: a signal handler's byte wakes [`Wake::sleep`]; both ends non-blocking and closed
/// on exec, so the agent inherits neither.
struct Wake {
    read: libc::c_int,
}

impl Wake {
    fn new() -> std::io::Result<Self> {
        let mut fds = [-1; 2];
        // SAFETY: pipe writes two fds into the array; fcntl on fds we own. We are single-threaded
        // here, so no fork can inherit them before FD_CLOEXEC is set.
        unsafe {
            if libc::pipe(fds.as_mut_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for fd in fds {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK);
            }
        }
        WAKE_FD.store(fds[1], Ordering::SeqCst);
        Ok(Wake { read: fds[0] })
    }

    /// Sleeps until a signal came (since the last call) or `timeout` passed (None: no limit).
    fn sleep(&self, timeout: Option<Duration>) {
        let ms = timeout.map_or(-1, |t| t.as_millis().saturating_add(1).min(i32::MAX as u128) as libc::c_int);
        let mut fd = libc::pollfd { fd: self.read, events: libc::POLLIN, revents: 0 };
        let mut sink = [0u8; 64];
        // SAFETY: poll on one initialised pollfd; read into a local buffer from our own fd.
        unsafe {
            libc::poll(&mut fd, 1, ms);
            while libc::read(self.read, sink.as_mut_ptr().cast(), sink.len()) > 0 {}
        }
    }
}

fn install_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD, HOLD_SIGNAL, RELEASE_SIGNAL] {
        // SAFETY: a zeroed sigaction with our handler; the handler only touches atomics and
        // write(2), which are async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART | libc::SA_NOCLDSTOP;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Dies with the server, and adopts every orphan of the run (Linux).
#[cfg(target_os = "linux")]
fn die_with_parent_and_adopt_orphans() {
    // SAFETY: plain prctl/getppid calls with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        ADOPTS_ORPHANS.store(libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) == 0, Ordering::SeqCst);
        if libc::getppid() == 1 {
            STOP.store(libc::SIGTERM, Ordering::SeqCst);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent_and_adopt_orphans() {}

pub fn run(args: &Args) -> ExitCode {
    let wake = match Wake::new() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{BINARY}: cannot make its pipe: {e}");
            return ExitCode::from(127);
        }
    };
    install_handlers();
    die_with_parent_and_adopt_orphans();
    // SAFETY: setsid has no memory-safety preconditions; failure only means we already lead one.
    unsafe {
        libc::setsid();
    }
    // No core dumps of agent processes (they may hold secrets from the environment).
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: setrlimit reads a properly initialised struct; umask has no preconditions.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        if let Some(mask) = args.umask {
            libc::umask((mask & 0o777) as libc::mode_t);
        }
    }
    let pgid = std::process::id() as i32;
    // SAFETY: getppid has no preconditions.
    let server = unsafe { libc::getppid() };
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
            eprintln!("{BINARY}: cannot start {:?}: {e}", args.command[0]);
            return ExitCode::from(127);
        }
    };
    let deadline = (args.deadline_ms > 0).then(|| Instant::now() + Duration::from_millis(args.deadline_ms));
    let status = match wait_agent(&mut child, &wake, deadline, true) {
        Some(s) => s,
        None => escalate(&mut child, &wake, pgid, Duration::from_millis(args.step_ms)),
    };
    kill_leftovers(pgid);
    // SAFETY: getppid has no preconditions.
    if !args.server_sweeps || unsafe { libc::getppid() } != server {
        kill_processes_of_runs(&[run_id.as_str()]);
    }
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code.clamp(0, 255) as u8),
        (None, Some(sig)) => ExitCode::from((128 + sig).clamp(0, 255) as u8),
        _ => ExitCode::FAILURE,
    }
}

/// Waits for the agent's exit (its status), until `until` (None when it passed) or, when
/// `stop_ends`, until a stop signal came (None). When `stop_ends` (the run's own wait, not the
/// escalation's), `until` stands still while the server holds it.
fn wait_agent(child: &mut Child, wake: &Wake, until: Option<Instant>, stop_ends: bool) -> Option<ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let (mut until, mut held_since) = (until, None);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return Some(ExitStatus::from_raw(1 << 8)), // not ours to wait for: exit 1
        }
        if stop_ends && STOP.load(Ordering::SeqCst) != 0 {
            return None;
        }
        if stop_ends {
            (until, held_since) = follow_hold(until, held_since);
        }
        let left = match until.filter(|_| held_since.is_none()) {
            Some(at) => match at.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return None,
            },
            None => None,
        };
        wake.sleep(left);
    }
}

/// The deadline and since when it is held, after the server's last hold or release: a release
/// moves the deadline later by the time held.
fn follow_hold(until: Option<Instant>, held_since: Option<Instant>) -> (Option<Instant>, Option<Instant>) {
    match (HELD.load(Ordering::SeqCst), held_since) {
        (true, None) => (until, Some(Instant::now())),
        (false, Some(since)) => (until.map(|at| at + since.elapsed()), None),
        (_, held) => (until, held),
    }
}

/// SIGINT → SIGTERM → SIGKILL to the group and the agent, `step` apart, until the agent is gone.
fn escalate(child: &mut Child, wake: &Wake, pgid: i32, step: Duration) -> ExitStatus {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
        signal_group(pgid, sig);
        // The agent may have left the group (setpgid); it is still our child.
        // SAFETY: kill has no memory-safety preconditions; the agent is unreaped, so its pid is ours.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
        if let Some(status) = wait_agent(child, wake, Some(Instant::now() + step), false) {
            return status;
        }
    }
    child.wait().unwrap_or_else(|_| std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL))
}

/// Signals every member of the group except this process (we must live to escalate). SIGINT and
/// SIGTERM go to the whole group at once (our own handlers take them: we are stopping already);
/// SIGKILL goes to each other member found in /proc (Linux; elsewhere the subreaper-less platform
/// relies on the INT/TERM steps).
fn signal_group(pgid: i32, sig: i32) {
    if sig != libc::SIGKILL {
        // SAFETY: killpg has no memory-safety preconditions.
        unsafe {
            libc::killpg(pgid, sig);
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

/// Kills what is left in our group and below us. As the subreaper (Linux) every group member is a
/// descendant, so the tree kill reaches them all and the `/proc` scan for the group is skipped:
/// it reads every process of the machine, and with a thousand runs ending together a thousand
/// such scans were most of the machine's CPU (BENCHMARKS.md, fan-out).
fn kill_leftovers(pgid: i32) {
    if !ADOPTS_ORPHANS.load(Ordering::SeqCst) {
        signal_group(pgid, libc::SIGKILL);
    }
    kill_descendants();
}

/// SIGKILLs every process this user may signal whose environment carries one of these runs'
/// `SESSIONS_MCP_RUN_ID` (Linux; best effort), in one scan of `/proc`: each process's environment
/// is read once, whatever the number of runs.
pub fn kill_processes_of_runs(run_ids: &[&str]) {
    let needles: std::collections::HashSet<Vec<u8>> =
        run_ids.iter().filter(|id| !id.is_empty()).map(|id| format!("SESSIONS_MCP_RUN_ID={id}").into_bytes()).collect();
    if needles.is_empty() {
        return;
    }
    let me = std::process::id() as i32;
    for pid in processes() {
        if pid == me {
            continue;
        }
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if environ.split(|b| *b == 0).any(|var| needles.contains(var)) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Kills our children and everything below them until none is left. As the subreaper we inherit
/// the orphans of each process killed, so a round that leaves some behind finds them in the next.
fn kill_descendants() {
    let me = std::process::id() as i32;
    for _ in 0..MAX_TREE_ROUNDS {
        reap_exited();
        let children = children_of(me);
        if children.is_empty() {
            return;
        }
        freeze_and_kill_trees(&children);
        for pid in children {
            // SAFETY: waitpid on our own child, which was just SIGKILLed.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// More rounds than any real process tree needs; what is left after them is left to the env
/// sweep and the rlimits.
const MAX_TREE_ROUNDS: usize = 64;

/// SIGKILLs `roots` and every process below them by ancestry (Linux; nothing elsewhere). Each
/// process is stopped (SIGSTOP) as it is found and the walk is repeated until it finds no new one
/// once all found have stopped, so none can fork away or be orphaned out of reach while the tree
/// is read; then the tree dies deepest first, so no process is orphaned before its own turn.
/// Returns what it killed, deepest first.
pub fn freeze_and_kill_trees(roots: &[i32]) -> Vec<i32> {
    let mut found: Vec<i32> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    loop {
        let before = found.len();
        let mut level: Vec<i32> = roots.to_vec();
        while !level.is_empty() {
            let mut next = Vec::new();
            for pid in level {
                if seen.insert(pid) {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe {
                        libc::kill(pid, libc::SIGSTOP);
                    }
                    found.push(pid);
                }
                next.extend(children_of(pid));
            }
            level = next;
        }
        if found.len() == before {
            break;
        }
        wait_stopped(&found[before..]);
    }
    for &pid in found.iter().rev() {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    found.reverse();
    found
}

/// Waits (up to 100 ms) until each of `pids` has stopped or died: a process in the middle of a
/// fork stops only once the fork is done, and its new child must be in the next walk.
fn wait_stopped(pids: &[i32]) {
    let settled = |pid: &i32| state_of(*pid).is_none_or(|state| matches!(state, 'T' | 't' | 'Z' | 'X'));
    for _ in 0..100 {
        if pids.iter().all(settled) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The state letter of `/proc/<pid>/stat` (None when it is gone).
fn state_of(pid: i32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// The fields of `/proc/<pid>/stat` after the command name (state first), which may hold any
/// character, spaces and parentheses included.
pub fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Reaps the orphans that already exited, so they are not counted as children.
fn reap_exited() {
    // SAFETY: waitpid with WNOHANG and no status pointer.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

/// The children of `pid`, from each of its threads' `children` list (Linux; none elsewhere).
pub fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn a_held_deadline_stands_still_and_moves_later_by_the_time_held_at_its_release() {
        let at = Instant::now() + Duration::from_secs(5);
        HELD.store(true, Ordering::SeqCst);
        let (until, held) = follow_hold(Some(at), None);
        assert_eq!(until, Some(at));
        let since = held.expect("held");
        assert_eq!(follow_hold(until, held), (Some(at), Some(since)), "still held");
        std::thread::sleep(Duration::from_millis(30));
        HELD.store(false, Ordering::SeqCst);
        let (moved, held) = follow_hold(until, held);
        assert_eq!(held, None);
        assert!(moved.unwrap() >= at + Duration::from_millis(30), "moved by the time held");
        assert_eq!(follow_hold(moved, None), (moved, None), "released stays put");
    }

    #[test]
    fn the_server_s_argv_parses_and_the_agent_s_own_flags_stay_its_own() {
        let args = Args::try_parse_from([
            BINARY,
            "--deadline-ms",
            "5000",
            "--umask",
            "18",
            "--server-sweeps",
            "--",
            "/bin/agent",
            "--deadline-ms",
            "x",
        ])
        .unwrap();
        assert!(args.server_sweeps);
        assert_eq!(args.deadline_ms, 5000);
        assert_eq!(args.step_ms, 1000);
        assert_eq!((args.uid, args.gid, args.umask), (None, None, Some(18)));
        assert_eq!(args.command, ["/bin/agent", "--deadline-ms", "x"]);
        assert!(Args::try_parse_from([BINARY, "--deadline-ms", "1"]).is_err(), "an agent is required");
        assert!(!Args::try_parse_from([BINARY, "--", "/bin/agent"]).unwrap().server_sweeps, "it sweeps by default");
    }
}
