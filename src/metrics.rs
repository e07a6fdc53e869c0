//! Metrics for `GET /metrics` (docs/OPERATING.md, Metrics), in the Prometheus text format through the
//! Prometheus project's own client. Two kinds: what this process measures as it goes — run
//! durations and waits to start (the runtime owner's), tool call latency (this process's
//! listeners') — kept in process-wide histograms; and what the store holds, read at each scrape
//! and handed in as [`StoreCounts`]. It imports nothing of the crate, so every layer may record.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// 10 ms to ~20 min, doubling: a tool call, a model turn, a wait in the queue.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 18))
}

struct Measured {
    run_duration: Histograms,
    run_wait: Histograms,
    tool_latency: Histograms,
}

fn measured() -> &'static Measured {
    static M: OnceLock<Measured> = OnceLock::new();
    M.get_or_init(|| Measured {
        run_duration: Family::new_with_constructor(seconds),
        run_wait: Family::new_with_constructor(seconds),
        tool_latency: Family::new_with_constructor(seconds),
    })
}

/// A run ended: how long it ran, and how long it waited to start.
pub fn observe_run(agent: &str, status: &str, mode: &str, ran_s: f64, waited_s: f64) {
    let m = measured();
    let labels = vec![("agent", agent.to_string()), ("status", status.to_string()), ("mode", mode.to_string())];
    m.run_duration.get_or_create(&labels).observe(ran_s.max(0.0));
    m.run_wait
        .get_or_create(&vec![("agent", agent.to_string()), ("mode", mode.to_string())])
        .observe(waited_s.max(0.0));
}

/// A tool call was answered after `seconds`.
pub fn observe_tool(tool: &str, status: &str, seconds: f64) {
    let labels = vec![("tool", tool.to_string()), ("status", status.to_string())];
    measured().tool_latency.get_or_create(&labels).observe(seconds.max(0.0));
}

/// What the store holds at the scrape.
#[derive(Debug, Clone, Default)]
pub struct StoreCounts {
    /// (status, agent, runs).
    pub runs: Vec<(String, String, i64)>,
    /// (status, kind, deliveries).
    pub deliveries: Vec<(String, String, i64)>,
    /// (agent, input tokens, output tokens, cost in USD).
    pub usage: Vec<(String, i64, i64, f64)>,
    /// (agent, sessions) of sessions that are not deleted.
    pub sessions: Vec<(String, i64)>,
}

/// The `agent` label of every agent id no config names: all of them are one series, so that ids
/// a store holds (an agent since removed, a session made before bridges were checked) never
/// multiply the series. No agent id starts with `_`.
pub const OTHER_AGENT: &str = "_other";

/// `agent` as a label value: itself when `known`, else [`OTHER_AGENT`].
pub fn agent_label(agent: &str, known: impl Fn(&str) -> bool) -> String {
    if known(agent) { agent.to_string() } else { OTHER_AGENT.to_string() }
}

impl StoreCounts {
    /// These counts with the agents `known` does not name summed under [`OTHER_AGENT`].
    pub fn by_known_agents(self, known: impl Fn(&str) -> bool) -> StoreCounts {
        let label = |agent: &str| agent_label(agent, &known);
        let mut runs = BTreeMap::<(String, String), i64>::new();
        for (status, agent, n) in self.runs {
            *runs.entry((status, label(&agent))).or_default() += n;
        }
        let mut usage = BTreeMap::<String, (i64, i64, f64)>::new();
        for (agent, tokens_in, tokens_out, usd) in self.usage {
            let sum = usage.entry(label(&agent)).or_default();
            *sum = (sum.0 + tokens_in, sum.1 + tokens_out, sum.2 + usd);
        }
        let mut sessions = BTreeMap::<String, i64>::new();
        for (agent, n) in self.sessions {
            *sessions.entry(label(&agent)).or_default() += n;
        }
        StoreCounts {
            runs: runs.into_iter().map(|((status, agent), n)| (status, agent, n)).collect(),
            deliveries: self.deliveries,
            usage: usage.into_iter().map(|(agent, (i, o, usd))| (agent, i, o, usd)).collect(),
            sessions: sessions.into_iter().collect(),
        }
    }
}

fn gauges(registry: &mut Registry, name: &str, help: &str, rows: impl IntoIterator<Item = (Labels, i64)>) {
    let family = Family::<Labels, Gauge>::default();
    for (labels, value) in rows {
        family.get_or_create(&labels).set(value);
    }
    registry.register(name, help, family);
}

