//! The README and the pages under docs/ tell the truth: every example in them is executed, or
//! parsed by what would read it, and every relative link leads somewhere.
//!
//! Every fenced block says what it is in its info string, and `every_block_says_what_it_is`
//! refuses one that does not, so nothing is shown that no test looks at unless it says so:
//!
//! | info string | what it is | what the tests do |
//! |---|---|---|
//! | `json5` | a config file | load it with the real loader (`config::parse`); `"<…>"` stands for a value of its kind |
//! | `json tool=NAME` | a tool's arguments | check them against the tool's input schema and call the tool on a real server |
//! | `json mcp` | a host's `mcpServers` entry | parse it; a stdio entry's command line is parsed by the binary, an HTTP one names `/mcp` |
//! | `json script` | a scripted agent's rules | run `sessions-mcp agent --script` with it on a request its first rule matches |
//! | `json protocol` | runner protocol lines | parse each as JSON (`[…]` and `{…}` stand for any array and object) |
//! | `sh` | commands | each `sessions-mcp …` is parsed by the binary (`--help` appended: its subcommand and flags exist); see below for the rest |
//! | `sh norun` | commands that need what a test does not have (a host, the network, root, a build with the `bench` feature, a later release) | not run; the checks below still apply |
//! | `json output`, `text output` | an answer as it came | the README's spawn example is compared with a fresh run; others are shown only |
//! | `text` | a format or a layout | shown only |
//!
//! In every `sh` block, a path into the repository (a word whose first component is a tracked
//! top-level file or directory other than `target/`) must exist, and `cargo`'s `--features`,
//! `--bench`, `--profile` and `--test it <module>::` must name what Cargo.toml and tests/ have.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Client, TestEnv, assert_valid, schema_dir};
use serde_json::{Value, json};

const TOOLS: [&str; 6] =
    ["sessions_list", "sessions_history", "agents_list", "sessions_send", "sessions_spawn", "subagents"];

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn readme() -> String {
    read("README.md")
}

/// README.md and every page under docs/, by path from the repository's root.
fn pages() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(repo("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    std::iter::once("README.md".to_string()).chain(docs).collect()
}

/// One fenced block of a page.
struct Block {
    page: String,
    line: usize,
    info: String,
    body: String,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{}", self.page, self.line)
    }
}

fn blocks_of(page: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(info) = line.strip_prefix("```") else { continue };
        let body: Vec<&str> = lines.by_ref().map(|(_, l)| l).take_while(|l| !l.starts_with("```")).collect();
        out.push(Block { page: page.to_string(), line: n + 1, info: info.trim().to_string(), body: body.join("\n") });
    }
    out
}

fn blocks() -> Vec<Block> {
    pages().iter().flat_map(|p| blocks_of(p, &read(p))).collect()
}

fn blocks_tagged(info: &str) -> Vec<Block> {
    blocks().into_iter().filter(|b| b.info == info).collect()
}

/// The `json tool=NAME` blocks, in page order: (tool, arguments, where).
fn tool_examples() -> Vec<(String, Value, String)> {
    blocks()
        .into_iter()
        .filter_map(|b| {
            let tool = b.info.strip_prefix("json tool=")?.to_string();
            let args = serde_json::from_str(&b.body).unwrap_or_else(|e| panic!("{}: {e}", b.at()));
            Some((tool, args, b.at()))
        })
        .collect()
}

#[test]
fn every_block_says_what_it_is() {
    let known =
        ["json5", "json mcp", "json script", "json protocol", "sh", "sh norun", "json output", "text output", "text"];
    for b in blocks() {
        let tool = b.info.strip_prefix("json tool=");
        assert!(
            known.contains(&b.info.as_str()) || tool.is_some_and(|t| TOOLS.contains(&t)),
            "{}: a block tagged {:?}; tag it as one of {known:?} or `json tool=<one of {TOOLS:?}>` (tests/it/readme.rs)",
            b.at(),
            b.info
        );
    }
}

