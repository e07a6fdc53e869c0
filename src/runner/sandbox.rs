//! The bubblewrap jail for sandboxed sessions (docs/RUNNER-PROTOCOL.md, Sandbox): a read-only
//! system, only the session's workdir writable, no network (unless
//! `runner.sandbox.network: "host"`), its own user and PID namespaces, no capabilities, the run
//! socket bind-mounted at `/run/sessions-mcp.sock` and this binary at `/run/sessions-mcp-bin`.
//! Inside, the agent is uid/gid 65534 (`nobody`). A sandboxed run whose jail cannot start fails;
//! it never runs unconfined.
//!
//! bwrap runs as the server's own user: started as another uid it could not bind paths that only
//! the server may reach (a state dir under `/root`, the server's socket). Under a root server the
//! jailed process is therefore root *outside* its user namespace, without any capability; so /etc
//! is not bound whole — only the files programs need, none of the secrets (shadow, ssh keys).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the run socket and the binary appear inside the jail.
pub const SOCKET_INSIDE: &str = "/run/sessions-mcp.sock";
pub const BIN_INSIDE: &str = "/run/sessions-mcp-bin";
/// The uid/gid of the agent inside the jail.
pub const JAIL_ID: u32 = 65534;
/// The parts of /etc a program needs (bound read-only when present); nothing secret.
const ETC: [&str; 14] = [
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/os-release",
    "/etc/mime.types",
];

/// How a jailed run is set up.
#[derive(Debug, Clone)]
pub struct Jail {
    pub network_host: bool,
    /// The agent workspace, bound read-only (or read-write) beside the workdir.
    pub workspace: PathBuf,
    pub workspace_rw: bool,
    /// The only writable directory: `<workspace>/.sessions/<sessionId>/`.
    pub workdir: PathBuf,
    pub socket: PathBuf,
    pub exe: PathBuf,
}

/// Whether bubblewrap can start a jail here (probed once).
pub fn available() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            if cfg!(not(target_os = "linux")) {
                return Err("bubblewrap needs Linux".into());
            }
            let mut cmd = std::process::Command::new("bwrap");
            cmd.args([
                "--ro-bind",
                "/",
                "/",
                "--unshare-all",
                "--unshare-user",
                "--die-with-parent",
                "--cap-drop",
                "ALL",
            ]);
            cmd.args(["--uid", "65534", "--gid", "65534", "--", "/bin/true"]);
            match cmd.output() {
                Ok(out) if out.status.success() => Ok(()),
                Ok(out) => Err(format!("bwrap failed: {}", String::from_utf8_lossy(&out.stderr).trim())),
                Err(e) => Err(format!("bwrap is not installed or not runnable ({e}); install the bubblewrap package")),
            }
        })
        .clone()
}

/// A sandboxed session's only writable directory.
pub fn session_workdir(workspace: &Path, session_id: &str) -> PathBuf {
    workspace.join(".sessions").join(session_id)
}

/// Prepares the workdir below `workspace` and its `.tmp` and `.sessions-home` (0700: only the
/// server's uid, which the jail maps to 65534). The workspace may be writable by an earlier run's
/// agent, so the walk follows no link and the modes are set through the descriptors: a symlink
/// put in place of any of them is refused, never chmodded through.
pub fn prepare_workdir(workspace: &Path, workdir: &Path) -> Result<(), String> {
    use rustix::fs::{Mode, fchmod};
    let below = workdir
        .strip_prefix(workspace)
        .map_err(|_| format!("{} is not below the workspace {}", workdir.display(), workspace.display()))?;
    let dir = crate::safe_dirs::open_below(workspace, below)?;
    let private = |fd: &std::os::fd::OwnedFd, shown: &Path| {
        fchmod(fd, Mode::RWXU).map_err(|e| format!("cannot make {} private: {e}", shown.display()))
    };
    private(&dir, workdir)?;
    for name in [".tmp", ".sessions-home"] {
        let shown = workdir.join(name);
        private(&crate::safe_dirs::open_or_create(&dir, name.as_ref(), &shown)?, &shown)?;
    }
    Ok(())
}

