//! Real agents on first use (issue 35), black-box with fake agent CLIs on PATH: discovery makes the
//! CLIs a user has into agents with their presets' flags, an unconfigured `main` runs the first one,
//! and with none found every answer says that only the built-in echo agent exists. A runner block
//! that cannot work, and a CLI that is not logged in, fail in one line that says what to do; doctor
//! shows each runner expanded and flags the first.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{Client, TestEnv};
use serde_json::{Value, json};

/// A fake `claude`: `--version` prints a version; `auth status` says it is logged in (not, when
/// `answer` is a not-logged-in error); otherwise it appends its arguments and working
/// directory to `starts.log` beside it, reads the stream-json user message and answers with the
/// first line of the README.md of its working directory (as `result`, `usage`, a session id).
/// It calls tools by absolute path: the server's PATH in these tests holds the fakes only.
/// `answer` replaces the `result` line (a not-logged-in error, say).
fn fake_claude(dir: &Path, answer: Option<&str>) -> PathBuf {
    let log = dir.join("starts.log");
    let result = answer.map(String::from).unwrap_or_else(|| {
        r#"{"type":"result","subtype":"success","is_error":false,"result":"CLAUDE read: $first","session_id":"fake-1","total_cost_usd":0.001,"usage":{"input_tokens":5,"output_tokens":3}}"#
            .to_string()
    });
    let logged_in = !answer.is_some_and(|a| a.contains("Not logged in"));
    let body = format!(
        r#"#!/bin/sh
if [ "$1" = "--version" ]; then echo "2.1.999 (Claude Code)"; exit 0; fi
if [ "$1" = "auth" ]; then echo '{{"loggedIn": {logged_in}, "authMethod": "claude.ai"}}'; exit 0; fi
{{ printf 'cwd=%s args=' "$(pwd)"; printf '%s' "$*" | /usr/bin/tr '\n' ' '; echo; }} >> '{log}'
read -r message
first=$(/usr/bin/head -n 1 README.md 2>/dev/null | /usr/bin/tr -d '"\\')
echo '{{"type":"system","subtype":"init","session_id":"fake-1","model":"fake-model"}}'
printf '%s\n' "{result}"
"#,
        log = log.display(),
        result = result.replace('"', "\\\""),
    );
    let path = dir.join("claude");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A `serve` that discovers the agents on `path` (and nothing else).
fn serve_discovering(env: &TestEnv, path: &Path) -> Client {
    env.serve_with(None, &[("PATH", path.to_str().unwrap()), ("SESSIONS_MCP_DISCOVERY", "path")])
}

/// [`serve_discovering`], started in `project` as a host starts it in the user's project.
fn serve_in(env: &TestEnv, path: &Path, project: &Path) -> Client {
    let mut cmd = env.serve_command(None, &[("PATH", path.to_str().unwrap()), ("SESSIONS_MCP_DISCOVERY", "path")]);
    cmd.current_dir(project);
    Client::start(cmd)
}

/// The working directories the fake CLI's starts were in, in order.
fn start_dirs(bin: &Path) -> Vec<String> {
    let log = std::fs::read_to_string(bin.join("starts.log")).unwrap_or_default();
    log.lines().map(|l| l.strip_prefix("cwd=").unwrap_or(l).split(" args=").next().unwrap().to_string()).collect()
}

fn outcome(c: &mut Client, key: &str) -> String {
    let w = c.call("subagents", json!({"action": "wait", "childSessionKeys": [key], "timeoutSeconds": 30}));
    assert_eq!(w["status"], "ok", "{w}");
    w["finished"][0]["outcome"].as_str().unwrap_or_else(|| panic!("the child reported: {w}")).to_string()
}

fn spawn(c: &mut Client, args: Value) -> Value {
    let r = c.call("sessions_spawn", args);
    assert_eq!(r["status"], "accepted", "{r}");
    r
}

#[test]
fn with_no_agent_cli_on_path_every_answer_says_only_the_echo_agent_exists() {
    let env = TestEnv::new();
    let empty = tempfile::tempdir().unwrap();
    let mut c = serve_discovering(&env, empty.path());
    let agents = c.call("agents_list", json!({}));
    assert_eq!(agents["agents"].as_array().map(Vec::len), Some(1), "{agents}");
    assert_eq!(agents["agents"][0]["runner"], "echo", "{agents}");
    assert!(agents["note"].as_str().unwrap().contains("no real agent is configured"), "{agents}");
    let r = spawn(&mut c, json!({"task": "Read README.md and summarise it"}));
    assert!(r["warning"].as_str().unwrap().starts_with("no real agent is configured"), "{r}");
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    assert!(
        text.contains("\nWarning: no real agent is configured, so the built-in echo agent runs sub-agents here"),
        "{text}"
    );
    c.close();
}

#[test]
fn a_claude_on_path_becomes_an_agent_and_an_unconfigured_main_runs_it_with_the_presets_flags() {
    let env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    fake_claude(bin.path(), None);
    let mut c = serve_discovering(&env, bin.path());
    let agents = c.call("agents_list", json!({}));
    let ids: Vec<&str> = agents["agents"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["main", "claude"], "the discovered CLI may be spawned with no allowAgents: {agents}");
    assert_eq!(agents["agents"][0]["runner"], "claude", "main runs it: {agents}");
    let claude = &agents["agents"][1];
    assert_eq!(
        (&claude["discovered"], &claude["available"], &claude["version"]),
        (&json!(true), &json!(true), &json!("2.1.999 (Claude Code)")),
        "{agents}"
    );
    assert!(agents.get("note").is_none(), "a real agent exists: {agents}");

    let r = spawn(&mut c, json!({"task": "Read README.md and summarise it"}));
    assert!(r.get("warning").is_none(), "{r}");
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    assert!(text.starts_with("Status: completed successfully\nResult: CLAUDE read: "), "{text}");
    assert!(!text.contains("Warning:"), "{text}");
    let starts = std::fs::read_to_string(bin.path().join("starts.log")).unwrap();
    let first = starts.lines().next().unwrap();
    for flag in
        ["-p --input-format stream-json --output-format stream-json --verbose", "--permission-prompt-tool stdio"]
    {
        assert!(first.contains(flag), "{flag}: {first}");
    }
    assert!(!first.contains("dangerously") && !first.contains("bypassPermissions"), "no bypass: {first}");

    let by_id = spawn(&mut c, json!({"task": "again", "agentId": "claude"}));
    assert!(outcome(&mut c, by_id["childSessionKey"].as_str().unwrap()).contains("Result: CLAUDE read: "));
    c.close();
}

/// A child of a fake Claude Code whose answer ends with a Notes section, spawned and waited for
/// with `agents.defaults.subagents.announceStep` as given: its announce and the CLI's start log.
fn cli_child_with_notes(announce_step: bool) -> (String, String) {
    let mut env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    let answer = r#"{"type":"result","subtype":"success","is_error":false,"result":"Summary: the README has 3 lines\n\n**Notes:** read README.md; nothing is left; results are in this answer","session_id":"fake-1","usage":{"input_tokens":5,"output_tokens":3}}"#;
    let claude = fake_claude(bin.path(), Some(answer));
    let runner = json!({"preset": "claude", "command": claude.to_str().unwrap()});
    let subagents = json!({"announceStep": announce_step});
    env.set_config(
        &json!({"agents": {"defaults": {"subagents": subagents}, "list": [{"id": "main", "runner": runner}]}})
            .to_string(),
    );
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "Read README.md and summarise it"}));
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    c.close();
    (text, std::fs::read_to_string(bin.path().join("starts.log")).unwrap())
}

