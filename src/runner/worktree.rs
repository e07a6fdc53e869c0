//! `workspace: "worktree"`: a child's own git worktree and branch of the requester's project, so
//! that children editing the same files do not write over each other. It is made before the
//! child's first run (from the project's HEAD), in the state dir, never inside the project (git
//! records it in the repository's own `.git/worktrees/`). At the child's announce it is removed —
//! when the spawn asked `cleanup: "delete"` — only if it holds no work: nothing uncommitted and no
//! commit the project's HEAD lacks; else it is kept, and the announce says where and why.
//! It runs the user's `git`: worktrees are git's own feature, and its CLI is what the user has.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// A child's worktree: where it is, its branch, and the repository it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Worktree {
    /// The worktree's top directory.
    pub path: String,
    pub branch: String,
    /// The project's repository (its top directory).
    pub repo: String,
    /// Where the child works in it: the project's place in its repository.
    pub workdir: String,
}

/// What became of a worktree at the child's announce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    Removed,
    Kept { uncommitted: usize, unmerged: usize },
}

/// Makes the worktree `<under>/<name>` on a new branch `sessions-mcp/<name>` from the HEAD of
/// the repository `project` is in. The error says what the requester can do instead.
pub fn create(project: &Path, under: &Path, name: &str) -> Result<Worktree, String> {
    let not_git = |e: String| {
        format!(
            "workspace \"worktree\": the project {} is not in a git repository ({e}); ask \"project\" or \"isolated\"",
            project.display()
        )
    };
    let repo = PathBuf::from(git(project, &["rev-parse", "--show-toplevel"]).map_err(not_git)?);
    git(&repo, &["rev-parse", "--verify", "--quiet", "HEAD"]).map_err(|_| {
        format!(
            "workspace \"worktree\": the repository {} has no commit yet; commit once, or ask \"project\"",
            repo.display()
        )
    })?;
    let branch = format!("sessions-mcp/{name}");
    let path = under.join(name);
    std::fs::create_dir_all(under).map_err(|e| format!("workspace \"worktree\": {}: {e}", under.display()))?;
    let target = path.to_string_lossy().into_owned();
    git(&repo, &["worktree", "add", "--quiet", "-b", &branch, &target, "HEAD"])
        .map_err(|e| format!("workspace \"worktree\": git worktree add failed: {e}"))?;
    let inside = std::fs::canonicalize(project).ok().and_then(|p| p.strip_prefix(&repo).ok().map(Path::to_path_buf));
    let workdir = match inside.filter(|rel| !rel.as_os_str().is_empty()) {
        Some(rel) => path.join(rel),
        None => path.clone(),
    };
    Ok(Worktree {
        path: target,
        branch,
        repo: repo.to_string_lossy().into_owned(),
        workdir: workdir.to_string_lossy().into_owned(),
    })
}

/// The worktree's state at the child's end; with `remove_if_clean`, a worktree that holds no
/// work is removed with its branch. A worktree already gone counts as removed.
pub fn settle(wt: &Worktree, remove_if_clean: bool) -> Settled {
    let path = Path::new(&wt.path);
    if !path.is_dir() {
        return Settled::Removed;
    }
    let uncommitted = git(path, &["status", "--porcelain", "--untracked-files=all"]).map_or(usize::MAX, count_lines);
    let unmerged = git(Path::new(&wt.repo), &["rev-list", "--count", &format!("HEAD..{}", wt.branch)])
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX);
    if remove_if_clean && uncommitted == 0 && unmerged == 0 {
        let repo = Path::new(&wt.repo);
        match git(repo, &["worktree", "remove", &wt.path]).and_then(|_| git(repo, &["branch", "-D", &wt.branch])) {
            Ok(_) => return Settled::Removed,
            Err(e) => tracing::warn!(worktree = %wt.path, error = %e, "removing a child's clean worktree failed"),
        }
    }
    Settled::Kept { uncommitted, unmerged }
}

