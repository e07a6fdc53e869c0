//! `sessions-mcp install|uninstall <host>`: a fresh HOME and project directory per test, fake
//! `claude` and `codex` on PATH that record their arguments (the Codex fake also keeps its entry, as
//! `codex mcp add|get|remove` do), and the JSON configs of Gemini CLI and Claude Desktop read back.
//! With `SESSIONS_MCP_CLAUDE` / `SESSIONS_MCP_CODEX` the real CLIs are driven the same way.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::common;

/// A fresh HOME, a project directory to run in, and a directory of fake host CLIs.
struct Machine {
    dir: tempfile::TempDir,
}

impl Machine {
    fn new() -> Self {
        let b = Machine { dir: tempfile::tempdir().expect("tempdir") };
        for d in ["home", "project", "bin", "empty"] {
            std::fs::create_dir_all(b.dir.path().join(d)).unwrap();
        }
        b
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn project(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path().join("project")).unwrap()
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("calls.log")
    }

    /// A fake `claude` that records each call's arguments, one per line, then `---`.
    fn fake_claude(&self) {
        self.script("claude", &format!("printf '%s\\n' \"$@\" --- >> '{}'\n", self.log().display()));
    }

    /// A fake `codex` that records its calls and keeps one entry as `codex mcp get --json` shows it.
    fn fake_codex(&self) {
        let entry = self.dir.path().join("codex-entry.json");
        let body = format!(
            r#"printf '%s\n' "$@" --- >> '{log}'
case "$2" in
  get) [ -f '{entry}' ] && cat '{entry}' && exit 0; echo "No MCP server named '$3' found." >&2; exit 1 ;;
  add) printf '{{"name":"%s","transport":{{"type":"stdio","command":"%s","args":["%s"]}}}}' "$3" "$5" "$6" > '{entry}' ;;
  remove) rm -f '{entry}' ;;