impl Jail {
    /// The bwrap argv that runs `command args…` inside the jail with `env`.
    pub fn argv(&self, command: &str, args: &[String], env: &[(String, String)]) -> (String, Vec<String>) {
        let mut a: Vec<String> = Vec::new();
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
        push(&["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534"]);
        if self.network_host {
            push(&["--share-net"]);
        }
        push(&["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]);
        push(&["--ro-bind", "/usr", "/usr"]);
        for (link, target) in [("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64")]
        {
            if Path::new(link).is_symlink() {
                push(&["--symlink", target, link]);
            } else if Path::new(link).exists() {
                push(&["--ro-bind", link, link]);
            }
        }
        push(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]);
        for f in ETC {
            push(&["--ro-bind-try", f, f]);
        }
        let bind = if self.workspace_rw { "--bind" } else { "--ro-bind" };
        let (ws, wd) = (self.workspace.display().to_string(), self.workdir.display().to_string());
        a.extend([bind.to_string(), ws.clone(), ws]);
        a.extend(["--bind".to_string(), wd.clone(), wd.clone()]);
        a.extend(["--ro-bind".to_string(), self.exe.display().to_string(), BIN_INSIDE.to_string()]);
        if self.socket.exists() {
            a.extend(["--bind".to_string(), self.socket.display().to_string(), SOCKET_INSIDE.to_string()]);
        }
        // Files the command names (a script, the agent's own program) are readable inside.
        let inside = |p: &str| if Path::new(p) == self.exe { BIN_INSIDE.to_string() } else { p.to_string() };
        for p in std::iter::once(command).chain(args.iter().map(String::as_str)) {
            let path = Path::new(p);
            if path.is_absolute() && path.is_file() && path != self.exe && !p.starts_with("/usr/") {
                a.extend(["--ro-bind".to_string(), p.to_string(), p.to_string()]);
            }
        }
        for (k, v) in env {
            a.extend(["--setenv".to_string(), k.clone(), v.clone()]);
        }
        // The jail's own root (a tmpfs holding the mount points) becomes read-only too.
        a.extend(["--remount-ro".to_string(), "/".to_string()]);
        a.extend(["--chdir".to_string(), wd, "--".to_string(), inside(command)]);
        a.extend(args.iter().map(|x| inside(x)));
        ("bwrap".to_string(), a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn the_workdir_is_made_private_and_a_symlink_put_in_its_place_is_refused_not_chmodded() {
        let root = tempfile::tempdir().unwrap();
        let workspace = root.path().join("ws");
        let workdir = session_workdir(&workspace, "s1");
        prepare_workdir(&workspace, &workdir).unwrap();
        for dir in [workdir.clone(), workdir.join(".tmp"), workdir.join(".sessions-home")] {
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        }
        // An earlier run's agent (rw workspace) replaced its next workdir and a subdirectory with
        // links to directories of the server's user elsewhere.
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(workspace.join(".sessions")).unwrap();
        std::os::unix::fs::symlink(&outside, workspace.join(".sessions/s2")).unwrap();
        let err = prepare_workdir(&workspace, &session_workdir(&workspace, "s2")).unwrap_err();
        assert!(err.contains("is a symlink"), "{err}");
        std::fs::remove_dir(workdir.join(".tmp")).unwrap();
        std::os::unix::fs::symlink(&outside, workdir.join(".tmp")).unwrap();
        let err = prepare_workdir(&workspace, &workdir).unwrap_err();
        assert!(err.contains(".tmp is a symlink"), "{err}");
        assert_eq!(mode(&outside), 0o755, "nothing outside the workspace was touched");
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "nothing was created outside");
    }
}
