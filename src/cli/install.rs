//! `install` and `uninstall`: register this server with an MCP host, or remove it, through the
//! host's own mechanism — its CLI where it has one (`claude mcp add`, `codex mcp add`; Codex's
//! config.toml when the CLI is not on PATH), its config file where it has none (Gemini CLI's
//! settings.json, Claude Desktop's config). The
//! registered command is the absolute path of this binary with `serve`, so PATH does not matter.
//! Idempotent: what is already as asked is reported and left alone; `--dry-run` changes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Args, ValueEnum};
use serde_json::{Map, Value, json};

use super::fail;

/// The hosts we know how to register with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Host {
    ClaudeCode,
    Codex,
    Gemini,
    ClaudeDesktop,
}

/// Where the host keeps the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scope {
    /// Every project of yours (every host).
    User,
    /// This directory's project config, shared through version control (claude-code, gemini).
    Project,
    /// This directory, for you only (claude-code).
    Local,
}

#[derive(Args)]
pub struct HostArgs {
    /// The host to register with.
    #[arg(value_enum)]
    host: Host,
    /// Where the host keeps the entry.
    #[arg(long, value_enum, default_value_t = Scope::User)]
    scope: Scope,
    /// Print what would be run or written; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// The server's name in the host's config.
    #[arg(long, default_value = "sessions", value_parser = parse_name)]
    name: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Install,
    Uninstall,
}

/// What this binary is registered as: `<absolute path of this binary> serve`.
struct Server {
    name: String,
    command: String,
    args: Vec<String>,
}

/// The change an `install`/`uninstall` makes, decided before anything is changed.
enum Plan {
    /// Already as asked; the line says what is there.
    Unchanged(String),
    /// Invocations of the host's CLI (a changed entry is removed, then added again).
    Commands { program: PathBuf, display: &'static str, invocations: Vec<Vec<String>> },
    /// A JSON config file written again with one entry set or removed, every other key kept.
    File { path: PathBuf, contents: String, change: String },
}

pub fn install(args: &HostArgs) -> ExitCode {
    run(args, Op::Install)
}

pub fn uninstall(args: &HostArgs) -> ExitCode {
    run(args, Op::Uninstall)
}

fn run(args: &HostArgs, op: Op) -> ExitCode {
    let server = match this_server(&args.name) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let plan = check_scope(args.host, args.scope).and_then(|()| plan(args, op, &server));
    match plan {
        Ok(plan) => apply(plan, args, op, &server),
        Err(e) => fail(e),
    }
}

/// Names a host accepts as a key everywhere (a TOML bare key, a CLI argument).
fn parse_name(name: &str) -> Result<String, String> {
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok { Ok(name.to_string()) } else { Err("letters, digits, '-' and '_' only".to_string()) }
}

fn this_server(name: &str) -> Result<Server, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the path of this binary: {e}"))?;
    let command = exe.to_str().ok_or_else(|| format!("the path of this binary is not UTF-8: {}", exe.display()))?;
    Ok(Server { name: name.to_string(), command: command.to_string(), args: vec!["serve".to_string()] })
}

/// The scopes each host has.
fn check_scope(host: Host, scope: Scope) -> Result<(), String> {
    let allowed: &[Scope] = match host {
        Host::ClaudeCode => &[Scope::User, Scope::Project, Scope::Local],
        Host::Gemini => &[Scope::User, Scope::Project],
        Host::Codex | Host::ClaudeDesktop => &[Scope::User],
    };
    if allowed.contains(&scope) {
        return Ok(());
    }
    let names: Vec<_> = allowed.iter().map(|s| value_name(*s)).collect();
    Err(format!("{} has no --scope {}; allowed: {}", value_name(host), value_name(scope), names.join(", ")))
}

fn value_name(v: impl ValueEnum) -> String {
    v.to_possible_value().map(|p| p.get_name().to_string()).unwrap_or_default()
}

fn plan(args: &HostArgs, op: Op, server: &Server) -> Result<Plan, String> {
    match args.host {
        Host::ClaudeCode => claude_code_plan(args.scope, op, server),
        Host::Codex => codex_plan(op, server),
        Host::Gemini => json_file_plan(&gemini_settings(args.scope)?, op, server),
        Host::ClaudeDesktop => json_file_plan(&claude_desktop_config()?, op, server),
    }
}

