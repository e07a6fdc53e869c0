//! Every saved fuzz input (`fuzz/regressions/<target>/*`: crashes found and fixed, plus seeds)
//! runs through the same entry points as the fuzzers, in the default tier, so none comes back.

#[path = "../../fuzz/entry.rs"]
mod entry;

#[test]
fn saved_fuzz_inputs_still_pass() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut ran = 0;
    for target in std::fs::read_dir(&root).expect("fuzz/regressions") {
        let target = target.expect("entry").path();
        let name = target.file_name().and_then(|n| n.to_str()).expect("target name").to_string();
        for input in std::fs::read_dir(&target).expect("target dir") {
            let path = input.expect("entry").path();
            eprintln!("{name}: {}", path.display());
            entry::run(&name, &std::fs::read(&path).expect("input"));
            ran += 1;
        }
    }
    assert!(ran >= 6, "expected at least one saved input per target, ran {ran}");
}
