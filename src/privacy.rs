//! What the server writes is private to its user, whatever the umask it was started with:
//! transcripts are stored in plain text, so a `sessions.db` (or its `-wal`), an export, a lock
//! file or a workspace that another local user may read leaks every session.
//!
//! The root is the process umask: every serving and operator command sets it to `077` first
//! ([`keep_created_files_private`]), so SQLite's files, exports, attachment staging and
//! workspaces are created 0600/0700 without each site having to remember. The user's own umask is
//! kept for the agents (`sessions-mcp-supervise --umask` applies it): what an agent writes in its workspace is the
//! user's business. [`create_private_dir`] makes the state dir 0700 even for library callers that
//! never set the umask, and [`check_modes`] is `doctor`'s report (and fix) for a store created
//! before this.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The umask the process was started with, when [`keep_created_files_private`] replaced it.
static USER_UMASK: OnceLock<u32> = OnceLock::new();

/// Group and other permission bits: none of them may be set on what the server creates.
const SHARED_BITS: u32 = 0o077;

/// Sets the process umask to `077` and remembers the user's for the agents. Call it once, at
/// start, before any thread exists (umask is process-wide).
pub fn keep_created_files_private() {
    // SAFETY: umask has no memory-safety preconditions.
    let previous = unsafe { libc::umask(SHARED_BITS as libc::mode_t) };
    let _ = USER_UMASK.set(previous as u32);
}

/// The umask agents run with: the user's, when the server replaced it (None: unchanged).
pub fn user_umask() -> Option<u32> {
    USER_UMASK.get().copied()
}

/// Creates `dir` and its missing parents 0700 (an existing directory keeps its mode: `doctor`
/// reports it).
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// What [`check_modes`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ModeReport {
    /// Paths that group or other users may read, write or enter, with their mode.
    pub shared: Vec<(PathBuf, u32)>,
    /// How many of them were made private (with `fix`).
    pub fixed: usize,
}

/// Walks the state dir (without following links) for entries with group or other bits; with
/// `fix`, clears those bits on each (a failed fix is still reported). An agent's workspace
/// (`workspaces/<agent>`) is checked but not entered: below it is the agent's own work, written
/// with the user's umask, and the private workspace directory already keeps it from others.
pub fn check_modes(state_dir: &Path, fix: bool) -> std::io::Result<ModeReport> {
    let mut report = ModeReport::default();
    let workspaces = state_dir.join("workspaces");
    let mut pending = vec![state_dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & SHARED_BITS != 0 {
            if fix && std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & !SHARED_BITS)).is_ok() {
                report.fixed += 1;
            }
            report.shared.push((path.clone(), mode));
        }
        if meta.is_dir() && path.parent() != Some(workspaces.as_path()) {
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        }
    }
    report.shared.sort();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_modes_reports_and_fixes_what_others_may_read_and_leaves_links_alone() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        create_private_dir(&state.join("ws")).unwrap();
        let agent_ws = state.join("workspaces/main");
        create_private_dir(&agent_ws).unwrap();
        std::fs::write(agent_ws.join("agent-file"), "z").unwrap();
        std::fs::set_permissions(agent_ws.join("agent-file"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
        let db = state.join("sessions.db");
        std::fs::write(&db, "x").unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(state.join("ws"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "y").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, state.join("link")).unwrap();

        let found = check_modes(&state, false).unwrap();
        assert_eq!(found.shared, vec![(db.clone(), 0o644), (state.join("ws"), 0o755)]);
        assert_eq!(found.fixed, 0);
        let fixed = check_modes(&state, true).unwrap();
        assert_eq!(fixed.fixed, 2);
        assert_eq!(check_modes(&state, false).unwrap(), ModeReport::default());
        assert_eq!(std::fs::metadata(&db).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777, 0o644, "links are not followed");
    }
}
