//! Criterion micro-benchmarks: sessions_list and sessions_history in-process at a few store sizes
//! (the stores of `sessions-mcp bench`), key parsing, and the send-policy and visibility decisions.
//! `cargo bench --bench tools`; whole-process figures come from `sessions-mcp bench`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::json;

use sessions_mcp::bench::in_process::World;
use sessions_mcp::bench::worlds::{Worlds, history_key};
use sessions_mcp::config::key_scope;
use sessions_mcp::config::{Config, SendPolicyConfig, Visibility};
use sessions_mcp::keys::{self, AgentId, ChatType, SessionKey};
use sessions_mcp::policy::{
    Action, SendTarget, VisibilityFacts, VisibilityRules, check_visibility, resolve_send_policy,
};

fn tools(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("tokio runtime");
    let mut worlds = Worlds::new().expect("a temporary directory for the stores");
    let mut list = c.benchmark_group("sessions_list limit 50 messageLimit 5");
    for n in [100, 1_000, 10_000] {
        let world = World::open(&worlds.sessions(n).expect("generate the store")).expect("open the store");
        let args = json!({"limit": 50, "messageLimit": 5});
        list.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| rt.block_on(world.call("sessions_list", args.clone())).expect("sessions_list"))
        });
    }
    list.finish();
    let sizes = [1_000, 10_000, 100_000];
    let world = World::open(&worlds.histories(&sizes).expect("generate the store")).expect("open the store");
    let mut history = c.benchmark_group("sessions_history limit 200");
    for n in sizes {
        let args = json!({"sessionKey": history_key(n), "limit": 200});
        history.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| rt.block_on(world.call("sessions_history", args.clone())).expect("sessions_history"))
        });
    }
    history.finish();
}

fn key_parsing(c: &mut Criterion) {
    let scope = key_scope(&Config::default(), &AgentId::main());
    let inputs = [
        "main",
        "agent:main:discord:group:1234567890",
        "agent:ops:subagent:6f1c2b9e-8f0a-4c51-9d55-0e7d4b1c2a3f",
        "telegram:group:-100123456",
        "6f1c2b9e-8f0a-4c51-9d55-0e7d4b1c2a3f",
    ];
    c.bench_function("parse_ref (5 inputs)", |b| {
        b.iter(|| inputs.iter().map(|i| keys::parse_ref(black_box(i), &scope).is_ok()).filter(|ok| *ok).count())
    });
}

fn policy(c: &mut Criterion) {
    let config: SendPolicyConfig = serde_json::from_value(json!({
        "default": "allow",
        "rules": [
            {"action": "deny", "match": {"channel": "discord", "chatType": "group"}},
            {"action": "deny", "match": {"keyPrefix": "cron:"}},
            {"action": "allow", "match": {"rawKeyPrefix": "agent:main:telegram:"}},
            {"action": "deny", "match": {"channel": "whatsapp"}},
        ],
    }))
    .expect("a send policy");
    let key = SessionKey::from_canonical("agent:main:telegram:group:-100123456");
    let target = SendTarget { key: &key, channel: "telegram", chat_type: Some(ChatType::Group) };
    c.bench_function("send policy decision (4 rules)", |b| {
        b.iter(|| resolve_send_policy(None, Some(black_box(&config)), black_box(&target)))
    });

    let mut all = Config::default();
    all.tools.sessions.visibility = Visibility::All;
    all.tools.agent_to_agent.enabled = true;
    all.tools.agent_to_agent.allow = vec!["ops*".into(), "main".into()];
    let rules = VisibilityRules::for_caller(&all, false);
    let (main, ops) = (AgentId::main(), AgentId::parse("ops").expect("agent id"));
    let (caller, other) = (SessionKey::from_canonical("agent:main:main"), SessionKey::from_canonical("agent:ops:main"));
    let facts = VisibilityFacts {
        caller_key: &caller,
        caller_agent: &main,
        target_key: &other,
        target_agent: &ops,
        target_in_tree: false,
    };
    c.bench_function("visibility decision (cross-agent, allow globs)", |b| {
        b.iter(|| check_visibility(Action::History, black_box(&facts), black_box(&rules)).is_ok())
    });
}

criterion_group!(benches, tools, key_parsing, policy);
criterion_main!(benches);
