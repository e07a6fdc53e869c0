//! Spawn attachments (DESIGN §7.6): validated as arguments (names, strict base64, sizes), staged
//! in a temporary directory under the child's workdir before the spawn transaction, renamed into
//! `<workdir>/.openclaw/attachments/<uuid>/` after it commits, and removed again on any failure.
//! Files are created exclusively, never through a symlink, mode 0600, with a `.manifest.json`.
//! Only sha256 receipts are kept; no transcript ever holds attachment content.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::config::AttachmentsConfig;
use crate::tools::ToolError;

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
#[derive(Debug)]
pub struct Staged {
    staging: PathBuf,
    target: PathBuf,
    pub rel_dir: String,
    pub receipts: Vec<Receipt>,
    committed: bool,
}

/// Refuses a path component that is a symlink (or not a directory).
fn ensure_real_dir(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(format!("{} is a symlink; refusing to follow it", path.display())),
        Ok(m) if !m.is_dir() => Err(format!("{} is not a directory", path.display())),
        Ok(_) => Ok(()),
        Err(_) => std::fs::create_dir(path).map_err(|e| format!("cannot create {}: {e}", path.display())),
    }
}

/// Writes the files under `<workdir>/.openclaw/attachments/.staging-<uuid>/`.
pub fn stage(workdir: &Path, files: &[Incoming]) -> Result<Staged, String> {
    std::fs::create_dir_all(workdir).map_err(|e| format!("cannot create {}: {e}", workdir.display()))?;
    let base = workdir.join(".openclaw");
    ensure_real_dir(&base)?;
    let dir = base.join("attachments");
    ensure_real_dir(&dir)?;
    let id = uuid::Uuid::new_v4().to_string();
    let staging = dir.join(format!(".staging-{id}"));
    std::fs::create_dir(&staging).map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
    let mut staged = Staged {
        staging: staging.clone(),
        target: dir.join(&id),
        rel_dir: format!(".openclaw/attachments/{id}"),
        receipts: Vec::new(),
        committed: false,
    };
    let mut manifest = Vec::new();
    for f in files {
        write_new(&staging.join(&f.name), &f.bytes)?;
        let sha = hex::encode(Sha256::digest(&f.bytes));
        manifest.push(json!({"name": f.name, "bytes": f.bytes.len(), "sha256": sha, "mimeType": f.mime_type}));
        staged.receipts.push(Receipt { name: f.name.clone(), bytes: f.bytes.len() as u64, sha256: sha });
    }
    write_new(
        &staging.join(MANIFEST),
        serde_json::to_string_pretty(&json!({"files": manifest})).unwrap_or_default().as_bytes(),
    )?;
    Ok(staged)
}

/// Creates a file that must not exist yet, never through a symlink, mode 0600.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    f.write_all(bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

impl Staged {
    /// Moves the files into place (after the spawn transaction committed).
    pub fn commit(mut self) -> Result<(), String> {
        std::fs::rename(&self.staging, &self.target)
            .map_err(|e| format!("cannot move the attachments into place: {e}"))?;
        self.committed = true;
        Ok(())
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
    /// Anything not committed is removed: all or nothing.
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
    }
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

    #[test]
    fn staging_is_all_or_nothing_and_refuses_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let files =
            validate(json!([{"name": "a.txt", "content": "hello"}]).as_array().unwrap(), &AttachmentsConfig::default())
                .unwrap();
        let staged = stage(dir.path(), &files).unwrap();
        let target = dir.path().join(&staged.rel_dir);
        assert_eq!(staged.receipts[0].sha256, hex::encode(Sha256::digest(b"hello")));
        staged.commit().unwrap();
        assert_eq!(std::fs::read(target.join("a.txt")).unwrap(), b"hello");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(target.join("a.txt")).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(target.join(MANIFEST).is_file());
        // Dropped without commit: nothing stays.
        let staged = stage(dir.path(), &files).unwrap();
        let rel = staged.rel_dir.clone();
        drop(staged);
        assert!(!dir.path().join(rel).exists());
        let leftovers = std::fs::read_dir(dir.path().join(".openclaw/attachments")).unwrap().count();
        assert_eq!(leftovers, 1, "only the committed directory");
        // A planted symlink is never followed.
        let evil = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(other.path(), evil.path().join(".openclaw")).unwrap();
        assert!(stage(evil.path(), &files).unwrap_err().contains("symlink"));
        assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
    }
}
