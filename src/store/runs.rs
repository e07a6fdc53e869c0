//! Runs and their deliveries, as history's `includeRuns` shows them.

use rusqlite::params;
use serde_json::{Value, json};

use super::{Result, Store};

impl Store {
    /// The session's last `limit` runs, newest first, each with its deliveries.
    pub fn recent_runs(&self, session: i64, limit: usize) -> Result<Vec<Value>> {
        self.read(|c| {
            let mut runs_stmt = c.prepare_cached(
                "SELECT run_id, mode, status, started_at, ended_at, error FROM runs
                 WHERE session = ?1 ORDER BY created_at DESC, rowid DESC LIMIT ?2",
            )?;
            let mut deliveries_stmt = c.prepare_cached(
                "SELECT kind, status, channel, attempts, last_error FROM deliveries WHERE run_id = ?1 ORDER BY id",
            )?;
            let runs: Vec<(String, String, String, Option<i64>, Option<i64>, Option<String>)> = runs_stmt
                .query_map(params![session, limit as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let mut out = Vec::with_capacity(runs.len());
            for (run_id, mode, status, started, ended, error) in runs {
                let deliveries: Vec<Value> = deliveries_stmt
                    .query_map([&run_id], |r| {
                        let mut d = json!({"kind": r.get::<_, String>(0)?, "status": r.get::<_, String>(1)?,
                                           "attempts": r.get::<_, i64>(3)?});
                        if let Some(ch) = r.get::<_, Option<String>>(2)? {
                            d["channel"] = ch.into();
                        }
                        if let Some(e) = r.get::<_, Option<String>>(4)? {
                            d["lastError"] = e.into();
                        }
                        Ok(d)
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                let mut run = json!({"runId": run_id, "mode": mode, "status": status,
                                     "startedAt": started, "endedAt": ended, "deliveries": deliveries});
                if let Some(e) = error {
                    run["error"] = e.into();
                }
                out.push(run);
            }
            Ok(out)
        })
    }
}
