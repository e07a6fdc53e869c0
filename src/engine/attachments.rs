//! Spawn attachments (docs/BEHAVIOUR.md, sessions_spawn): validated as arguments (names, strict base64, sizes), staged
//! in a temporary directory under the child's workdir before the spawn transaction, renamed into
//! `<workdir>/.openclaw/attachments/<uuid>/` as the transaction's last step, and removed again on
//! any failure (including a failed commit). Every directory below the workspace is opened without
//! following symlinks and used only through its descriptor, so a workspace an agent can write
//! cannot redirect the server's writes. Files are created exclusively, mode 0600, with a
//! `.manifest.json`.
//! Only sha256 receipts are kept; no transcript ever holds attachment content.

use std::cell::Cell;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, mkdirat, openat, renameat, unlinkat};

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::access::ToolError;
use crate::config::AttachmentsConfig;
use crate::safe_dirs::{DIR_FLAGS, open_below};
use crate::store::StoredAttachment;

pub const MANIFEST: &str = ".manifest.json";

/// One validated file.
#[derive(Debug)]
pub struct Incoming {
    pub name: String,
    pub bytes: Vec<u8>,
    pub mime_type: Option<String>,
}

/// Receipts of the written files.
#[derive(Debug, Clone)]
pub struct Receipt {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

fn check_name(i: usize, name: &str) -> Result<(), ToolError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name == MANIFEST
        || name.contains('/')
        || name.contains('\\')
        || name.chars().any(|c| c.is_control())
        || name.len() > 255;
    if bad {
        return Err(ToolError::invalid(format!(
            "attachments[{i}].name {name:?} is not allowed: a plain file name without '/', '\\\\', control characters, \".\", \"..\" or \"{MANIFEST}\""
        )));
    }
    Ok(())
}

/// Validates the `attachments` argument against the limits (all argument checks, no I/O).
pub fn validate(list: &[Value], limits: &AttachmentsConfig) -> Result<Vec<Incoming>, ToolError> {
    if list.len() > limits.max_files as usize {
        return Err(ToolError::invalid(format!(
            "attachments: {} files; at most {} (tools.sessions_spawn.attachments.maxFiles)",
            list.len(),
            limits.max_files
        )));
    }
    let mut out: Vec<Incoming> = Vec::with_capacity(list.len());
    let mut total = 0u64;
    for (i, item) in list.iter().enumerate() {
        let field = |k: &str| item.get(k).and_then(Value::as_str);
        let (Some(name), Some(content)) = (field("name"), field("content")) else {
            return Err(ToolError::invalid(format!("attachments[{i}] needs a name and a string content")));
        };
        check_name(i, name)?;
        if out.iter().any(|f| f.name == name) {
            return Err(ToolError::invalid(format!("attachments[{i}].name {name:?} is used twice")));
        }
        let bytes = match field("encoding").unwrap_or("utf8") {
            "utf8" => content.as_bytes().to_vec(),
            "base64" => base64::engine::general_purpose::STANDARD.decode(content).map_err(|e| {
                ToolError::invalid(format!(
                    "attachments[{i}].content is not valid base64 ({e}); use standard padded base64"
                ))
            })?,
            other => {
                return Err(ToolError::invalid(format!(
                    "attachments[{i}].encoding {other:?} is not allowed; allowed: utf8, base64"
                )));
            }
        };
        if bytes.len() as u64 > limits.max_file_bytes {
            return Err(ToolError::invalid(format!(
                "attachments[{i}] ({name}) is {} bytes; at most {} per file (tools.sessions_spawn.attachments.maxFileBytes)",
                bytes.len(),
                limits.max_file_bytes
            )));
        }
        total += bytes.len() as u64;
        if total > limits.max_total_bytes {
            return Err(ToolError::invalid(format!(
                "attachments total more than {} bytes (tools.sessions_spawn.attachments.maxTotalBytes)",
                limits.max_total_bytes
            )));
        }
        out.push(Incoming { name: name.to_string(), bytes, mime_type: field("mimeType").map(String::from) });
    }
    Ok(out)
}

