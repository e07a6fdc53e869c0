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
            let mut runs: Vec<Value> = runs_stmt
                .query_map(params![session, limit as i64], |r| {
                    let mut run = json!({"runId": r.get::<_, String>(0)?, "mode": r.get::<_, String>(1)?,
                                         "status": r.get::<_, String>(2)?, "startedAt": r.get::<_, Option<i64>>(3)?,
                                         "endedAt": r.get::<_, Option<i64>>(4)?});
                    if let Some(e) = r.get::<_, Option<String>>(5)? {
                        run["error"] = e.into();
                    }
                    Ok(run)
                })?
                .collect::<rusqlite::Result<_>>()?;
            for run in &mut runs {
                let run_id = run["runId"].as_str().unwrap_or_default().to_string();
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
                run["deliveries"] = deliveries.into();
            }
            Ok(runs)
        })
    }
}