/// The exposition: the store's counts and this process's histograms, prefixed `sessions_mcp_`.
pub fn render(counts: &StoreCounts) -> String {
    let mut registry = Registry::with_prefix("sessions_mcp");
    let runs = counts.runs.iter().map(|(s, a, n)| (vec![("status", s.clone()), ("agent", a.clone())], *n));
    gauges(&mut registry, "runs", "Runs in the store by status and agent", runs);
    let depth = Gauge::<i64>::default();
    depth.set(counts.runs.iter().filter(|(s, _, _)| s == "queued").map(|(_, _, n)| n).sum());
    registry.register("queue_depth", "Runs waiting for a slot", depth);
    let deliveries = counts.deliveries.iter().map(|(s, k, n)| (vec![("status", s.clone()), ("kind", k.clone())], *n));
    gauges(&mut registry, "deliveries", "Deliveries in the ledger by status and kind", deliveries);
    let tokens = counts.usage.iter().flat_map(|(a, tin, tout, _)| {
        [
            (vec![("agent", a.clone()), ("direction", "input".into())], *tin),
            (vec![("agent", a.clone()), ("direction", "output".into())], *tout),
        ]
    });
    gauges(&mut registry, "tokens", "Tokens the agents' runs used, by agent and direction", tokens);
    let cost = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for (agent, _, _, usd) in &counts.usage {
        cost.get_or_create(&vec![("agent", agent.clone())]).set(*usd);
    }
    registry.register("cost_usd", "Cost the agents reported, by agent", cost);
    let sessions = counts.sessions.iter().map(|(a, n)| (vec![("agent", a.clone())], *n));
    gauges(&mut registry, "sessions", "Sessions by agent (deleted ones left out)", sessions);
    let m = measured();
    registry.register("run_duration_seconds", "How long runs ran (this process's)", m.run_duration.clone());
    registry.register("run_wait_seconds", "How long runs waited to start (this process's)", m.run_wait.clone());
    registry.register("tool_call_duration_seconds", "Tool call latency (this process's)", m.tool_latency.clone());
    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String does not fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_family_with_its_labels() {
        observe_tool("sessions_list", "ok", 0.02);
        observe_run("main", "ok", "send", 1.5, 0.1);
        let counts = StoreCounts {
            runs: vec![("queued".into(), "main".into(), 2), ("ok".into(), "main".into(), 5)],
            deliveries: vec![("failed".into(), "announce".into(), 1)],
            usage: vec![("main".into(), 120, 30, 0.25)],
            sessions: vec![("main".into(), 3)],
        };
        let text = render(&counts);
        for line in [
            "sessions_mcp_runs{status=\"ok\",agent=\"main\"} 5",
            "sessions_mcp_queue_depth 2",
            "sessions_mcp_deliveries{status=\"failed\",kind=\"announce\"} 1",
            "sessions_mcp_tokens{agent=\"main\",direction=\"output\"} 30",
            "sessions_mcp_cost_usd{agent=\"main\"} 0.25",
            "sessions_mcp_sessions{agent=\"main\"} 3",
            "sessions_mcp_tool_call_duration_seconds_count{tool=\"sessions_list\",status=\"ok\"} 1",
            "sessions_mcp_run_duration_seconds_count{agent=\"main\",status=\"ok\",mode=\"send\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn agents_no_config_names_are_summed_under_one_label() {
        let counts = StoreCounts {
            runs: vec![
                ("ok".into(), "main".into(), 2),
                ("ok".into(), "ghost-1".into(), 1),
                ("ok".into(), "ghost-2".into(), 4),
            ],
            deliveries: vec![],
            usage: vec![("ghost-1".into(), 10, 1, 0.5), ("ghost-2".into(), 20, 2, 0.25), ("main".into(), 5, 5, 0.0)],
            sessions: vec![("ghost-1".into(), 1), ("ghost-2".into(), 3), ("main".into(), 1)],
        }
        .by_known_agents(|a| a == "main");
        assert_eq!(counts.runs, [("ok".into(), "_other".into(), 5), ("ok".into(), "main".into(), 2)]);
        assert_eq!(counts.usage, [("_other".into(), 30, 3, 0.75), ("main".into(), 5, 5, 0.0)]);
        assert_eq!(counts.sessions, [("_other".into(), 4), ("main".into(), 1)]);
    }
}