/// Files written to a staging directory, not yet in place.
///
/// Every step after the workspace root is relative to a directory descriptor opened with
/// `O_NOFOLLOW | O_DIRECTORY`: a component swapped for a symlink after it was opened cannot
/// redirect a write, because no path below the root is ever resolved again.
#[derive(Debug)]
pub struct Staged {
    /// `.openclaw/attachments`: the staging and the final directory are names in it.
    parent: OwnedFd,
    /// The staging directory itself; it stays the same directory when it is renamed.
    dir: OwnedFd,
    id: String,
    /// The files created in `dir` so far (what a failure removes).
    created: Vec<String>,
    target: PathBuf,
    pub rel_dir: String,
    pub receipts: Vec<Receipt>,
    /// Renamed to `<id>` (inside the spawn transaction).
    placed: Cell<bool>,
    /// The spawn committed: the files stay.
    kept: bool,
}

/// Writes the files under `<workdir>/.openclaw/attachments/.staging-<uuid>/`, walking down from
/// `workspace` (the run workdir is the workspace or a directory below it).
pub fn stage(workspace: &Path, workdir: &Path, files: &[Incoming]) -> Result<Staged, String> {
    stage_as(workspace, workdir, uuid::Uuid::new_v4().to_string(), files)
}

/// [`stage`] for the directory `<id>`, which must not exist yet when it is placed.
fn stage_as(workspace: &Path, workdir: &Path, id: String, files: &[Incoming]) -> Result<Staged, String> {
    let below = workdir.strip_prefix(workspace).map_err(|_| {
        format!("the run workdir {} is not under the workspace {}", workdir.display(), workspace.display())
    })?;
    let parent = open_below(workspace, &below.join(".openclaw/attachments"))?;
    let staging = format!(".staging-{id}");
    let shown = workdir.join(".openclaw/attachments").join(&staging);
    mkdirat(&parent, staging.as_str(), Mode::RWXU).map_err(|e| format!("cannot create {}: {e}", shown.display()))?;
    let dir = match openat(&parent, staging.as_str(), DIR_FLAGS, Mode::empty()) {
        Ok(dir) => dir,
        Err(e) => {
            let _ = unlinkat(&parent, staging.as_str(), AtFlags::REMOVEDIR);
            return Err(format!("cannot open {}: {e}", shown.display()));
        }
    };
    let mut staged = Staged {
        parent,
        dir,
        target: workdir.join(".openclaw/attachments").join(&id),
        rel_dir: format!(".openclaw/attachments/{id}"),
        id,
        created: Vec::new(),
        receipts: Vec::new(),
        placed: Cell::new(false),
        kept: false,
    };
    let mut manifest = Vec::new();
    for f in files {
        staged.write_new(&f.name, &f.bytes)?;
        let sha = hex::encode(Sha256::digest(&f.bytes));
        manifest.push(json!({"name": f.name, "bytes": f.bytes.len(), "sha256": sha, "mimeType": f.mime_type}));
        staged.receipts.push(Receipt { name: f.name.clone(), bytes: f.bytes.len() as u64, sha256: sha });
    }
    let manifest = serde_json::to_string_pretty(&json!({"files": manifest})).unwrap_or_default();
    staged.write_new(MANIFEST, manifest.as_bytes())?;
    Ok(staged)
}

impl Staged {
    /// Creates a file in the staging directory that must not exist yet, never through a symlink,
    /// mode 0600.
    fn write_new(&mut self, name: &str, bytes: &[u8]) -> Result<(), String> {
        let shown = self.target.with_file_name(format!(".staging-{}", self.id)).join(name);
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = openat(&self.dir, name, flags, Mode::RUSR | Mode::WUSR)
            .map_err(|e| format!("cannot create {}: {e}", shown.display()))?;
        self.created.push(name.to_string());
        std::fs::File::from(fd).write_all(bytes).map_err(|e| format!("cannot write {}: {e}", shown.display()))
    }