/// One line per start in the fake CLI's log (the system prompt in its arguments adds lines).
fn starts_in(log: &str) -> usize {
    log.lines().filter(|l| l.starts_with("cwd=")).count()
}

/// Issue 35, point 4: a CLI child is started once for its task; its notes come from the Notes
/// section its sub-agent context asked it to end its answer with, not from a second start for a
/// Notes step (before: two starts, the Result kept the section, and the Notes line was the whole
/// answer again).
#[test]
fn a_cli_child_is_started_once_and_its_notes_are_the_notes_section_of_its_answer() {
    let (text, starts) = cli_child_with_notes(true);
    assert_eq!(starts_in(&starts), 1, "one start of the CLI for the child: {starts}");
    assert!(starts.contains("End your final answer with a last section that starts on its own line with"), "{starts}");
    assert!(
        text.starts_with(
            "Status: completed successfully\nResult: Summary: the README has 3 lines\nNotes: read README.md; nothing is left; results are in this answer\nStats: "
        ),
        "{text}"
    );
}

/// With `announceStep: false` a CLI child is not asked for notes and its announce has none: its
/// answer is the Result whole.
#[test]
fn a_cli_child_without_the_announce_step_gives_no_notes_and_its_whole_answer() {
    let (text, starts) = cli_child_with_notes(false);
    assert_eq!(starts_in(&starts), 1, "{starts}");
    assert!(!starts.contains("End your final answer with"), "not asked for notes: {starts}");
    assert!(
        text.starts_with(
            "Status: completed successfully\nResult: Summary: the README has 3 lines\n\n**Notes:** read README.md; nothing is left; results are in this answer\nStats: "
        ),
        "{text}"
    );
}

