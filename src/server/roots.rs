//! The requester's project as its MCP client declares it: the first `file://` root of the
//! client's `roots/list` that is a directory here. A host started in the user's project says so
//! through its roots (an HTTP daemon's own directory says nothing about its callers' projects).
//! The list is asked once per MCP session, at the first spawn, and again after the client's
//! `notifications/roots/list_changed`. Clients that declare no roots, or speak a protocol era
//! without server-to-client requests (where roots are deprecated), leave the serving process's
//! directory as the project.
// Roots are deprecated from the protocol era without `initialize` (SEP-2577) on; the hosts in
// use speak the earlier eras, where they are how a client says which project it works in.
#![allow(deprecated)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::Root;
use rmcp::service::RequestContext;
use tokio::sync::Mutex;

/// How long a spawn waits for the client's roots before it uses the server's own directory.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// One MCP session's answer to `roots/list`: None until asked (or after a change), then the
/// project it named (None: it named no directory of this machine, or did not answer).
#[derive(Clone, Default)]
pub struct ClientRoots {
    asked: Arc<Mutex<Option<Option<PathBuf>>>>,
}

impl ClientRoots {
    /// The project the client of `context` declares, asking it on first use.
    pub async fn project(&self, context: &RequestContext<RoleServer>) -> Option<PathBuf> {
        let declared = context.client_capabilities().is_some_and(|c| c.roots.is_some());
        let pushes = context.protocol_version().is_none_or(|v| v.has_initialize());
        if !declared || !pushes {
            return None;
        }
        let mut asked = self.asked.lock().await;
        if let Some(project) = asked.as_ref() {
            return project.clone();
        }
        let project = match tokio::time::timeout(ASK_TIMEOUT, context.peer.list_roots()).await {
            Ok(Ok(list)) => first_directory(&list.roots),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the client declared roots but roots/list failed; using the server's directory");
                None
            }
            Err(_) => {
                tracing::warn!(
                    "the client declared roots but did not answer roots/list in 5 s; using the server's directory"
                );
                None
            }
        };
        *asked = Some(project.clone());
        project
    }

    /// The client's roots changed: the next spawn asks again.
    pub async fn forget(&self) {
        *self.asked.lock().await = None;
    }
}

/// The first root that is a `file://` URL of an existing directory (others are skipped: a root
/// may name a remote resource, or a directory of the client's machine that is not on ours).
fn first_directory(roots: &[Root]) -> Option<PathBuf> {
    roots.iter().find_map(|root| {
        let path = url::Url::parse(&root.uri).ok().filter(|u| u.scheme() == "file")?.to_file_path().ok()?;
        path.is_dir().then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_file_root_that_is_a_directory_here_is_the_project() {
        let dir = tempfile::tempdir().unwrap();
        let spaced = dir.path().join("my project");
        std::fs::create_dir(&spaced).unwrap();
        let url = url::Url::from_directory_path(&spaced).unwrap().to_string();
        assert!(url.contains("my%20project"), "{url}");
        let roots = [
            Root::new("https://example.com/repo"),
            Root::new("file:///nowhere/on/this/machine"),
            Root::new("not a url"),
            Root::new(url),
        ];
        assert_eq!(first_directory(&roots), Some(spaced));
        assert_eq!(first_directory(&roots[..3]), None);
        assert_eq!(first_directory(&[]), None);
    }
}