esac
"#,
            log = self.log().display(),
            entry = entry.display()
        );
        self.script("codex", &body);
    }

    fn script(&self, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path().join("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// The calls the fakes recorded: each one's arguments.
    fn calls(&self) -> Vec<Vec<String>> {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let mut calls = vec![];
        let mut current = vec![];
        for line in text.lines() {
            if line == "---" {
                calls.push(std::mem::take(&mut current));
            } else {
                current.push(line.to_string());
            }
        }
        calls
    }

    /// Runs `sessions-mcp ARGS` in the project directory with this HOME and the fakes on PATH.
    fn run(&self, args: &[&str]) -> Output {
        self.run_with_path(args, &format!("{}:/usr/bin:/bin", self.dir.path().join("bin").display()))
    }

    fn run_with_path(&self, args: &[&str], path: &str) -> Output {
        let mut c = Command::new(common::bin());
        c.args(args).current_dir(self.project()).env("HOME", self.home()).env("PATH", path);
        for var in
            ["CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME", "CODEX_HOME", "SESSIONS_MCP_STATE_DIR", "SESSIONS_MCP_CONFIG"]
        {
            c.env_remove(var);
        }
        c.output().expect("run sessions-mcp")
    }

    /// [`Machine::run`], asserting success; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{args:?}: {:?}\nstdout: {stdout}\nstderr: {}", out.status, stderr(&out));
        stdout
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What `install` registers: this binary's absolute path.
fn exe() -> String {
    std::fs::canonicalize(common::bin()).unwrap().display().to_string()
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

fn write_json(path: &Path, value: &Value) -> String {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text = serde_json::to_string_pretty(value).unwrap() + "\n";
    std::fs::write(path, &text).unwrap();
    text
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn claude_code_user_scope_runs_claude_mcp_add_once_and_remove_on_uninstall() {
    let b = Machine::new();
    b.fake_claude();
    let exe = exe();
    let add = words(&["mcp", "add", "--scope", "user", "sessions", "--", &exe, "serve"]);

    let dry = b.ok(&["install", "claude-code", "--scope", "user", "--dry-run"]);
    assert_eq!(dry.trim(), format!("would run: claude {}", add.join(" ")));
    assert!(b.calls().is_empty(), "a dry run runs nothing: {:?}", b.calls());

    let out = b.ok(&["install", "claude-code", "--scope", "user"]);
    assert_eq!(b.calls(), vec![add.clone()]);
    assert!(out.contains(&format!("running: claude {}", add.join(" "))), "{out}");

    // What `claude mcp add --scope user` writes; a second install sees it and runs nothing.
    let claude_json = b.home().join(".claude.json");
    let entry = json!({"type": "stdio", "command": exe, "args": ["serve"], "env": {}});
    write_json(&claude_json, &json!({"numStartups": 3, "mcpServers": {"other": {"command": "x"}, "sessions": entry}}));
    let again = b.ok(&["install", "claude-code"]);
    assert!(again.contains("already has MCP server \"sessions\"") && again.contains("nothing changed"), "{again}");
    assert_eq!(b.calls().len(), 1, "the second install ran claude: {:?}", b.calls());

    // An entry that starts another binary is replaced: removed, then added.
    write_json(&claude_json, &json!({"mcpServers": {"sessions": {"command": "/old/sessions-mcp", "args": ["serve"]}}}));
    b.ok(&["install", "claude-code"]);
    let remove = words(&["mcp", "remove", "--scope", "user", "sessions"]);
    assert_eq!(b.calls()[1..], [remove.clone(), add]);

    b.ok(&["uninstall", "claude-code", "--scope", "user"]);
    assert_eq!(b.calls()[3..], [remove]);
    std::fs::remove_file(&claude_json).unwrap();
    let none = b.ok(&["uninstall", "claude-code"]);
    assert!(none.contains("has no MCP server \"sessions\"; nothing changed"), "{none}");
    assert_eq!(b.calls().len(), 4);
}

#[test]
fn claude_code_project_and_local_scopes_read_their_own_files() {
    let b = Machine::new();
    b.fake_claude();
    let exe = exe();
    let entry = json!({"type": "stdio", "command": exe, "args": ["serve"], "env": {}});
    // Local scope: ~/.claude.json under projects.<this directory>.
    let cwd = b.project().display().to_string();
    write_json(&b.home().join(".claude.json"), &json!({"projects": {cwd: {"mcpServers": {"sessions": entry}}}}));
    assert!(b.ok(&["install", "claude-code", "--scope", "local"]).contains("nothing changed"));
    // That is not the user scope, nor the project's .mcp.json.
    b.ok(&["install", "claude-code", "--scope", "project", "--name", "sessions-work"]);
    assert_eq!(b.calls(), vec![words(&["mcp", "add", "--scope", "project", "sessions-work", "--", &exe, "serve"])]);
    write_json(&b.project().join(".mcp.json"), &json!({"mcpServers": {"sessions-work": entry}}));
    assert!(
        b.ok(&["install", "claude-code", "--scope", "project", "--name", "sessions-work"]).contains("nothing changed")
    );
    b.ok(&["uninstall", "claude-code", "--scope", "project", "--name", "sessions-work"]);
    assert_eq!(b.calls()[1], words(&["mcp", "remove", "--scope", "project", "sessions-work"]));
}

#[test]
fn claude_not_on_path_says_how_to_install_it_or_what_to_put_in_mcp_json() {
    let b = Machine::new();
    let empty = b.dir.path().join("empty").display().to_string();
    let out = b.run_with_path(&["install", "claude-code"], &empty);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("`claude` is not on PATH") && err.contains("npm install -g @anthropic-ai/claude-code"),
        "{err}"
    );
    assert!(err.contains(".mcp.json") && err.contains(&format!("\"command\":\"{}\"", exe())), "{err}");
    // Scopes a host does not have, and a name no host takes, are refused before anything runs.
    let out = b.run(&["install", "codex", "--scope", "project"]);
    assert!(stderr(&out).contains("codex has no --scope project; allowed: user"), "{}", stderr(&out));
    let out = b.run(&["install", "gemini", "--name", "a b"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("letters, digits"), "{}", stderr(&out));
    let out = b.run(&["install", "cursor"]);
    assert!(stderr(&out).contains("claude-code, codex, gemini, claude-desktop"), "{}", stderr(&out));
}

#[test]
fn codex_runs_codex_mcp_add_once_and_remove_on_uninstall() {
    let b = Machine::new();
    b.fake_codex();
    let exe = exe();
    let get = words(&["mcp", "get", "sessions", "--json"]);
    let add = words(&["mcp", "add", "sessions", "--", &exe, "serve"]);

    let dry = b.ok(&["install", "codex", "--dry-run"]);
    assert!(dry.contains(&format!("would run: codex {}", add.join(" "))), "{dry}");
    assert_eq!(b.calls(), vec![get.clone()], "a dry run only asks");

    b.ok(&["install", "codex"]);
    assert_eq!(b.calls()[1..], [get.clone(), add]);
    let again = b.ok(&["install", "codex"]);
    assert!(
        again.contains("Codex already has MCP server \"sessions\"") && again.contains("nothing changed"),
        "{again}"
    );
    assert_eq!(&b.calls()[3..], std::slice::from_ref(&get));

    b.ok(&["uninstall", "codex"]);
    assert_eq!(b.calls()[4..], [get.clone(), words(&["mcp", "remove", "sessions"])]);
    assert!(b.ok(&["uninstall", "codex"]).contains("Codex has no MCP server \"sessions\"; nothing changed"));
    assert_eq!(b.calls()[6..], [get]);
}

/// Without `codex` on PATH, `~/.codex/config.toml` (`$CODEX_HOME`) is edited: one table set, the
/// comments, keys and tables around it kept; uninstall gives back the file byte for byte.
#[test]
fn codex_without_its_cli_edits_config_toml_keeping_the_rest() {
    let b = Machine::new();
    let empty = b.dir.path().join("empty").display().to_string();
    let path = b.home().join(".codex/config.toml");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let before = "# mine\nmodel = \"o3\"  # the best\n\n[mcp_servers.other]\ncommand = \"node\"\nargs = [\"x.js\"]\n\n[profiles.fast]\nmodel = \"mini\"\n";
    std::fs::write(&path, before).unwrap();
    let run = |args: &[&str]| {
        let out = b.run_with_path(args, &empty);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(run(&["install", "codex", "--dry-run"]).starts_with("would write"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    let out = run(&["install", "codex"]);
    assert!(out.contains("codex is not on PATH, so its config file is edited"), "{out}");
    let table = format!("[mcp_servers.sessions]\ncommand = \"{}\"\nargs = [\"serve\"]\n", exe());
    let after = std::fs::read_to_string(&path).unwrap();
    assert_eq!(after, before.replace("[profiles.fast]", &format!("{table}\n[profiles.fast]")));
    assert!(run(&["install", "codex"]).contains("nothing changed"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), after);
    run(&["uninstall", "codex"]);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    assert!(run(&["uninstall", "codex"]).contains("nothing changed"));
    // Not TOML: left alone, and said so.
    std::fs::write(&path, "model = \n").unwrap();
    let out = b.run_with_path(&["install", "codex"], &empty);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not TOML"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "model = \n");
}

/// Install, a second install, a dry run and uninstall on a JSON config that holds other keys and
/// servers: they are kept in place, the second run and the dry run change no byte, and uninstall
/// gives back the file as it was.
fn json_config_round_trip(b: &Machine, args: &[&str], path: &Path) {
    let original = json!({
        "theme": "GitHub",
        "mcpServers": {"other": {"command": "node", "args": ["srv.js"], "env": {"K": "v"}}},
        "security": {"auth": {"selectedType": "gemini-api-key"}}
    });
    let before = write_json(path, &original);
    let run = |verb: &str, extra: &[&str]| b.ok(&[&[verb], args, extra].concat());

    let dry = run("install", &["--dry-run"]);
    assert!(dry.starts_with(&format!("would write {}: mcpServers.sessions = ", path.display())), "{dry}");
    assert_eq!(std::fs::read_to_string(path).unwrap(), before, "a dry run changed the file");

    let out = run("install", &[]);
    assert!(out.contains(&format!("wrote {}", path.display())), "{out}");
    let mut expected = original.clone();
    expected["mcpServers"]["sessions"] = json!({"command": exe(), "args": ["serve"]});
    let after = std::fs::read_to_string(path).unwrap();
    assert_eq!(after, serde_json::to_string_pretty(&expected).unwrap() + "\n", "other keys moved or changed");

    let again = run("install", &[]);
    assert!(again.contains("already has mcpServers.sessions") && again.contains("nothing changed"), "{again}");
    assert_eq!(std::fs::read_to_string(path).unwrap(), after);

    run("uninstall", &[]);
    assert_eq!(std::fs::read_to_string(path).unwrap(), before, "uninstall did not give back the file");
    assert!(run("uninstall", &[]).contains("nothing changed"));
}

#[test]
fn gemini_user_and_project_settings_keep_their_other_entries() {
    let b = Machine::new();
    json_config_round_trip(&b, &["gemini"], &b.home().join(".gemini/settings.json"));
    json_config_round_trip(&b, &["gemini", "--scope", "project"], &b.project().join(".gemini/settings.json"));
}

#[test]
fn claude_desktop_config_keeps_its_other_entries() {
    let b = Machine::new();
    let path = if cfg!(target_os = "macos") {
        b.home().join("Library/Application Support/Claude/claude_desktop_config.json")
    } else {
        b.home().join(".config/Claude/claude_desktop_config.json")
    };
    json_config_round_trip(&b, &["claude-desktop"], &path);
}

#[test]
fn a_config_file_without_one_gets_one_and_a_broken_one_is_left_alone() {
    let b = Machine::new();
    let settings = b.home().join(".gemini/settings.json");
    b.ok(&["install", "gemini"]);
    assert_eq!(read_json(&settings), json!({"mcpServers": {"sessions": {"command": exe(), "args": ["serve"]}}}));
    // An entry of the user's with the same command and more keys is theirs: left alone; with
    // another command, only its command and args change.
    let mine =
        json!({"mcpServers": {"sessions": {"command": "/old", "args": ["serve"], "timeout": 5000, "trust": true}}});
    write_json(&settings, &mine);
    b.ok(&["install", "gemini"]);
    assert_eq!(
        read_json(&settings),
        json!({"mcpServers": {"sessions": {"command": exe(), "args": ["serve"], "timeout": 5000, "trust": true}}})
    );
    std::fs::write(&settings, "{ // comments are not JSON\n}").unwrap();
    let out = b.run(&["install", "gemini"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not JSON") && stderr(&out).contains("by hand"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&settings).unwrap(), "{ // comments are not JSON\n}");
}

/// The real host CLIs (`.ci/run --extended` installs them): what `install` runs is what they take,
/// and what they write is what the second install recognises.
#[test]
fn real_claude_and_codex_take_the_registration_and_give_it_back() {
    for (var, program, name, config) in [
        ("SESSIONS_MCP_CLAUDE", "claude", "Claude Code", ".claude.json"),
        ("SESSIONS_MCP_CODEX", "codex", "Codex", ".codex/config.toml"),
    ] {
        let Some(cli) = common::real_cli_or_skip(var, program, name) else { continue };
        let b = Machine::new();
        let path = format!("{}:/usr/bin:/bin", cli.parent().unwrap().display());
        let host = if program == "claude" { "claude-code" } else { "codex" };
        let run = |cmd: &str| {
            let out = b.run_with_path(&[cmd, host], &path);
            assert!(out.status.success(), "{cmd} {host}: {}", stderr(&out));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        run("install");
        let written = std::fs::read_to_string(b.home().join(config)).unwrap();
        assert!(written.contains(&exe()), "{name} wrote no entry for this binary: {written}");
        assert!(run("install").contains("nothing changed"), "{name}: the second install changed something");
        run("uninstall");
        assert!(!std::fs::read_to_string(b.home().join(config)).unwrap().contains(&exe()));
        assert!(run("uninstall").contains("nothing changed"));
        if program == "codex" {
            codex_reads_the_table_install_writes_without_it(&b, &cli, &path);
        }
    }
}

/// The table written without the CLI is one the real `codex mcp get` reads, and `install` through
/// the CLI then finds nothing to change.
fn codex_reads_the_table_install_writes_without_it(b: &Machine, cli: &Path, path: &str) {
    let empty = b.dir.path().join("empty").display().to_string();
    assert!(b.run_with_path(&["install", "codex"], &empty).status.success());
    let got = Command::new(cli)
        .args(["mcp", "get", "sessions", "--json"])
        .env("HOME", b.home())
        .env("PATH", path)
        .env_remove("CODEX_HOME")
        .output()
        .unwrap();
    let got: Value = serde_json::from_slice(&got.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&got)));
    assert_eq!(got["transport"]["command"], exe(), "{got}");
    assert_eq!(got["transport"]["args"], json!(["serve"]), "{got}");
    let out = b.run_with_path(&["install", "codex"], path);
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing changed"), "{}", stderr(&out));
}

/// Every `sessions-mcp install|uninstall` line of docs/INSTALL.md runs as written (with
/// `--dry-run` added where it has none), against the fake CLIs in a fresh HOME.
#[test]
fn the_install_commands_of_the_docs_run() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/INSTALL.md")).unwrap();
    let b = Machine::new();
    b.fake_claude();
    b.fake_codex();
    let mut ran = 0;
    for line in doc.lines() {
        let Some(rest) = line.strip_prefix("sessions-mcp ") else { continue };
        let command = rest.split('#').next().unwrap();
        let mut args: Vec<&str> = command.split_whitespace().collect();
        if !matches!(args.first(), Some(&"install" | &"uninstall")) {
            continue;
        }
        if !args.contains(&"--dry-run") {
            args.push("--dry-run");
        }
        let out = b.ok(&args);
        assert!(out.starts_with("would ") || out.contains("nothing changed"), "{line}: {out}");
        ran += 1;
    }
    assert!(ran >= 7, "{ran} commands in docs/INSTALL.md");
}