#[test]
fn a_discovered_cli_child_works_in_the_users_project_and_leaves_nothing_of_ours_there() {
    let env = TestEnv::new();
    let (bin, project) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fake_claude(bin.path(), None);
    std::fs::write(project.path().join("README.md"), "# The user's project\nmore\n").unwrap();
    let project_dir = std::fs::canonicalize(project.path()).unwrap().display().to_string();
    let mut c = serve_in(&env, bin.path(), project.path());
    let r = spawn(&mut c, json!({"task": "Read README.md and summarise it"}));
    assert_eq!(r["workspace"], json!({"mode": "project", "path": project_dir}), "{r}");
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    assert!(text.contains("Result: CLAUDE read: # The user's project\n"), "it read the project's file: {text}");
    assert!(start_dirs(bin.path()).iter().all(|d| *d == project_dir), "{:?}", start_dirs(bin.path()));
    let left: Vec<String> = std::fs::read_dir(project.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["README.md"], "no file of ours in the project");

    let isolated = spawn(&mut c, json!({"task": "again", "workspace": "isolated"}));
    assert_eq!(isolated["workspace"], json!({"mode": "isolated"}), "{isolated}");
    let text = outcome(&mut c, isolated["childSessionKey"].as_str().unwrap());
    assert!(
        text.contains("Result: CLAUDE read: \n") || text.contains("Result: CLAUDE read:\n"),
        "no README there: {text}"
    );
    let last = start_dirs(bin.path()).pop().unwrap();
    assert!(last.ends_with("/workspaces/main"), "the agent's own workspace: {last}");
    c.close();
}

/// A project directory holding a README.md whose first line is `first`; its canonical path.
fn project_with_readme(first: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), format!("{first}\nmore\n")).unwrap();
    let path = std::fs::canonicalize(dir.path()).unwrap().display().to_string();
    (dir, path)
}

#[test]
fn a_child_works_in_the_project_its_clients_roots_name_and_follows_a_change_of_roots() {
    let env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    fake_claude(bin.path(), None);
    let (served_in, _) = project_with_readme("# where serve was started");
    let (first, first_dir) = project_with_readme("# the first root");
    let (second, second_dir) = project_with_readme("# the second root");
    let mut cmd =
        env.serve_command(None, &[("PATH", bin.path().to_str().unwrap()), ("SESSIONS_MCP_DISCOVERY", "path")]);
    cmd.current_dir(served_in.path());
    let mut c = Client::start_declaring(cmd, json!({"roots": {"listChanged": true}}));
    c.set_roots(&[Path::new("/nowhere/on/this/machine"), first.path()]);

    let r = spawn(&mut c, json!({"task": "Read README.md"}));
    assert_eq!(
        r["workspace"],
        json!({"mode": "project", "path": first_dir}),
        "the first root that is a directory: {r}"
    );
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    assert!(text.contains("Result: CLAUDE read: # the first root\n"), "{text}");

    c.set_roots(&[second.path()]);
    c.request("ping", json!({}));
    let r = spawn(&mut c, json!({"task": "Read README.md"}));
    assert_eq!(r["workspace"]["path"], json!(second_dir), "asked again after list_changed: {r}");
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    assert!(text.contains("Result: CLAUDE read: # the second root\n"), "{text}");
    assert_eq!(start_dirs(bin.path()), [first_dir, second_dir]);
    c.close();
}