    /// Renames the staging directory to its final name. Called inside the spawn transaction as
    /// its last step: if this fails the child is never committed, and if the commit fails the
    /// placed files are removed on drop.
    pub fn place(&self) -> Result<(), String> {
        renameat(&self.parent, format!(".staging-{}", self.id), &self.parent, self.id.as_str())
            .map_err(|e| format!("cannot move the attachments into place: {e}"))?;
        self.placed.set(true);
        Ok(())
    }

    /// The spawn committed: the files stay where `place` put them.
    pub fn keep(mut self) {
        self.kept = true;
    }

    /// Where the files end up (absolute).
    pub fn path(&self) -> &Path {
        &self.target
    }

    pub fn total_bytes(&self) -> u64 {
        self.receipts.iter().map(|r| r.bytes).sum()
    }

    /// The receipts as the spawn result shows them.
    pub fn summary(&self) -> Value {
        json!({
            "count": self.receipts.len(), "totalBytes": self.total_bytes(), "relDir": self.rel_dir,
            "files": self.receipts.iter().map(|r| json!({"name": r.name, "bytes": r.bytes, "sha256": r.sha256})).collect::<Vec<_>>(),
        })
    }

    /// What the run request lists: paths relative to the workdir.
    pub fn for_request(&self) -> Value {
        Value::Array(
            self.receipts
                .iter()
                .map(|r| json!({"name": r.name, "path": format!("{}/{}", self.rel_dir, r.name), "bytes": r.bytes, "sha256": r.sha256}))
                .collect(),
        )
    }
}

impl Drop for Staged {
    /// Anything not kept is removed, through the same descriptors: all or nothing, and nothing
    /// removed anywhere else.
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        for name in &self.created {
            let _ = unlinkat(&self.dir, name.as_str(), AtFlags::empty());
        }
        let name = if self.placed.get() { self.id.clone() } else { format!(".staging-{}", self.id) };
        if let Err(e) = unlinkat(&self.parent, name.as_str(), AtFlags::REMOVEDIR) {
            tracing::warn!(dir = %self.target.with_file_name(&name).display(), "cannot remove an unused attachment directory: {e}");
        }
    }
}

/// Writes a child's stored attachments ([`crate::store::Store::stored_attachments`]) into its run
/// workdir on this node, each directory that this node does not have yet: a run of the child
/// claimed by another node than the one that took the spawn finds its files where the spawn's
/// receipts say. Staged and renamed as at the spawn, so a run never sees part of a directory.
/// Returns how many directories were written.
pub fn materialise(workspace: &Path, workdir: &Path, stored: &[StoredAttachment]) -> Result<usize, String> {
    let mut written = 0;
    let mut dirs: Vec<&str> = stored.iter().map(|a| a.rel_dir.as_str()).collect();
    dirs.dedup();
    for rel_dir in dirs {
        // The id is ours (a uuid, from the spawn); anything else is not a path to write to.
        let id = rel_dir
            .strip_prefix(".openclaw/attachments/")
            .filter(|id| uuid::Uuid::parse_str(id).is_ok())
            .ok_or_else(|| format!("a stored attachment directory {rel_dir:?} is not .openclaw/attachments/<uuid>"))?;
        if std::fs::symlink_metadata(workdir.join(rel_dir)).is_ok() {
            continue;
        }
        let files: Vec<Incoming> = stored
            .iter()
            .filter(|a| a.rel_dir == rel_dir)
            .map(|a| Incoming { name: a.name.clone(), bytes: a.content.clone(), mime_type: a.mime_type.clone() })
            .collect();
        let staged = stage_as(workspace, workdir, id.to_string(), &files)?;
        staged.place()?;
        staged.keep();
        written += 1;
    }
    Ok(written)
}

