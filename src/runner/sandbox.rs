//! The bubblewrap jail for sandboxed sessions (DESIGN §8): a read-only system, only the session's
//! workdir writable, no network (unless `runner.sandbox.network: "host"`), its own user and PID
//! namespaces, no capabilities, the run socket bind-mounted at `/run/sessions-mcp.sock` and this
//! binary at `/run/sessions-mcp-bin`. Inside, the agent is uid/gid 65534 (`nobody`). A sandboxed
//! run whose jail cannot start fails; it never runs unconfined.
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

/// Prepares the workdir (0700: only the server's uid, which the jail maps to 65534).
pub fn prepare_workdir(workdir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for dir in [workdir.to_path_buf(), workdir.join(".tmp"), workdir.join(".sessions-home")] {
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
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