/// Every config example loads as it is written, and every agent one of them lets an agent spawn
/// is an agent it configures (the allowAgents omission of an earlier README), with its preset's or
/// its own runner.
#[test]
fn config_examples_load_and_their_spawnable_agents_exist() {
    let examples = blocks_tagged("json5");
    assert!(examples.len() >= 10, "{} json5 blocks", examples.len());
    assert!(examples.iter().any(|b| b.page == "README.md"), "the README shows a config");
    // A placeholder (`"<hex sha256 of the token>"`) stands for a value of its kind.
    let placeholder = regex::Regex::new(r#""<[^">]*>""#).unwrap();
    for b in examples {
        let text = placeholder.replace_all(&b.body, |m: &regex::Captures| {
            if m[0].contains("sha256") { format!("\"{}\"", "a".repeat(64)) } else { "\"x\"".to_string() }
        });
        let (config, _) = sessions_mcp::config::parse(&text).unwrap_or_else(|e| panic!("{}: {e:?}\n{text}", b.at()));
        for agent in config.configured_agents() {
            let (_, allowed) = sessions_mcp::policy::spawnable(&config, &agent);
            for id in allowed {
                assert!(
                    config.is_configured(&id),
                    "{}: {agent} may spawn {id}, which the example does not configure",
                    b.at()
                );
            }
        }
        // An agent given a runner is there to be run: the default agent (the one a host's
        // session is) may spawn it.
        let (_, reachable) = sessions_mcp::policy::spawnable(&config, &config.default_agent());
        for entry in config.agents.list.iter().filter(|a| a.runner.is_some()) {
            let id = sessions_mcp::keys::AgentId::parse(&entry.id).unwrap();
            assert!(
                reachable.contains(&id),
                "{}: agent {id} has a runner but the default agent may not spawn it",
                b.at()
            );
        }
    }
}

#[test]
fn tool_examples_conform_to_the_input_schemas_and_run() {
    let examples = tool_examples();
    for name in TOOLS {
        assert!(examples.iter().any(|(t, _, _)| t == name), "the README or docs/TOOLS.md has an example for {name}");
    }
    let env = TestEnv::with_config("{tools: {sessions: {visibility: 'agent'}}}");
    env.seed(json!({"sessions": [{"key": "agent:main:cron:nightly"}]}));
    let mut c = env.serve(None);
    for (tool, args, at) in &examples {
        assert_valid(&schema_dir().join(format!("{tool}.input.json")), args);
        let result = c.call(tool, args.clone());
        let status = result["status"].as_str().unwrap();
        assert_ne!(status, "invalid", "{at}: the example for {tool} is invalid: {result}");
        match tool.as_str() {
            "sessions_spawn" | "sessions_send" => assert_eq!(status, "accepted", "{at}: {result}"),
            _ => assert_eq!(status, "ok", "{at}: {tool}: {result}"),
        }
    }
}

/// The binary parses `args` (a subcommand and its flags) without running anything: `--help`
/// after them prints the help only once everything before it was accepted.
fn assert_the_binary_parses(args: &[String], at: &str) {
    let out = Command::new(common::bin())
        .args(args)
        .arg("--help")
        .env_remove("SESSIONS_MCP_CONFIG")
        .env_remove("SESSIONS_MCP_STATE_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{at}: sessions-mcp {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn host_config_examples_start_this_server() {
    let examples = blocks_tagged("json mcp");
    assert!(examples.len() >= 2, "{} json mcp blocks", examples.len());
    for b in examples {
        let config: Value = serde_json::from_str(&b.body).unwrap_or_else(|e| panic!("{}: {e}", b.at()));
        let servers = config["mcpServers"].as_object().unwrap_or_else(|| panic!("{}: no mcpServers", b.at()));
        for (name, entry) in servers {
            let at = format!("{} ({name})", b.at());
            if let Some(url) = entry["url"].as_str() {
                assert!(url.ends_with("/mcp"), "{at}: {url}");
                continue;
            }
            assert_eq!(entry["command"], "sessions-mcp", "{at}");
            let args: Vec<String> =
                entry["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
            assert_the_binary_parses(&args, &at);
        }
    }
}

#[test]
fn scripted_agent_examples_answer_by_their_first_rule() {
    let examples = blocks_tagged("json script");
    assert!(!examples.is_empty());
    let dir = tempfile::tempdir().unwrap();
    for b in examples {
        let script: Value = serde_json::from_str(&b.body).unwrap_or_else(|e| panic!("{}: {e}", b.at()));
        let rule = &script["rules"][0];
        let path = dir.path().join("script.json");
        std::fs::write(&path, &b.body).unwrap();
        let request = json!({"type": "run", "protocol": 1, "runId": "r1", "sessionKey": "agent:main:main",
            "mode": rule["match"]["mode"], "input": {"role": "user", "content": rule["match"]["input"]}});
        let mut child = Command::new(common::bin())
            .args(["agent", "--script"])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        writeln!(child.stdin.take().unwrap(), "{request}").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}: {}", b.at(), String::from_utf8_lossy(&out.stderr));
        let last: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
        assert_eq!((&last["type"], &last["text"]), (&json!("final"), &rule["reply"]), "{}", b.at());
    }
}

#[test]
fn protocol_examples_are_json_lines() {
    let examples = blocks_tagged("json protocol");
    assert!(examples.len() >= 5, "{} json protocol blocks", examples.len());
    for b in examples {
        // `[…]` and `{…}` stand for any array and object.
        let body = b.body.replace("[…]", "[]").replace("{…}", "{}");
        // A block is one message over several lines, or one message per line.
        if serde_json::from_str::<Value>(&body).is_ok() {
            continue;
        }
        for line in body.lines() {
            let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: {e}: {line}", b.at()));
            assert!(value["type"].is_string(), "{}: {line}", b.at());
        }
    }
}

/// A block's commands: its lines joined where a quote or a trailing `\` continues them, split into
/// words as the shell would (comments dropped), then at `&&`, `||`, `|` and `;`.
fn commands(body: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in body.lines() {
        pending.push_str(line.strip_suffix('\\').unwrap_or(line));
        pending.push('\n');
        if line.ends_with('\\') {
            continue;
        }
        let Some(words) = shlex::split(&pending) else { continue };
        pending.clear();
        let words = words.into_iter().map(|w| w.trim_start_matches('(').trim_end_matches(')').to_string());
        let mut command = Vec::new();
        for word in words {
            if ["&&", "||", "|", ";"].contains(&word.as_str()) {
                out.push(std::mem::take(&mut command));
            } else if !(command.is_empty() && is_assignment(&word)) {
                command.push(word);
            }
        }
        out.push(command);
    }
    assert!(pending.trim().is_empty(), "an unterminated command: {pending}");
    out.retain(|c| !c.is_empty());
    out
}

/// `NAME=value` before a command sets its environment.
fn is_assignment(word: &str) -> bool {
    word.split_once('=')
        .is_some_and(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
}

/// Checks the words of a `cargo …` command against Cargo.toml and tests/.
fn assert_cargo_names_exist(words: &[String], at: &str) {
    let manifest = read("Cargo.toml");
    for pair in words.windows(2) {
        let value = pair[1].as_str();
        match pair[0].as_str() {
            "--features" => assert!(manifest.contains(&format!("\n{value} = [")), "{at}: no feature {value}"),
            "--bench" => assert!(repo(&format!("benches/{value}.rs")).exists(), "{at}: no bench {value}"),
            "--profile" => assert!(manifest.contains(&format!("[profile.{value}]")), "{at}: no profile {value}"),
            _ => {}
        }
    }
    if let Some(i) = words.iter().position(|w| w == "--test") {
        assert_eq!(words.get(i + 1).map(String::as_str), Some("it"), "{at}: the black-box tests are `--test it`");
        if let Some(module) = words.get(i + 2).and_then(|w| w.split("::").next()).filter(|m| !m.starts_with('-')) {
            assert!(repo(&format!("tests/it/{module}.rs")).exists(), "{at}: no test module {module}");
        }
    }
}

/// A word naming a path into the repository (its first component is tracked and not `target`).
fn repo_path(word: &str, top_level: &BTreeSet<String>) -> Option<String> {
    let path = word.strip_prefix("./").unwrap_or(word);
    let first = path.split('/').next()?;
    (path.contains('/')
        && !path.contains('$')
        && !path.contains("://")
        && top_level.contains(first)
        && first != "target")
        .then(|| path.to_string())
}

#[test]
fn shell_examples_name_real_subcommands_flags_and_files() {
    let top_level: BTreeSet<String> =
        std::fs::read_dir(repo(".")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    let mut parsed = 0;
    for b in blocks().into_iter().filter(|b| b.info == "sh" || b.info == "sh norun") {
        for words in commands(&b.body) {
            let at = format!("{}: {}", b.at(), words.join(" "));
            for path in words.iter().filter_map(|w| repo_path(w, &top_level)) {
                assert!(repo(&path).exists(), "{at}: {path} does not exist");
            }
            let program = words[0].as_str();
            if program == "cargo" {
                assert_cargo_names_exist(&words, &at);
            }
            if b.info == "sh" && (program == "sessions-mcp" || program.ends_with("/sessions-mcp")) {
                assert_the_binary_parses(&words[1..], &at);
                parsed += 1;
            }
        }
    }
    assert!(parsed >= 15, "{parsed} sessions-mcp commands parsed");
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (outside code blocks), with GitHub's `-1`, `-2` for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !in_code) else { continue };
        let base = anchor(heading.trim_start_matches('#'));
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// The relative links and images of a page (outside code blocks).
fn links(text: &str) -> Vec<String> {
    let link = regex::Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code {
            out.extend(
                link.captures_iter(line)
                    .map(|c| c[1].to_string())
                    .filter(|l| !l.contains("://") && !l.starts_with("mailto:")),
            );
        }
    }
    out
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading_that_exist() {
    let mut checked = 0;
    for page in pages() {
        let dir = Path::new(&page).parent().unwrap();
        for target in links(&read(&page)) {
            let (file, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() { PathBuf::from(&page) } else { dir.join(file) };
            let full = repo(path.to_str().unwrap());
            assert!(full.exists(), "{page}: link {target}: {} does not exist", path.display());
            if !fragment.is_empty() {
                let text = std::fs::read_to_string(&full).unwrap();
                assert!(
                    anchors(&text).contains(fragment),
                    "{page}: link {target}: no heading #{fragment} in {}",
                    path.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 50, "{checked} links");
}

/// What the README is: short, the user's first five minutes first, every page reachable, and its
/// test command the one CI runs; its last line proves the crate's name to the MCP registry.
#[test]
fn the_readme_starts_with_the_user_and_reaches_every_page() {
    let text = readme();
    assert!(text.lines().count() <= 250, "README: {} lines", text.lines().count());
    let headings: Vec<&str> = text.lines().filter(|l| l.starts_with("## ")).collect();
    assert_eq!(&headings[..3], ["## Install", "## Add it to your host", "## Spawn a sub-agent"]);
    for page in pages().iter().skip(1) {
        let name = page.strip_prefix("docs/").unwrap();
        assert!(text.contains(&format!("]({page})")), "the README links {page}");
        assert!(!read(page).trim().is_empty(), "{name} is empty");
    }
    let test_it = &text[text.find("## Test it").expect("a Test it section")..];
    assert!(test_it.contains("```sh\ncargo test\n```"), "the README's test command");
    let ci = read(".ci/run");
    let section = &ci[ci.find("section \"test (the README's test command)\"").unwrap()..];
    let command = section.lines().find(|l| l.starts_with("cargo test")).unwrap();
    assert_eq!(command, "cargo test --locked --no-fail-fast", "CI runs the README's test command");
    let server: Value = serde_json::from_str(&read("server.json")).unwrap();
    let last = text.lines().last().unwrap();
    assert_eq!(last, format!("mcp-name: {}", server["name"].as_str().unwrap()));
}

/// Ids and times that differ between runs.
fn normalised(text: &str) -> String {
    let uuid = regex::Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap();
    let runtime = regex::Regex::new(r"runtime \d+s").unwrap();
    runtime.replace_all(&uuid.replace_all(text, "<uuid>"), "runtime <n>s").into_owned()
}

/// The README's spawn and wait, run as a user would with no config: a Claude Code (the stand-in
/// of `fixtures/agents/readme-claude`) found on PATH, the server started in the user's project.
/// What comes back is what the README shows, ids and times aside.
#[test]
fn the_readmes_spawn_example_answers_what_the_readme_shows() {
    let text = readme();
    let examples = blocks_of("README.md", &text);
    let tool_args = |tool: &str| {
        let b = examples.iter().find(|b| b.info == format!("json tool={tool}")).unwrap();
        serde_json::from_str::<Value>(&b.body).unwrap()
    };
    let shown = |info: &str| examples.iter().find(|b| b.info == info).unwrap().body.clone();
    let env = TestEnv::new();
    let project = tempfile::tempdir().unwrap();
    let fixture = repo("fixtures/agents/readme-claude");
    let mut cmd = env.serve_command(None, &[("PATH", fixture.to_str().unwrap()), ("SESSIONS_MCP_DISCOVERY", "path")]);
    cmd.current_dir(project.path());
    let mut c = Client::start(cmd);
    let spawned = c.call("sessions_spawn", tool_args("sessions_spawn"));
    assert_eq!(spawned["status"], "accepted", "{spawned}");
    assert_eq!(spawned["workspace"]["mode"], "project", "{spawned}");
    let mut answer = c.call("subagents", tool_args("subagents"));
    answer["waitedMs"] = json!(0);
    let mut readme_answer: Value = serde_json::from_str(&shown("json output")).unwrap();
    readme_answer["waitedMs"] = json!(0);
    assert_eq!(normalised(&answer.to_string()), normalised(&readme_answer.to_string()));
    assert_eq!(normalised(answer["finished"][0]["outcome"].as_str().unwrap()), normalised(&shown("text output")));
    c.close();
}

fn shipped_mcp_json() -> Value {
    serde_json::from_str(&read("mcp.json")).unwrap()
}

#[test]
fn readme_shows_the_shipped_mcp_json() {
    let shown =
        blocks_of("README.md", &readme()).into_iter().find(|b| b.info == "json mcp").expect("README shows mcp.json");
    assert_eq!(serde_json::from_str::<Value>(&shown.body).unwrap(), shipped_mcp_json());
}

#[test]
fn mcp_json_starts_a_working_server() {
    let config = shipped_mcp_json();
    let entry = &config["mcpServers"]["sessions"];
    assert_eq!(entry["command"], "sessions-mcp");
    let env = TestEnv::new();
    // A host runs `command` from PATH; point PATH at the built binary's directory.
    let bin_dir = Path::new(common::bin()).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("sessions-mcp");
    cmd.env("PATH", &path).env("SESSIONS_MCP_STATE_DIR", env.state_dir()).env_remove("SESSIONS_MCP_TOKEN");
    for arg in entry["args"].as_array().unwrap() {
        cmd.arg(arg.as_str().unwrap());
    }
    for (k, v) in entry["env"].as_object().unwrap() {
        cmd.env(k, v.as_str().unwrap());
    }
    let mut client = Client::start(cmd);
    let tools = client.request("tools/list", json!({}));
    assert_eq!(tools["result"]["tools"].as_array().unwrap().len(), 6);
    assert_eq!(client.call("sessions_list", json!({}))["sessions"][0]["key"], "main");
    client.close();
}
