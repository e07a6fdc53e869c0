//! The published crate (`cargo install sessions-mcp`): what `cargo package` puts in it, and the
//! minimum Rust version it claims. CI runs `cargo publish --dry-run --locked` itself (the
//! default tier without the build, the extended tier with it); these checks say why it would fail.

use std::process::Command;

use serde_json::Value;

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("run cargo");
    assert!(out.status.success(), "cargo {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The package holds what builds the binaries and what crates.io shows, and none of CI's
/// installs, the tests' fixtures, fuzzing or build output.
#[test]
fn the_package_holds_the_sources_readme_and_license_and_nothing_of_ci_or_tests() {
    let files = cargo(&["package", "--list", "--locked", "--offline", "--allow-dirty"]);
    let files: Vec<&str> = files.lines().collect();
    for needed in [
        "Cargo.toml",
        "Cargo.lock",
        "README.md",
        "LICENSE",
        "src/main.rs",
        "src/lib.rs",
        "src/bin/sessions-mcp-supervise.rs",
    ] {
        assert!(files.contains(&needed), "{needed} is not in the package");
    }
    let stray: Vec<&&str> = files
        .iter()
        .filter(|f| {
            ["target/", ".ci/", "tests/", "fixtures/", "fuzz/", "conformance/", "node_modules"]
                .iter()
                .any(|p| f.contains(p))
        })
        .collect();
    assert!(stray.is_empty(), "the package holds {stray:?}");
}

/// No dependency the build resolves needs a newer Rust than Cargo.toml's `rust-version` (the
/// toolchain of that version cannot be installed where CI runs; clippy's `incompatible_msrv`,
/// on by default, covers the standard library APIs our own code uses).
#[test]
fn no_dependency_needs_a_newer_rust_than_ours() {
    let version = |v: &str| v.split('.').map(|n| n.parse::<u32>().unwrap()).collect::<Vec<_>>();
    let ours = version(env!("CARGO_PKG_RUST_VERSION"));
    let host = cargo(&["-vV"]).lines().find_map(|l| l.strip_prefix("host: ")).unwrap().to_string();
    let meta: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--locked",
        "--offline",
        "--filter-platform",
        &host,
    ]))
    .unwrap();
    let newer: Vec<String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["rust_version"].as_str().is_some_and(|v| version(v) > ours))
        .map(|p| format!("{} {} needs Rust {}", p["name"], p["version"], p["rust_version"]))
        .collect();
    assert!(newer.is_empty(), "rust-version is {}, but: {newer:?}", env!("CARGO_PKG_RUST_VERSION"));
}
