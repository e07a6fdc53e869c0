//! Tool latency in-process, through the path a `tools/call` takes (access, store, sanitising,
//! JSON) but without a transport: the floor under the stdio rows.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use super::worlds::history_key;
use super::{Bench, Group, Row, Samples, sample};
use crate::access::Access;
use crate::access::caller::Caller;
use crate::store::Store;
use crate::tools::{self, Ctx};

pub async fn run(bench: &mut Bench) -> anyhow::Result<()> {
    let calls = bench.sizes.calls;
    for &n in bench.sizes.list_sessions {
        let world = World::open(&bench.worlds.sessions(n)?)?;
        let row = world.measure("sessions_list", json!({"limit": 50, "messageLimit": 5}), calls).await?;
        bench.push(Row::latency(Group::InProcess, format!("list limit 50 messageLimit 5, {n} sessions"), &row));
    }
    let n = bench.sizes.big().min(10_000);
    let world = World::open(&bench.worlds.tree(n)?)?;
    let row = world.measure("sessions_list", json!({"limit": 50}), calls).await?;
    bench.push(Row::latency(Group::InProcess, format!("list limit 50, tree, caller with {n} children"), &row));
    let sizes = bench.sizes.history_messages;
    let world = World::open(&bench.worlds.histories(sizes)?)?;
    for &n in sizes {
        let row = world.measure("sessions_history", json!({"sessionKey": history_key(n), "limit": 200}), calls).await?;
        bench.push(Row::latency(Group::InProcess, format!("history limit 200, {n} messages"), &row));
    }
    Ok(())
}

/// A world's store and config opened in this process, with `main` calling as the operator's
/// top-level session (also used by the criterion benches).
pub struct World {
    access: Access,
    caller: Caller,
}

impl World {
    pub fn open(state_dir: &Path) -> anyhow::Result<Self> {
        let config = crate::config::load(&state_dir.join("config.json5"), true)?.config;
        let caller = Caller::external_main();
        let store = Store::open(&Store::path_in(state_dir))?;
        Ok(World { access: Access::new(store, Arc::new(config)), caller })
    }

    async fn measure(&self, tool: &str, args: Value, n: usize) -> anyhow::Result<Samples> {
        sample(n, || self.call(tool, args.clone())).await
    }

    /// One `tools/call` of `tool`; an error unless it succeeded.
    pub async fn call(&self, tool: &str, args: Value) -> anyhow::Result<()> {
        let ctx = Ctx::plain(&self.access, &self.caller);
        let r = tools::call(&ctx, tool, args.as_object().cloned())
            .await
            .ok_or_else(|| anyhow::anyhow!("no tool {tool}"))?;
        anyhow::ensure!(r.is_error != Some(true), "{tool} failed: {:?}", r.structured_content);
        Ok(())
    }
}
