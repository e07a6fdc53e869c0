//! `sessions-mcp schemas [--check]`: the tools' input and output schemas and the config schema,
//! generated from the Rust types and checked in under `schemas/`.

use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

/// Every schema file: name → pretty JSON.
pub fn files() -> Vec<(String, String)> {
    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("schema serialises") + "\n";
    let mut out = Vec::new();
    for spec in crate::tools::specs() {
        out.push((format!("{}.input.json", spec.name.as_str()), pretty(&spec.input)));
        out.push((format!("{}.output.json", spec.name.as_str()), pretty(&spec.output)));
    }
    out.push(("config.json".to_string(), pretty(&crate::config::json_schema())));
    out
}

pub fn run(dir: &Path, check: bool) -> ExitCode {
    let mut drift = Vec::new();
    for (name, text) in files() {
        let path = dir.join(&name);
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                drift.push(name);
            }
        } else if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, text)) {
            eprintln!("sessions-mcp: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if drift.is_empty() {
        if check {
            println!("schemas are up to date");
        }
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "sessions-mcp: schemas differ from the code: {}; run `sessions-mcp schemas` and commit the result",
            drift.join(", ")
        );
        ExitCode::FAILURE
    }
}