/// The announce's line for a settled worktree.
pub fn settled_line(wt: &Worktree, settled: &Settled) -> String {
    match settled {
        Settled::Removed => format!("{} on branch {}: removed (no changes)", wt.path, wt.branch),
        Settled::Kept { uncommitted, unmerged } => {
            let count = |n: usize| if n == usize::MAX { "?".to_string() } else { n.to_string() };
            format!(
                "{} on branch {}: kept ({} uncommitted file(s), {} commit(s) not in the project's HEAD)",
                wt.path,
                wt.branch,
                count(*uncommitted),
                count(*unmerged)
            )
        }
    }
}

/// A branch-safe name for a child's worktree: its label's letters, digits, `-`, `_` and `.`, and
/// its session id's first block (children with one label get distinct branches).
pub fn name_for(label: Option<&str>, agent: &str, session_id: &str) -> String {
    let base: String = label
        .unwrap_or(agent)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') { c } else { '-' })
        .take(40)
        .collect();
    let base = base.trim_matches('-');
    let short = session_id.split('-').next().unwrap_or(session_id);
    if base.is_empty() { short.to_string() } else { format!("{base}-{short}") }
}

fn count_lines(text: String) -> usize {
    text.lines().filter(|l| !l.trim().is_empty()).count()
}

/// Runs `git -C dir args…`: its trimmed stdout, or its stderr's first line as the error.
fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .map_err(|e| format!("git could not be run: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(err.lines().find(|l| !l.trim().is_empty()).unwrap_or("git failed").trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for args in [
            &["init", "--quiet", "-b", "main"][..],
            &["config", "user.email", "t@example.com"],
            &["config", "user.name", "t"],
        ] {
            git(dir.path(), args).unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), "a\n").unwrap();
        git(dir.path(), &["add", "."]).unwrap();
        git(dir.path(), &["commit", "--quiet", "-m", "one"]).unwrap();
        dir
    }

    #[test]
    fn a_worktree_is_made_from_head_and_removed_only_when_it_holds_no_work() {
        let (repo, state) = (repo(), tempfile::tempdir().unwrap());
        let wt = create(&repo.path().join("sub"), state.path(), "fix-1").unwrap();
        assert_eq!(wt.branch, "sessions-mcp/fix-1");
        assert!(wt.workdir.ends_with("fix-1/sub"), "the project's place in the repository: {}", wt.workdir);
        assert_eq!(std::fs::read_to_string(Path::new(&wt.workdir).join("a.txt")).unwrap(), "a\n");

        std::fs::write(Path::new(&wt.workdir).join("a.txt"), "changed\n").unwrap();
        assert_eq!(settle(&wt, true), Settled::Kept { uncommitted: 1, unmerged: 0 });
        git(Path::new(&wt.path), &["commit", "--quiet", "-am", "two"]).unwrap();
        assert_eq!(settle(&wt, true), Settled::Kept { uncommitted: 0, unmerged: 1 });
        assert!(Path::new(&wt.path).is_dir());

        let clean = create(repo.path(), state.path(), "clean-2").unwrap();
        assert_eq!(settle(&clean, false), Settled::Kept { uncommitted: 0, unmerged: 0 }, "keep asked");
        assert_eq!(settle(&clean, true), Settled::Removed);
        assert!(!Path::new(&clean.path).exists());
        assert!(git(repo.path(), &["rev-parse", "--verify", "--quiet", "sessions-mcp/clean-2"]).is_err());
    }

    #[test]
    fn a_project_outside_git_or_without_a_commit_is_refused_saying_what_to_ask() {
        let (plain, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let err = create(plain.path(), state.path(), "x").unwrap_err();
        assert!(err.contains("is not in a git repository") && err.contains("ask \"project\""), "{err}");
        git(plain.path(), &["init", "--quiet"]).unwrap();
        let err = create(plain.path(), state.path(), "x").unwrap_err();
        assert!(err.contains("has no commit yet"), "{err}");
    }

    #[test]
    fn names_are_branch_safe_and_distinct_per_child() {
        assert_eq!(name_for(Some("fix the login/page!"), "main", "1b2c3d4e-aaaa"), "fix-the-login-page-1b2c3d4e");
        assert_eq!(name_for(None, "claude", "9f00-1"), "claude-9f00");
        assert_eq!(name_for(Some("///"), "main", "ab-1"), "ab");
    }
}
