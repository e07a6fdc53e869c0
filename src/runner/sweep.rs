//! The run-id sweep, batched. After a run's supervisor has killed the run's tree, every process
//! that still carries the run's `SESSIONS_MCP_RUN_ID` (it left the tree through some other
//! service) is killed. A sweep reads the environment of every process on the machine, so one per
//! run made a thousand runs ending together cost a thousand scans of thousands of processes: most
//! of the machine's CPU in the fan-out benchmark (BENCHMARKS.md). Here one scan serves every run
//! that ended while the previous scan ran, and a run's end still waits for a scan that began after
//! its supervisor had exited, so nothing of a run outlives its outcome. The same scan first ends
//! what the server adopted from runs whose supervisors were killed (`super::orphans`).

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Runs waiting for a scan, and whether one is under way. Cheap to clone.
#[derive(Clone, Default)]
pub struct Sweeper {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    waiting: Vec<(String, oneshot::Sender<()>)>,
    scanning: bool,
}

impl Sweeper {
    /// Returns once a scan that began after this call has killed every process carrying `run_id`.
    pub async fn sweep(&self, run_id: &str) {
        let (done, swept) = oneshot::channel();
        let start = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.waiting.push((run_id.to_string(), done));
            !std::mem::replace(&mut state.scanning, true)
        };
        if start {
            let sweeper = self.clone();
            tokio::task::spawn_blocking(move || sweeper.scan_until_none_wait());
        }
        // An Err means the scanning thread panicked: nothing more to wait for.
        let _ = swept.await;
    }

    /// Scans for every run waiting, again for those that came during the scan, until none waits.
    fn scan_until_none_wait(&self) {
        loop {
            let batch = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if state.waiting.is_empty() {
                    state.scanning = false;
                    return;
                }
                std::mem::take(&mut state.waiting)
            };
            let ids: Vec<&str> = batch.iter().map(|(id, _)| id.as_str()).collect();
            super::orphans::end_orphans();
            super::supervise::kill_processes_of_runs(&ids);
            tracing::debug!(runs = ids.len(), "run-id sweep");
            for (_, done) in batch {
                let _ = done.send(());
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn carrying(run_id: &str) -> std::process::Child {
        std::process::Command::new("sleep").arg("600").env("SESSIONS_MCP_RUN_ID", run_id).spawn().unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_sweep_kills_the_processes_of_every_run_that_waits_and_no_other() {
        let sweeper = Sweeper::default();
        let mut a = carrying("sweep-test-a");
        let mut b = carrying("sweep-test-b");
        let mut other = carrying("sweep-test-other");
        tokio::join!(sweeper.sweep("sweep-test-a"), sweeper.sweep("sweep-test-b"));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(a.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert_eq!(b.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(other.try_wait().unwrap().is_none(), "a process of another run lives on");
        sweeper.sweep("sweep-test-other").await;
        assert_eq!(other.wait().unwrap().signal(), Some(libc::SIGKILL), "a later sweep scans again");
    }
}