/// Removes a committed attachment directory (cleanup at delete or archive).
pub fn remove(dir: &Path) {
    let s = dir.to_string_lossy();
    if s.contains("/.openclaw/attachments/") && !s.contains("..") {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(rel_dir: &str, name: &str, content: &[u8]) -> StoredAttachment {
        StoredAttachment {
            rel_dir: rel_dir.into(),
            name: name.into(),
            content: content.to_vec(),
            mime_type: Some("text/plain".into()),
        }
    }

    #[test]
    fn stored_attachments_are_written_once_where_the_spawn_put_them_and_nowhere_else() {
        let workspace = tempfile::tempdir().unwrap();
        let workdir = workspace.path().join("sessions/child");
        let id = uuid::Uuid::new_v4().to_string();
        let rel_dir = format!(".openclaw/attachments/{id}");
        let files = [stored(&rel_dir, "a.txt", b"alpha"), stored(&rel_dir, "b.bin", &[0, 255])];
        assert_eq!(materialise(workspace.path(), &workdir, &files).unwrap(), 1);
        let dir = workdir.join(&rel_dir);
        assert_eq!(std::fs::read(dir.join("a.txt")).unwrap(), b"alpha");
        assert_eq!(std::fs::read(dir.join("b.bin")).unwrap(), [0, 255]);
        let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join(MANIFEST)).unwrap()).unwrap();
        assert_eq!(manifest["files"][0]["mimeType"], "text/plain");
        assert_eq!(manifest["files"][1]["sha256"], hex::encode(Sha256::digest([0u8, 255])));
        // Present already: left as it is (the agent may have changed it).
        std::fs::write(dir.join("a.txt"), "changed by the agent").unwrap();
        assert_eq!(materialise(workspace.path(), &workdir, &files).unwrap(), 0);
        assert_eq!(std::fs::read_to_string(dir.join("a.txt")).unwrap(), "changed by the agent");
        let entries = std::fs::read_dir(workdir.join(".openclaw/attachments")).unwrap().count();
        assert_eq!(entries, 1, "no staging directory is left");
    }

    #[test]
    fn a_stored_directory_that_is_not_ours_is_refused_and_nothing_is_written() {
        let workspace = tempfile::tempdir().unwrap();
        for rel_dir in ["../../etc", ".openclaw/attachments/../x", ".openclaw/attachments/not-a-uuid", "elsewhere"] {
            let e = materialise(workspace.path(), workspace.path(), &[stored(rel_dir, "a", b"x")]).unwrap_err();
            assert!(e.contains("is not .openclaw/attachments/<uuid>"), "{rel_dir}: {e}");
        }
        assert_eq!(std::fs::read_dir(workspace.path()).unwrap().count(), 0);
    }

    fn limits() -> AttachmentsConfig {
        AttachmentsConfig { enabled: true, max_files: 3, max_file_bytes: 4, max_total_bytes: 6 }
    }

    #[test]
    fn names_encodings_and_sizes_are_checked() {
        let bad = |v: Value| validate(v.as_array().unwrap(), &limits()).unwrap_err().message;
        for name in ["../x", "a/b", ".", "..", ".manifest.json", "a\u{1}b", "a\\b", ""] {
            assert!(bad(json!([{"name": name, "content": "x"}])).contains("name"), "{name}");
        }
        assert!(bad(json!([{"name": "a", "content": "x"}, {"name": "a", "content": "y"}])).contains("twice"));
        assert!(bad(json!([{"name": "a", "content": "!!", "encoding": "base64"}])).contains("base64"));
        assert!(
            bad(json!([{"name": "a", "content": "QQ", "encoding": "base64"}])).contains("base64"),
            "padding is strict"
        );
        assert!(bad(json!([{"name": "a", "content": "12345"}])).contains("maxFileBytes"));
        assert!(validate(json!([{"name": "a", "content": "1234"}]).as_array().unwrap(), &limits()).is_ok());
        assert!(
            bad(json!([{"name": "a", "content": "1234"}, {"name": "b", "content": "123"}])).contains("maxTotalBytes")
        );
        assert!(
            validate(
                json!([{"name": "a", "content": "1234"}, {"name": "b", "content": "12"}]).as_array().unwrap(),
                &limits()
            )
            .is_ok()
        );
        assert!(bad(json!([{"name": "a", "content": ""}, {"name": "b", "content": ""}, {"name": "c", "content": ""}, {"name": "d", "content": ""}])).contains("maxFiles"));
    }

    fn one_file() -> Vec<Incoming> {
        validate(json!([{"name": "a.txt", "content": "hello"}]).as_array().unwrap(), &AttachmentsConfig::default())
            .unwrap()
    }

    fn entries(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn staging_is_all_or_nothing_and_refuses_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let staged = stage(dir.path(), dir.path(), &one_file()).unwrap();
        let target = dir.path().join(&staged.rel_dir);
        assert_eq!(staged.path(), target);
        assert_eq!(staged.receipts[0].sha256, hex::encode(Sha256::digest(b"hello")));
        staged.place().unwrap();
        staged.keep();
        assert_eq!(std::fs::read(target.join("a.txt")).unwrap(), b"hello");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(target.join("a.txt")).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(target.join(MANIFEST).is_file());
        // Dropped without being placed: nothing stays.
        drop(stage(dir.path(), dir.path(), &one_file()).unwrap());
        assert_eq!(entries(&dir.path().join(".openclaw/attachments")).len(), 1, "only the kept directory");
        // A planted symlink is never followed.
        let evil = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(other.path(), evil.path().join(".openclaw")).unwrap();
        assert!(stage(evil.path(), evil.path(), &one_file()).unwrap_err().contains("is a symlink"));
        assert!(entries(other.path()).is_empty());
        assert!(
            stage(dir.path(), Path::new("/elsewhere"), &one_file()).unwrap_err().contains("not under the workspace")
        );
    }

    #[test]
    fn a_symlink_at_any_step_below_the_workspace_is_refused() {
        // A sandboxed child's workdir: every directory from the workspace down is checked.
        let steps = [".sessions", ".sessions/s1", ".sessions/s1/.openclaw", ".sessions/s1/.openclaw/attachments"];
        for step in steps {
            let workspace = tempfile::tempdir().unwrap();
            let outside = tempfile::tempdir().unwrap();
            let link = workspace.path().join(step);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(outside.path(), &link).unwrap();
            let err = stage(workspace.path(), &workspace.path().join(".sessions/s1"), &one_file()).unwrap_err();
            assert_eq!(err, format!("{} is a symlink; refusing to follow it", link.display()), "{step}");
            assert!(entries(outside.path()).is_empty(), "{step}: nothing written through the link");
        }
        let workspace = tempfile::tempdir().unwrap();
        std::fs::write(workspace.path().join(".openclaw"), "").unwrap();
        let err = stage(workspace.path(), workspace.path(), &one_file()).unwrap_err();
        assert!(err.ends_with(".openclaw is not a directory"), "{err}");
    }

    /// The race of issue 14, one deterministic step at a time: the attachments directory is moved
    /// away and a symlink to outside takes its name between staging and placing.
    #[test]
    fn a_directory_swapped_after_it_was_opened_keeps_every_write_inside() {
        let workspace = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let (real, moved) = (workspace.path().join(".openclaw/attachments"), workspace.path().join(".openclaw/moved"));
        let placed = stage(workspace.path(), workspace.path(), &one_file()).unwrap();
        let dropped = stage(workspace.path(), workspace.path(), &one_file()).unwrap();
        std::fs::rename(&real, &moved).unwrap();
        std::os::unix::fs::symlink(outside.path(), &real).unwrap();
        placed.place().unwrap();
        let id = placed.rel_dir.rsplit('/').next().unwrap().to_string();
        placed.keep();
        drop(dropped);
        assert!(entries(outside.path()).is_empty(), "nothing placed or removed through the link");
        assert_eq!(entries(&moved), vec![id.clone()], "placed in the directory that was opened; the other removed");
        assert_eq!(std::fs::read(moved.join(&id).join("a.txt")).unwrap(), b"hello");
    }

    /// A placed directory whose spawn transaction then failed to commit is removed.
    #[test]
    fn placed_files_are_removed_when_the_spawn_is_not_kept() {
        let workspace = tempfile::tempdir().unwrap();
        let staged = stage(workspace.path(), workspace.path(), &one_file()).unwrap();
        staged.place().unwrap();
        assert!(staged.path().join("a.txt").is_file());
        drop(staged);
        assert!(entries(&workspace.path().join(".openclaw/attachments")).is_empty());
    }
}