/// A fake `claude` that appends a line to README.md of its working directory when its task
/// says "edit", and answers with that directory; the user's `git` beside it (the server's PATH
/// holds these only, and it runs git for worktrees).
fn fake_editor(dir: &Path) {
    let body = r#"#!/bin/sh
if [ "$1" = "--version" ]; then echo "2.1.999 (Claude Code)"; exit 0; fi
read -r message
case "$message" in *edit*) echo "an edit from $(pwd)" >> README.md ;; esac
echo '{"type":"system","subtype":"init","session_id":"fake-1","model":"fake-model"}'
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"worked in $(pwd)\",\"session_id\":\"fake-1\",\"usage\":{\"input_tokens\":5,\"output_tokens\":3}}"
"#;
    let path = dir.join("claude");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let git = which::which("git").expect("git is installed");
    std::os::unix::fs::symlink(git, dir.join("git")).unwrap();
}

/// Runs git in `dir` (the test's own, with a fixed identity).
fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn worktree_children_edit_one_file_on_their_own_branches_and_a_worktree_with_work_is_kept() {
    let env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    fake_editor(bin.path());
    let (project, _) = project_with_readme("# the project");
    git(project.path(), &["init", "--quiet", "-b", "main"]);
    git(project.path(), &["add", "."]);
    git(project.path(), &["commit", "--quiet", "-m", "first"]);
    let mut c = serve_in(&env, bin.path(), project.path());

    let mut children = Vec::new();
    for (label, cleanup) in [("one", "keep"), ("two", "delete")] {
        let r = spawn(
            &mut c,
            json!({"task": "edit README.md", "label": label, "workspace": "worktree", "cleanup": cleanup}),
        );
        let branch = r["workspace"]["branch"].as_str().unwrap().to_string();
        assert!(branch.starts_with(&format!("sessions-mcp/{label}-")), "{r}");
        assert_eq!(r["workspace"]["mode"], "worktree", "{r}");
        assert!(r["workspace"].get("sharedWith").is_none(), "a worktree of its own is not shared: {r}");
        children.push((
            r["childSessionKey"].as_str().unwrap().to_string(),
            branch,
            r["workspace"]["path"].as_str().unwrap().to_string(),
        ));
    }
    for (key, branch, path) in &children {
        let text = outcome(&mut c, key);
        assert!(text.contains(&format!("Result: worked in {path}\n")), "it ran in its worktree: {text}");
        let line = format!(
            "Worktree: {path} on branch {branch}: kept (1 uncommitted file(s), 0 commit(s) not in the project's HEAD)"
        );
        assert!(text.contains(&line), "{line}\n{text}");
        let readme = std::fs::read_to_string(Path::new(path).join("README.md")).unwrap();
        assert_eq!(readme, format!("# the project\nmore\nan edit from {path}\n"), "its own edit only");
        assert_eq!(git(Path::new(path), &["branch", "--show-current"]), *branch);
    }
    let readme = std::fs::read_to_string(project.path().join("README.md")).unwrap();
    assert_eq!(readme, "# the project\nmore\n", "the project itself is untouched");
    assert_eq!(git(project.path(), &["status", "--porcelain"]), "", "nothing of ours in the project");

    // A child that changed nothing, with cleanup "delete": its worktree and branch go.
    let r =
        spawn(&mut c, json!({"task": "look around", "label": "look", "workspace": "worktree", "cleanup": "delete"}));
    let (path, branch) = (r["workspace"]["path"].as_str().unwrap(), r["workspace"]["branch"].as_str().unwrap());
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    assert!(text.contains(&format!("Worktree: {path} on branch {branch}: removed (no changes)\n")), "{text}");
    assert!(!Path::new(path).exists());
    assert!(!git(project.path(), &["branch", "--list"]).contains(branch));

    let plain = tempfile::tempdir().unwrap();
    let mut c2 = serve_in(&env, bin.path(), plain.path());
    let refused = c2.call("sessions_spawn", json!({"task": "edit", "workspace": "worktree"}));
    assert_eq!(refused["status"], "invalid", "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("is not in a git repository"), "{refused}");
    c2.close();
    c.close();
}

#[test]
fn a_claude_that_is_not_logged_in_fails_in_one_line_that_says_what_to_do() {
    let env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    let not_logged_in = r#"{"type":"result","subtype":"success","is_error":true,"result":"Not logged in · Please run /login","session_id":"fake-1"}"#;
    fake_claude(bin.path(), Some(not_logged_in));
    let mut c = serve_discovering(&env, bin.path());
    // agents_list says so as soon as the CLI has answered `claude auth status` (asked in the
    // background: a tool call never waits for a CLI).
    let claude = common::wait_until(std::time::Duration::from_secs(20), "the login answer", || {
        let agents = c.call("agents_list", json!({}));
        let claude = agents["agents"][1].clone();
        claude.get("login").is_some().then_some(claude)
    });
    assert_eq!(claude["available"], false, "{claude}");
    let login = "not logged in: run `claude` once and log in with /login, or pass ANTHROPIC_API_KEY";
    assert_eq!(claude["login"], login, "{claude}");
    assert_eq!(claude["note"], format!("claude: {login}"), "{claude}");
    let doctor =
        env.command(&["doctor"]).env("PATH", bin.path()).env("SESSIONS_MCP_DISCOVERY", "path").output().unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(said.contains(&format!("runner problem: main: {login}\n")), "{said}");
    assert!(!doctor.status.success(), "{said}");

    let r = spawn(&mut c, json!({"task": "anything"}));
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    let status = text.lines().next().unwrap();
    assert!(
        status.starts_with(
            "Status: failed: not_logged_in: Claude Code is not logged in for this agent: run `claude` and /login"
        ),
        "{text}"
    );
    assert!(!text.contains("failed: success:"), "{text}");
    c.close();
}

#[test]
fn a_stream_json_runner_without_its_flags_is_flagged_by_doctor_and_fails_each_run_saying_the_fix() {
    let mut env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    let plain = bin.path().join("plain-claude");
    std::fs::write(&plain, "#!/bin/sh\ncat >/dev/null\necho 'Here is my answer in plain text'\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.set_config(
        &json!({"agents": {"list": [{"id": "main", "runner":
            {"kind": "claude-stream-json", "command": plain.to_str().unwrap(), "args": ["-p"]}}]}})
        .to_string(),
    );
    let doctor = env.run(&["doctor"]);
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(!doctor.status.success(), "{said}");
    assert!(
        said.contains("runner problem: main: kind \"claude-stream-json\" reads JSON lines, but runner.args lack --output-format stream-json, --verbose"),
        "{said}"
    );
    let mut c = env.serve(None);
    let r = spawn(&mut c, json!({"task": "anything"}));
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    assert!(text.contains("protocol: line 1 is not JSON (kind \"claude-stream-json\" reads JSON lines"), "{text}");
    assert!(text.contains("set runner.preset \"claude\""), "{text}");
    c.close();
}

#[test]
fn doctor_shows_a_preset_expanded_under_the_agents_own_keys() {
    let mut env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    let claude = fake_claude(bin.path(), None);
    env.set_config(
        &json!({"agents": {"list": [{"id": "main", "runner":
            {"preset": "claude", "command": claude.to_str().unwrap(), "timeoutSeconds": 60,
             "env": {"passthrough": ["MY_KEY"]}}}]}})
        .to_string(),
    );
    let doctor = env.run(&["doctor"]);
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(said.contains("runner main: preset claude (configured), "), "{said}");
    assert!(said.contains("2.1.999 (Claude Code)"), "the CLI's version: {said}");
    assert!(said.contains("runner main expanded: kind claude-stream-json, args [\"-p\", \"--input-format\""), "{said}");
    assert!(said.contains("home inherit, passthrough [\"MY_KEY\"]"), "the agent's own key wins: {said}");
    assert!(said.contains("runner main login: logged in (claude.ai)\n"), "{said}");
    assert!(!said.contains("runner problem"), "{said}");
}

/// A fake `gemini` (shell builtins only: PATH holds just the fakes): `--version` prints a
/// version; otherwise it appends its arguments to `starts.log` beside it, reads the prompt from
/// stdin and prints the stream-json the real Gemini CLI printed for a plain reply
/// (`fixtures/adapters/gemini-normal.jsonl`).
fn fake_gemini(dir: &Path) -> PathBuf {
    let recorded = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/adapters/gemini-normal.jsonl");
    let recorded = std::fs::read_to_string(recorded).unwrap();
    let body = format!(
        "#!/bin/sh\nif [ \"$1\" = \"--version\" ]; then echo 0.61.0; exit 0; fi\nprintf '%s\\n' \"args=$*\" >> '{log}'\nwhile read -r line; do :; done\nwhile IFS= read -r line; do printf '%s\\n' \"$line\"; done <<'RECORDED'\n{recorded}RECORDED\n",
        log = dir.join("starts.log").display(),
    );
    let path = dir.join("gemini");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_gemini_on_path_is_discovered_after_claude_and_codex_and_a_spawn_of_it_returns_its_reply() {
    let mut env = TestEnv::new();
    // So that main may send the gemini child a second message (its resume).
    env.set_config(
        &json!({"tools": {"sessions": {"visibility": "all"}, "agentToAgent": {"enabled": true}}}).to_string(),
    );
    let bin = tempfile::tempdir().unwrap();
    fake_claude(bin.path(), None);
    let codex = bin.path().join("codex");
    std::fs::write(&codex, "#!/bin/sh\necho 'codex-cli 0.171.0'\n").unwrap();
    std::fs::set_permissions(&codex, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake_gemini(bin.path());
    let mut c = serve_discovering(&env, bin.path());
    let agents = c.call("agents_list", json!({}));
    let ids: Vec<&str> = agents["agents"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["main", "claude", "codex", "gemini"], "{agents}");
    assert_eq!(agents["agents"][0]["runner"], "claude", "main runs the first found: {agents}");
    let gemini = &agents["agents"][3];
    assert_eq!(
        (&gemini["runner"], &gemini["discovered"], &gemini["available"], &gemini["version"]),
        (&json!("gemini"), &json!(true), &json!(true), &json!("0.61.0")),
        "{agents}"
    );

    let r = spawn(&mut c, json!({"task": "Say hello", "agentId": "gemini"}));
    let key = r["childSessionKey"].as_str().unwrap();
    let text = outcome(&mut c, key);
    assert!(
        text.starts_with("Status: completed successfully\nResult: Hello from the fake Gemini API (1 contents)"),
        "{text}"
    );
    let starts = std::fs::read_to_string(bin.path().join("starts.log")).unwrap();
    let first = starts.lines().next().unwrap();
    assert!(first.contains("--output-format stream-json --skip-trust"), "{first}");
    assert!(!first.contains("--resume"), "a new session: {first}");
    assert!(!first.contains("yolo") && !first.contains("approval-mode"), "Gemini's own approvals: {first}");

    let again = c.call("sessions_send", json!({"sessionKey": key, "message": "Second turn", "timeoutSeconds": 60}));
    assert_eq!(again["status"], "ok", "{again}");
    let starts = std::fs::read_to_string(bin.path().join("starts.log")).unwrap();
    let second = starts.lines().nth(1).unwrap();
    assert!(second.contains("--resume 7d03d3f4-bf8f-48f1-806b-5f50472f3205"), "the init event's session: {second}");
    c.close();
}

/// A fake `codex`: `--version` prints a version; otherwise it logs its start beside it and answers
/// one turn in `codex exec --json`'s events.
fn fake_codex(dir: &Path) {
    let log = dir.join("codex-starts.log");
    let body = format!(
        r#"#!/bin/sh
if [ "$1" = "--version" ]; then echo "codex-cli 0.171.0"; exit 0; fi
if [ "$1" = "login" ]; then echo "Logged in using ChatGPT"; exit 0; fi
echo started >> '{log}'
/bin/cat > /dev/null
echo '{{"type":"thread.started","thread_id":"thread-1"}}'
echo '{{"type":"item.completed","item":{{"id":"item_1","type":"agent_message","text":"CODEX answered"}}}}'
echo '{{"type":"turn.completed","usage":{{"input_tokens":4,"cached_input_tokens":0,"output_tokens":2}}}}'
"#,
        log = log.display()
    );
    let path = dir.join("codex");
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// With Claude Code and Codex both installed, a spawn with no agentId from Codex (its clientInfo)
/// runs Codex, and from any other host the first found, Claude Code.
#[test]
fn a_spawn_from_a_host_whose_own_cli_is_installed_runs_that_cli() {
    let env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    fake_claude(bin.path(), None);
    fake_codex(bin.path());
    let vars = [("PATH", bin.path().to_str().unwrap()), ("SESSIONS_MCP_DISCOVERY", "path")];
    let mut from_codex = Client::start_as(env.serve_command(None, &vars), json!({}), "codex-mcp-client");
    let r = spawn(&mut from_codex, json!({"task": "work"}));
    let key = r["childSessionKey"].as_str().unwrap();
    assert!(key.starts_with("agent:codex:subagent:"), "the host's own CLI: {r}");
    assert!(outcome(&mut from_codex, key).contains("Result: CODEX answered"));
    from_codex.close();
    let mut other = Client::start_as(env.serve_command(None, &vars), json!({}), "some-ide");
    let r = spawn(&mut other, json!({"task": "work"}));
    assert!(r["childSessionKey"].as_str().unwrap().starts_with("agent:main:subagent:"), "{r}");
    assert!(outcome(&mut other, r["childSessionKey"].as_str().unwrap()).contains("Result: CLAUDE read:"));
    other.close();
}

/// A script `name` in `dir` that writes `stderr` there and exits with `code` before any output.
fn failing_cli(dir: &Path, name: &str, code: i32, stderr: &str) {
    let path = dir.join(name);
    let body = format!(
        "#!/bin/sh\nif [ \"$1\" = \"--version\" ]; then echo 1.0; exit 0; fi\necho '{stderr}' >&2\nexit {code}\n"
    );
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A CLI that exits before its first line did not start its work: the failure says so in one line
/// with what to check, and a Gemini CLI that is not signed in (its exit 41) says how to sign in.
#[test]
fn a_cli_that_exits_before_its_first_line_fails_saying_what_to_check() {
    let env = TestEnv::new();
    let bin = tempfile::tempdir().unwrap();
    failing_cli(bin.path(), "claude", 1, "boom: no such option");
    failing_cli(bin.path(), "gemini", 41, "Please set an Auth method in your settings.json");
    let mut c = serve_discovering(&env, bin.path());
    let r = spawn(&mut c, json!({"task": "anything"}));
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    let status = text.lines().next().unwrap();
    let claude = bin.path().join("claude").display().to_string();
    assert!(
        status.starts_with(&format!("Status: failed: \"{claude}\" exited with status 1 before writing any output")),
        "{text}"
    );
    assert!(status.ends_with("; stderr: boom: no such option"), "{text}");
    let r = spawn(&mut c, json!({"task": "anything", "agentId": "gemini"}));
    let text = outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    assert!(
        text.starts_with(
            "Status: failed: not_logged_in: Gemini CLI is not signed in for this agent: run `gemini` once"
        ),
        "{text}"
    );
    c.close();
}

/// Children writing one project at once is the requester's choice: the spawn's answer says how
/// many unfinished siblings already work there.
#[test]
fn a_spawn_into_a_project_that_siblings_work_in_says_so() {
    let env = TestEnv::new();
    let (bin, project) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let slow = r#"{"type":"result","subtype":"success","is_error":false,"result":"slow done","session_id":"fake-1"}"#;
    fake_claude(bin.path(), Some(slow));
    // The fake answers after 3 s, so the first child is still at work when the next spawns.
    let path = bin.path().join("claude");
    let script =
        std::fs::read_to_string(&path).unwrap().replacen("read -r message", "read -r message\n/bin/sleep 3", 1);
    std::fs::write(&path, script).unwrap();
    let mut c = serve_in(&env, bin.path(), project.path());
    let first = spawn(&mut c, json!({"task": "one"}));
    assert!(first["workspace"].get("sharedWith").is_none(), "{first}");
    let second = spawn(&mut c, json!({"task": "two"}));
    assert_eq!(second["workspace"]["sharedWith"], 1, "{second}");
    assert!(second["workspace"]["note"].as_str().unwrap().contains("may change the same files"), "{second}");
    let apart = spawn(&mut c, json!({"task": "three", "workspace": "isolated"}));
    assert_eq!(apart["workspace"], json!({"mode": "isolated"}), "{apart}");
    for r in [&first, &second, &apart] {
        outcome(&mut c, r["childSessionKey"].as_str().unwrap());
    }
    c.close();
}

/// `serve` started by a person in a terminal (stdin a TTY, under util-linux `script`): one line on
/// stderr says it is an MCP server waiting for a client, its state dir and store, the agent CLIs
/// it found and how to stop it; nothing goes to stdout. `--quiet` drops the line. Ctrl-D (end of
/// input) ends it, so no step depends on timing.
#[test]
fn serve_on_a_terminal_says_what_it_is_in_one_line_and_quiet_drops_it() {
    let script = Path::new("/usr/bin/script");
    if !script.is_file() {
        eprintln!("skipped: util-linux script is not installed (no pty to run serve in)");
        return;
    }
    let env = TestEnv::sqlite();
    let bin = tempfile::tempdir().unwrap();
    fake_claude(bin.path(), None);
    for quiet in [false, true] {
        let stderr_file = env.dir.path().join(format!("stderr-{quiet}.txt"));
        let serve = env.command(&if quiet { vec!["serve", "--quiet"] } else { vec!["serve"] });
        let words: Vec<String> = std::iter::once(serve.get_program())
            .chain(serve.get_args())
            .map(|w| format!("'{}'", w.to_str().unwrap()))
            .collect();
        let line = format!("exec {} 2>'{}'", words.join(" "), stderr_file.display());
        let mut cmd = std::process::Command::new(script);
        cmd.args(["-qec", &line, "/dev/null"]).env("SHELL", "/bin/sh");
        for (key, value) in serve.get_envs() {
            match value {
                Some(v) => cmd.env(key, v),
                None => cmd.env_remove(key),
            };
        }
        cmd.env("PATH", bin.path()).env("SESSIONS_MCP_DISCOVERY", "path");
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("script");
        let mut stdin = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut stdin, b"\x04").unwrap();
        let status = common::wait_until(std::time::Duration::from_secs(60), "serve to end at Ctrl-D", || {
            child.try_wait().unwrap()
        });
        drop(stdin);
        let mut terminal = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut terminal).unwrap();
        let stderr = std::fs::read_to_string(&stderr_file).unwrap();
        assert!(status.success(), "{status:?}: {stderr}");
        assert!(!terminal.contains("jsonrpc") && !terminal.contains("sessions-mcp"), "stdout: {terminal:?}");
        if quiet {
            assert_eq!(stderr, "", "--quiet printed: {stderr}");
            continue;
        }
        assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
        let state = env.state_dir().display().to_string();
        for needle in [
            "an MCP server on stdio, waiting for a client",
            &format!("state dir {state}"),
            &format!("store SQLite {state}/sessions.db"),
            "agent CLIs found on PATH: claude",
            "Ctrl-C stops it",
        ] {
            assert!(stderr.contains(needle), "{needle:?} missing from: {stderr}");
        }
    }
}