fn apply(plan: Plan, args: &HostArgs, op: Op, server: &Server) -> ExitCode {
    match plan {
        Plan::Unchanged(line) => {
            println!("{line}; nothing changed");
            return ExitCode::SUCCESS;
        }
        Plan::Commands { program, display, invocations } => {
            for invocation in &invocations {
                println!(
                    "{}: {display} {}",
                    if args.dry_run { "would run" } else { "running" },
                    shell_line(invocation)
                );
                if !args.dry_run
                    && let Err(e) = run_host_cli(&program, display, invocation)
                {
                    return fail(e);
                }
            }
        }
        Plan::File { path, contents, change } => {
            if !args.dry_run
                && let Err(e) = write_keeping_mode(&path, &contents)
            {
                return fail(format!("cannot write {}: {e}", path.display()));
            }
            println!("{} {}: {change}", if args.dry_run { "would write" } else { "wrote" }, path.display());
        }
    }
    if !args.dry_run {
        after_note(args.host, op, server);
    }
    ExitCode::SUCCESS
}

/// What the user does next, and a warning when the registered binary is a build output that
/// `cargo clean` or the next build removes.
fn after_note(host: Host, op: Op, server: &Server) {
    let restart = match host {
        Host::ClaudeCode => "new Claude Code sessions",
        Host::Codex => "new Codex sessions",
        Host::Gemini => "Gemini CLI, once restarted,",
        Host::ClaudeDesktop => "Claude Desktop, once restarted,",
    };
    match op {
        Op::Install => println!("{restart} will start `{} serve` as MCP server {:?}", server.command, server.name),
        Op::Uninstall => println!("{restart} will no longer start MCP server {:?}", server.name),
    }
    if op == Op::Install && (server.command.contains("/target/debug/") || server.command.contains("/target/release/")) {
        println!(
            "note: this is a build output under target/; `cargo install --path .` puts a lasting copy in ~/.cargo/bin (then run install again from there)"
        );
    }
}

