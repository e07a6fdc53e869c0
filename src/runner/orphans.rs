//! The server as the last subreaper of its runs (Linux). Each run's supervisor is its run's child
//! subreaper, but an agent may SIGKILL it, and every supervisor it nested inside the run (the
//! installed `sessions-mcp-supervise` is a subreaper too): a payload below them that left the
//! group (`setsid`) and cleared its environment was then re-parented to init, where neither the
//! group kill nor the run-id sweep finds it. With the server a subreaper it is re-parented here
//! instead, and the server is the one ancestor an agent cannot take away without ending the server.
//!
//! An orphan is a child of the server that the server did not start: not registered here by
//! [`spawn`] (the supervisors and deliverers) and not in the server's own session (what the server
//! starts otherwise, such as the sandbox probe, stays in its session; a run never can, since its
//! supervisor leaves it before starting the agent, and no process can join a session). Whatever
//! is orphaned here belongs to a run whose supervisors are gone, so a run that has ended: every
//! run's end ([`super::sweep`]) freezes the orphans and everything below them, kills them deepest
//! first, and reaps them.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use super::supervise::{children_of, freeze_and_kill_trees, stat_fields};

/// The pids of the children the server started and has not reaped yet.
static STARTED: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

fn started() -> MutexGuard<'static, Option<HashSet<i32>>> {
    STARTED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes this process the subreaper of everything below it (Linux; elsewhere a no-op).
pub fn adopt_orphans() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with constant arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot become the runs' subreaper: a run whose supervisors are killed may leave processes behind");
    }
}

/// A child the server started, registered until this is dropped (after the child was reaped).
#[must_use]
pub struct Started(i32);

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(set) = started().as_mut() {
            set.remove(&self.0);
        }
    }
}

/// Spawns `cmd` as one of the server's own children. The registry is held across the spawn, so
/// no scan can see the new child before it is registered.
pub fn spawn(cmd: &mut tokio::process::Command) -> std::io::Result<(tokio::process::Child, Started)> {
    let mut registry = started();
    let child = cmd.spawn()?;
    let pid = child.id().map_or(0, |p| p as i32);
    registry.get_or_insert_with(HashSet::new).insert(pid);
    Ok((child, Started(pid)))
}

/// Freezes, kills (deepest first) and reaps every orphan of the server and all below them.
/// Blocking: the sweep's thread calls it.
///
/// Each round kills the orphans not killed yet, then reaps: a process dying as the scan reads
/// the tree (the server has just killed the run's group) hands its children to the server only
/// once it exits, after the walk below it found none, so they are found by a later round's scan.
/// A zombie's children have all been handed over, so a scan that finds no orphan at all, not even
/// an unreaped one, is the end.
pub fn end_orphans() {
    let registry = started();
    let mut killed: HashSet<i32> = HashSet::new();
    for _ in 0..REAP_ROUNDS {
        let found = orphans(registry.as_ref());
        if found.is_empty() {
            break;
        }
        let fresh: Vec<i32> = found.iter().copied().filter(|pid| !killed.contains(pid)).collect();
        if !fresh.is_empty() {
            killed.extend(freeze_and_kill_trees(&fresh));
        }
        for pid in found {
            // SAFETY: waitpid on a child of ours that nobody else waits for (not one we started).
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    if !killed.is_empty() {
        tracing::warn!(processes = killed.len(), "ended processes of finished runs whose supervisors had been killed");
    }
}

/// Enough 5 ms rounds for SIGKILLed processes to die and be re-parented (a process in
/// uninterruptible sleep may take longer: the next run's end reaps it).
const REAP_ROUNDS: usize = 200;

/// The children of this process that it did not start and that are outside its session.
fn orphans(started: Option<&HashSet<i32>>) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Some(own_session) = session_of(me) else { return Vec::new() };
    children_of(me)
        .into_iter()
        .filter(|pid| !started.is_some_and(|s| s.contains(pid)))
        .filter(|pid| session_of(*pid).is_some_and(|sid| sid != own_session))
        .collect()
}

/// The session of `pid`, from `/proc/<pid>/stat` (state, ppid, pgrp, session, …).
fn session_of(pid: i32) -> Option<i32> {
    stat_fields(pid)?.get(3)?.parse().ok()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_is_a_child_outside_the_session_that_was_not_registered() {
        // Held throughout, so a sweep of another test (which ends orphans) waits for this one.
        let _registry = started();
        let mut own = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let mut other = std::process::Command::new("setsid").args(["sleep", "30"]).spawn().unwrap();
        let (own_pid, other_pid) = (own.id() as i32, other.id() as i32);
        let me = std::process::id() as i32;
        for _ in 0..200 {
            if session_of(other_pid) != session_of(me) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let found = orphans(None);
        assert!(found.contains(&other_pid), "a child in a session of its own is an orphan: {found:?}");
        assert!(!found.contains(&own_pid), "a child in the server's session is not");
        let registered: HashSet<i32> = [other_pid].into();
        assert!(!orphans(Some(&registered)).contains(&other_pid), "a registered child is not");
        for child in [&mut own, &mut other] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}
