//! Directories below a workspace an agent may write, walked without a window: each is opened
//! relative to its parent's descriptor with `O_NOFOLLOW | O_DIRECTORY` (created 0700 when missing)
//! and used only through the descriptor, so a symlink swapped in by the agent is refused instead of
//! followed. Attachment staging and the sandbox's workdir preparation both walk this way.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, mkdirat, openat, statat};
use rustix::io::Errno;

pub const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY).union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// Opens the directory `name` in `parent` (creating it 0700 when missing), refusing a symlink.
pub fn open_or_create(parent: &OwnedFd, name: &OsStr, shown: &Path) -> Result<OwnedFd, String> {
    match mkdirat(parent, name, Mode::RWXU) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(format!("cannot create {}: {e}", shown.display())),
    }
    openat(parent, name, DIR_FLAGS, Mode::empty()).map_err(|e| match statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
            format!("{} is a symlink; refusing to follow it", shown.display())
        }
        Ok(st) if FileType::from_raw_mode(st.st_mode) != FileType::Directory => {
            format!("{} is not a directory", shown.display())
        }
        _ => format!("cannot open {}: {e}", shown.display()),
    })
}

/// Opens `<root>/<below>`, creating what is missing. `root` is the operator's workspace and may
/// itself be a symlink the operator chose; nothing below it is followed.
pub fn open_below(root: &Path, below: &Path) -> Result<OwnedFd, String> {
    std::fs::create_dir_all(root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let mut dir = openat(CWD, root, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("cannot open {}: {e}", root.display()))?;
    let mut shown = root.to_path_buf();
    for part in below.components() {
        let Component::Normal(name) = part else {
            return Err(format!("{} is not a plain path below {}", below.display(), root.display()));
        };
        shown.push(name);
        dir = open_or_create(&dir, name, &shown)?;
    }
    Ok(dir)
}
