//! Runs and their deliveries, as history's `includeRuns` shows them.

use super::sql::args;
use serde_json::{Value, json};

use super::{Result, Store};

impl Store {
    /// The session's last `limit` runs, newest first, each with its deliveries.
    pub fn recent_runs(&self, session: i64, limit: usize) -> Result<Vec<Value>> {
        self.read(|c| {
            let runs_sql = format!(
                "SELECT run_id, mode, status, started_at, ended_at, error, remote_task_id FROM runs
                 WHERE session = ?1 ORDER BY created_at DESC, {} DESC LIMIT ?2",
                c.dialect().runs_order()
            );
            let deliveries_sql =
                "SELECT kind, status, channel, attempts, last_error FROM deliveries WHERE run_id = ?1 ORDER BY id";
            let mut runs: Vec<Value> = c.query_map(&runs_sql, args![session, limit as i64], |r| {
                let mut run = json!({"runId": r.get::<String>(0)?, "mode": r.get::<String>(1)?,
                                         "status": r.get::<String>(2)?, "startedAt": r.get::<Option<i64>>(3)?,
                                         "endedAt": r.get::<Option<i64>>(4)?});
                if let Some(e) = r.get::<Option<String>>(5)? {
                    run["error"] = e.into();
                }
                if let Some(task) = r.get::<Option<String>>(6)? {
                    run["remoteTaskId"] = task.into();
                }
                Ok(run)
            })?;
            for run in &mut runs {
                let run_id = run["runId"].as_str().unwrap_or_default().to_string();
                let deliveries: Vec<Value> = c.query_map(deliveries_sql, args![run_id], |r| {
                    let mut d = json!({"kind": r.get::<String>(0)?, "status": r.get::<String>(1)?,
                                           "attempts": r.get::<i64>(3)?});
                    if let Some(ch) = r.get::<Option<String>>(2)? {
                        d["channel"] = ch.into();
                    }
                    if let Some(e) = r.get::<Option<String>>(4)? {
                        d["lastError"] = e.into();
                    }
                    Ok(d)
                })?;
                run["deliveries"] = deliveries.into();
            }
            Ok(runs)
        })
    }
}