fn run_host_cli(program: &Path, display: &str, invocation: &[String]) -> Result<(), String> {
    let status = Command::new(program)
        .args(invocation)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{display} {}` failed ({status}); nothing else was changed", shell_line(invocation)))
    }
}

/// Words as a shell would take them back: bare when safe, else single-quoted.
fn shell_line(words: &[String]) -> String {
    let quote = |w: &String| {
        let safe = !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || "/._-=:@%+,".contains(c));
        if safe { w.clone() } else { format!("'{}'", w.replace('\'', r"'\''")) }
    };
    words.iter().map(quote).collect::<Vec<_>>().join(" ")
}

// ---- Claude Code: `claude mcp add|remove` --------------------------------------------------------

fn claude_code_plan(scope: Scope, op: Op, server: &Server) -> Result<Plan, String> {
    let existing = claude_code_entry(scope, &server.name)?;
    let scope_name = value_name(scope);
    let remove = vec!["mcp".into(), "remove".into(), "--scope".into(), scope_name.clone(), server.name.clone()];
    let mut add =
        vec!["mcp".into(), "add".into(), "--scope".into(), scope_name.clone(), server.name.clone(), "--".into()];
    add.extend(command_words(server));
    let invocations = match (op, existing) {
        (Op::Install, Some(e)) if same_command(&e, server) => {
            return Ok(already_registered(&format!("Claude Code ({scope_name} scope)"), server));
        }
        (Op::Install, Some(_)) => vec![remove, add],
        (Op::Install, None) => vec![add],
        (Op::Uninstall, Some(_)) => vec![remove],
        (Op::Uninstall, None) => {
            return Ok(Plan::Unchanged(format!(
                "Claude Code ({scope_name} scope) has no MCP server {:?}",
                server.name
            )));
        }
    };
    let program = host_cli("claude", claude_code_missing(scope, server))?;
    Ok(Plan::Commands { program, display: "claude", invocations })
}

/// The entry Claude Code has for `name` in `scope`, read from the files `claude mcp add` writes:
/// `~/.claude.json` (`mcpServers` for user, `projects.<cwd>.mcpServers` for local; under
/// `$CLAUDE_CONFIG_DIR` when set) and `./.mcp.json` for project.
fn claude_code_entry(scope: Scope, name: &str) -> Result<Option<Value>, String> {
    let cwd = current_dir()?;
    let (file, mut path) = match scope {
        Scope::Project => (cwd.join(".mcp.json"), vec![]),
        Scope::User => (claude_json()?, vec![]),
        Scope::Local => (claude_json()?, vec!["projects".to_string(), cwd.to_string_lossy().into_owned()]),
    };
    path.extend(["mcpServers".to_string(), name.to_string()]);
    let Some(root) = read_json(&file)? else { return Ok(None) };
    Ok(path.iter().try_fold(&root, |v, key| v.get(key)).cloned())
}

fn claude_json() -> Result<PathBuf, String> {
    match std::env::var_os("CLAUDE_CONFIG_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir).join(".claude.json")),
        None => Ok(home()?.join(".claude.json")),
    }
}

fn claude_code_missing(scope: Scope, server: &Server) -> String {
    let file = match scope {
        Scope::Project => ".mcp.json in this directory".to_string(),
        _ => "a .mcp.json in your project".to_string(),
    };
    format!(
        "Claude Code's `claude` is not on PATH: install it (npm install -g @anthropic-ai/claude-code), or put this in {file}: {}",
        json!({"mcpServers": {server.name.clone(): entry_json(server)}})
    )
}

// ---- Codex: `codex mcp add|remove` ----------------------------------------------------------------

fn codex_plan(op: Op, server: &Server) -> Result<Plan, String> {
    let Ok(program) = which::which("codex") else { return codex_file_plan(op, server) };
    let existing = codex_entry(&program, &server.name)?;
    let remove = vec!["mcp".into(), "remove".into(), server.name.clone()];
    let mut add = vec!["mcp".into(), "add".into(), server.name.clone(), "--".into()];
    add.extend(command_words(server));
    let invocations = match (op, existing) {
        (Op::Install, Some(e)) if same_command(&e, server) => return Ok(already_registered("Codex", server)),
        // `codex mcp add` replaces an entry of the same name.
        (Op::Install, _) => vec![add],
        (Op::Uninstall, Some(_)) => vec![remove],
        (Op::Uninstall, None) => return Ok(Plan::Unchanged(format!("Codex has no MCP server {:?}", server.name))),
    };
    Ok(Plan::Commands { program, display: "codex", invocations })
}

/// Codex's entry for `name` (`codex mcp get NAME --json`: its `transport`), or None when it has
/// none (the command fails).
fn codex_entry(program: &Path, name: &str) -> Result<Option<Value>, String> {
    let out = Command::new(program)
        .args(["mcp", "get", name, "--json"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if !out.status.success() {
        return Ok(None);
    }
    let got: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("`codex mcp get {name} --json` printed something that is not JSON ({e})"))?;
    Ok(got.get("transport").cloned())
}

/// Without the codex CLI (Codex's IDE extension and app read the same file), the table
/// `[mcp_servers.<name>]` of `$CODEX_HOME/config.toml` (default `~/.codex`) is set or removed,
/// the rest of the file kept as it is, comments included.
fn codex_file_plan(op: Op, server: &Server) -> Result<Plan, String> {
    let path = match std::env::var_os("CODEX_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("config.toml"),
        None => home()?.join(".codex/config.toml"),
    };
    let original = read_text(&path)?.unwrap_or_default();
    let mut doc: toml_edit::DocumentMut =
        original.parse().map_err(|e| format!("{} is not TOML ({e}); add the table by hand", path.display()))?;
    let where_ = format!("mcp_servers.{}", server.name);
    let servers = doc.entry("mcp_servers").or_insert_with(implicit_table).as_table_like_mut();
    let Some(servers) = servers else { return Err(format!("mcp_servers in {} is not a table", path.display())) };
    let change = match op {
        Op::Install => {
            let entry = servers.entry(&server.name).or_insert(toml_edit::table());
            let Some(fields) = entry.as_table_like_mut() else {
                return Err(format!("{where_} in {} is not a table", path.display()));
            };
            if same_command(&toml_entry_json(fields), server) {
                return Ok(Plan::Unchanged(format!("{} already has [{where_}]", path.display())));
            }
            fields.insert("command", toml_edit::value(server.command.as_str()));
            fields
                .insert("args", toml_edit::value(server.args.iter().map(String::as_str).collect::<toml_edit::Array>()));
            format!("[{where_}] = {} (codex is not on PATH, so its config file is edited)", entry_json(server))
        }
        Op::Uninstall => match servers.remove(&server.name) {
            Some(_) => format!("[{where_}] removed (codex is not on PATH, so its config file is edited)"),
            None => return Ok(Plan::Unchanged(format!("{} has no [{where_}]", path.display()))),
        },
    };
    Ok(Plan::File { path, contents: doc.to_string(), change })
}

/// A parent table that shows only through its children (`[mcp_servers.x]`, no `[mcp_servers]`).
fn implicit_table() -> toml_edit::Item {
    let mut table = toml_edit::Table::new();
    table.set_implicit(true);
    toml_edit::Item::Table(table)
}

/// A Codex table's command and args, in the shape [`same_command`] compares.
fn toml_entry_json(fields: &dyn toml_edit::TableLike) -> Value {
    let args: Option<Vec<&str>> =
        fields.get("args").and_then(toml_edit::Item::as_array).map(|a| a.iter().filter_map(|v| v.as_str()).collect());
    json!({"command": fields.get("command").and_then(toml_edit::Item::as_str), "args": args})
}

// ---- JSON config files: Gemini CLI, Claude Desktop ------------------------------------------------

fn gemini_settings(scope: Scope) -> Result<PathBuf, String> {
    let dir = if scope == Scope::Project { current_dir()? } else { home()? };
    Ok(dir.join(".gemini/settings.json"))
}

fn claude_desktop_config() -> Result<PathBuf, String> {
    let dir = if cfg!(target_os = "macos") {
        home()?.join("Library/Application Support/Claude")
    } else {
        match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
            Some(d) => PathBuf::from(d).join("Claude"),
            None => home()?.join(".config/Claude"),
        }
    };
    Ok(dir.join("claude_desktop_config.json"))
}

/// Sets or removes `mcpServers.<name>` in the JSON file at `path` (missing = `{}`). Every other
/// key keeps its place and value; an entry's own extra keys (env, timeout, trust) are kept when
/// only its command changes.
fn json_file_plan(path: &Path, op: Op, server: &Server) -> Result<Plan, String> {
    let original = read_text(path)?;
    let mut root = match original.as_deref().map(str::trim) {
        None | Some("") => Value::Object(Map::new()),
        Some(text) => serde_json::from_str(text).map_err(|e| {
            format!(
                "{} is not JSON ({e}); add this under \"mcpServers\" by hand: {:?}: {}",
                path.display(),
                server.name,
                entry_json(server)
            )
        })?,
    };
    let where_ = format!("mcpServers.{}", server.name);
    let servers = mcp_servers(&mut root, path)?;
    let change = match op {
        Op::Install => {
            let entry = servers.entry(server.name.clone()).or_insert_with(|| Value::Object(Map::new()));
            if same_command(entry, server) {
                return Ok(Plan::Unchanged(format!("{} already has {where_} = {}", path.display(), entry)));
            }
            let Value::Object(fields) = entry else {
                return Err(format!("{where_} in {} is not an object", path.display()));
            };
            fields.insert("command".into(), server.command.clone().into());
            fields.insert("args".into(), server.args.clone().into());
            format!("{where_} = {entry}")
        }
        Op::Uninstall => match servers.remove(&server.name) {
            Some(old) => format!("{where_} removed (was {old})"),
            None => return Ok(Plan::Unchanged(format!("{} has no {where_}", path.display()))),
        },
    };
    let mut contents = serde_json::to_string_pretty(&root).map_err(|e| e.to_string())?;
    // Keep the file's own ending (Node's JSON.stringify writes none; editors add one).
    if original.as_deref().is_none_or(|t| t.ends_with('\n')) {
        contents.push('\n');
    }
    Ok(Plan::File { path: path.to_path_buf(), contents, change })
}

fn mcp_servers<'a>(root: &'a mut Value, path: &Path) -> Result<&'a mut Map<String, Value>, String> {
    let Value::Object(top) = root else { return Err(format!("{} is not a JSON object", path.display())) };
    match top.entry("mcpServers").or_insert_with(|| Value::Object(Map::new())) {
        Value::Object(servers) => Ok(servers),
        _ => Err(format!("\"mcpServers\" in {} is not an object", path.display())),
    }
}

/// Writes `contents` in place of `path` through a sibling file renamed over it, so a crash never
/// leaves half a config; a symlinked config (dotfile managers) is written at its target, and the
/// file keeps its permissions.
fn write_keeping_mode(path: &Path, contents: &str) -> std::io::Result<()> {
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = target.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let file_name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{file_name}.sessions-mcp-{}", std::process::id()));
    std::fs::write(&temp, contents)?;
    if let Ok(meta) = std::fs::metadata(&target) {
        std::fs::set_permissions(&temp, meta.permissions())?;
    }
    std::fs::rename(&temp, &target).inspect_err(|_| {
        let _ = std::fs::remove_file(&temp);
    })
}

// ---- shared ----------------------------------------------------------------------------------------

fn command_words(server: &Server) -> Vec<String> {
    std::iter::once(server.command.clone()).chain(server.args.iter().cloned()).collect()
}

/// What a host whose CLI already starts this server is told.
fn already_registered(host: &str, server: &Server) -> Plan {
    Plan::Unchanged(format!("{host} already has MCP server {:?}: {}", server.name, shell_line(&command_words(server))))
}

fn entry_json(server: &Server) -> Value {
    json!({"command": server.command, "args": server.args})
}

/// Whether a host's entry starts exactly this server (its other keys are the user's).
fn same_command(entry: &Value, server: &Server) -> bool {
    entry.get("command").and_then(Value::as_str) == Some(server.command.as_str())
        && entry.get("args").and_then(Value::as_array).is_some_and(|a| a.iter().eq(entry_args(server).iter()))
}

fn entry_args(server: &Server) -> Vec<Value> {
    server.args.iter().map(|a| Value::from(a.as_str())).collect()
}

/// The host's CLI on PATH, or the error saying how to install it or edit its config instead.
fn host_cli(program: &str, missing: String) -> Result<PathBuf, String> {
    which::which(program).map_err(|_| missing)
}

fn read_text(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, String> {
    match read_text(path)? {
        None => Ok(None),
        Some(t) if t.trim().is_empty() => Ok(None),
        Some(t) => serde_json::from_str(&t).map(Some).map_err(|e| format!("{} is not JSON: {e}", path.display())),
    }
}

fn home() -> Result<PathBuf, String> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| "HOME is not set: the host's user config cannot be found".to_string())
}

fn current_dir() -> Result<PathBuf, String> {
    std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        Server { name: "sessions".into(), command: "/opt/bin/sessions-mcp".into(), args: vec!["serve".into()] }
    }

    #[test]
    fn shell_lines_quote_what_a_shell_would_split() {
        let words = ["claude", "/a b/it's", "serve"].map(String::from);
        assert_eq!(shell_line(&words), r"claude '/a b/it'\''s' serve");
    }

    #[test]
    fn scopes_a_host_does_not_have_are_refused_listing_those_it_has() {
        assert_eq!(
            check_scope(Host::Codex, Scope::Project).unwrap_err(),
            "codex has no --scope project; allowed: user"
        );
        assert!(check_scope(Host::ClaudeCode, Scope::Local).is_ok());
        assert!(check_scope(Host::Gemini, Scope::Local).unwrap_err().ends_with("allowed: user, project"));
    }

    #[test]
    fn an_entry_with_extra_keys_but_the_same_command_is_the_same() {
        let s = server();
        assert!(same_command(&json!({"type": "stdio", "command": s.command, "args": ["serve"], "env": {}}), &s));
        assert!(!same_command(&json!({"command": s.command, "args": ["serve", "--quiet"]}), &s));
        assert!(!same_command(&json!({"command": "sessions-mcp", "args": ["serve"]}), &s));
    }
}
