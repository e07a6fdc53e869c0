//! The invariants of docs/ARCHITECTURE.md, checked on the source (in the manner of
//! rust-analyzer's tidy tests): the layer order of `src/lib.rs`'s table, no cycle between
//! top-level modules, SQL and `rusqlite` only in the store, a `policy` that does no I/O, tools
//! that reach neither the store nor the runner, an engine that knows neither the server nor the
//! tools. Plain string scanning of `src/`: comments and `#[cfg(test)]` items are left out, and
//! string literals are looked at only for SQL.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::OnceLock;

/// The rules docs/ARCHITECTURE.md states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    LayerOrder,
    NoCycle,
    OnlyTheStoreSpeaksSql,
    PolicyIsPure,
    ToolsReachNeitherStoreNorRunner,
    EngineKnowsNeitherServerNorTools,
}

impl Rule {
    fn says(self) -> &'static str {
        match self {
            Rule::LayerOrder => {
                "a module uses only modules of its own layer or below (the layers of src/lib.rs's table)"
            }
            Rule::NoCycle => "no cycle between top-level modules",
            Rule::OnlyTheStoreSpeaksSql => {
                "only src/store/ speaks SQL: no SQL string literal and no `rusqlite` anywhere else"
            }
            Rule::PolicyIsPure => {
                "policy/ uses only config and keys and does no I/O (no std::fs, std::net, std::process, tokio)"
            }
            Rule::ToolsReachNeitherStoreNorRunner => {
                "tools/ uses no crate::store or crate::runner item: tools ask access and call the engine"
            }
            Rule::EngineKnowsNeitherServerNorTools => "engine/ uses neither crate::server nor crate::tools",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.says())
    }
}

/// One place where a rule does not hold.
#[derive(Debug)]
struct Violation {
    /// The file under `src/`, e.g. `engine/spawn.rs`.
    file: String,
    line: usize,
    rule: Rule,
    what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "src/{}:{}: {}\n    rule: {} (docs/ARCHITECTURE.md)", self.file, self.line, self.what, self.rule)
    }
}

/// One file of `src/` as the rules read it.
struct Source {
    /// The path under `src/`, with `/`.
    file: String,
    /// Its top-level module (`engine` for `engine/spawn.rs`, `keys` for `keys.rs`).
    module: String,
    /// The text with comments, string and char literal contents and `#[cfg(test)]` items blanked
    /// out (newlines kept, so offsets give the same line numbers).
    code: String,
    /// The string literals outside `#[cfg(test)]` items: (line, contents).
    strings: Vec<(usize, String)>,
}

/// One `crate::<module>` path in a file's code.
struct Use {
    line: usize,
    target: String,
}

impl Source {
    fn read(root: &Path, path: &Path) -> Source {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        let module = file.split('/').next().unwrap().trim_end_matches(".rs").to_string();
        let (code, strings) = scan(&text);
        Source { file, module, code, strings }
    }

    fn line_at(&self, offset: usize) -> usize {
        line_of(&self.code, offset)
    }

    /// The top-level modules this file names through `crate::`, `use crate::{…}` groups included.
    fn uses(&self) -> Vec<Use> {
        heads_after(&self.code, "crate::")
            .into_iter()
            .map(|(at, target)| Use { line: self.line_at(at), target })
            .collect()
    }

    /// Each occurrence of `word` as a whole identifier in the code: its line.
    fn word_lines(&self, word: &str) -> Vec<usize> {
        let bytes = self.code.as_bytes();
        self.code
            .match_indices(word)
            .filter(|(at, _)| {
                let before = at.checked_sub(1).map(|i| bytes[i]);
                let after = bytes.get(at + word.len()).copied();
                !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
            })
            .map(|(at, _)| self.line_at(at))
            .collect()
    }
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset].iter().filter(|b| **b == b'\n').count() + 1
}

/// The identifier right after each `prefix` (a path like `crate::store::Store` gives `store`),
/// and the head of every element of a `prefix{…}` group: (offset, identifier).
fn heads_after(code: &str, prefix: &str) -> Vec<(usize, String)> {
    let bytes = code.as_bytes();
    let ident_at =
        |from: usize| -> String { bytes[from..].iter().take_while(|b| is_ident(**b)).map(|b| *b as char).collect() };
    let mut heads = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        if at > 0 && is_ident(bytes[at - 1]) {
            continue; // `$crate::`-like or part of a longer path such as `my_crate::`
        }
        let next = at + prefix.len();
        if bytes.get(next) != Some(&b'{') {
            heads.push((at, ident_at(next)));
            continue;
        }
        // A group: at depth 1, an identifier that starts an element is a head.
        let (mut depth, mut starts_element) = (0, true);
        let mut i = next;
        while i < bytes.len() {
            match bytes[i] {
                b'{' => depth += 1,
                b'}' if depth == 1 => break,
                b'}' => depth -= 1,
                b',' if depth == 1 => starts_element = true,
                b if depth == 1 && starts_element && is_ident(b) => {
                    let head = ident_at(i);
                    i += head.len();
                    heads.push((i, head));
                    starts_element = false;
                    continue;
                }
                b if !b.is_ascii_whitespace() => starts_element = false,
                _ => {}
            }
            i += 1;
        }
    }
    heads.retain(|(_, head)| !head.is_empty());
    heads
}

/// Blanks comments and literal contents, then `#[cfg(test)]` items; returns the code and the
/// string literals outside those items. Works on bytes: every delimiter is ASCII and a blanked
/// range starts and ends on one, so the code stays UTF-8.
fn scan(text: &str) -> (String, Vec<(usize, String)>) {
    let src = text.as_bytes();
    let mut code = src.to_vec();
    let mut literals: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < src.len() {
        let next = src.get(i + 1).copied();
        let end = match src[i] {
            b'/' if next == Some(b'/') => src[i..].iter().position(|b| *b == b'\n').map_or(src.len(), |n| i + n),
            b'/' if next == Some(b'*') => block_comment_end(src, i),
            b'"' => {
                let end = string_end(src, i + 1);
                literals.push((i + 1, end - 1));
                blank(&mut code, i + 1, end - 1);
                i = end;
                continue;
            }
            b'r' if starts_raw_string(src, i) => {
                let hashes = src[i + 1..].iter().take_while(|b| **b == b'#').count();
                let open = i + 1 + hashes + 1;
                let close = raw_string_close(src, open, hashes);
                literals.push((open, close));
                blank(&mut code, open, close);
                i = (close + 1 + hashes).min(src.len());
                continue;
            }
            b'\'' => match char_literal_end(src, i) {
                Some(end) => {
                    blank(&mut code, i + 1, end - 1);
                    i = end;
                    continue;
                }
                None => i + 1, // a lifetime
            },
            _ => {
                i += 1;
                continue;
            }
        };
        if end > i + 1 && src[i] == b'/' {
            blank(&mut code, i, end);
        }
        i = end;
    }
    let tests = test_items(&code);
    for (from, to) in &tests {
        blank(&mut code, *from, *to);
    }
    let code = String::from_utf8(code).expect("blanking keeps UTF-8");
    let strings = literals
        .into_iter()
        .filter(|(from, _)| !tests.iter().any(|(a, b)| (*a..*b).contains(from)))
        .map(|(from, to)| (line_of(&code, from), text[from..to].to_string()))
        .collect();
    (code, strings)
}

fn blank(code: &mut [u8], from: usize, to: usize) {
    for b in &mut code[from..to] {
        if *b != b'\n' {
            *b = b' ';
        }
    }
}

/// The end of a (nested) block comment starting at `start`.
fn block_comment_end(src: &[u8], start: usize) -> usize {
    let (mut depth, mut i) = (0, start);
    while i + 1 < src.len() {
        match (src[i], src[i + 1]) {
            (b'/', b'*') => (depth, i) = (depth + 1, i + 2),
            (b'*', b'/') if depth == 1 => return i + 2,
            (b'*', b'/') => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
    }
    src.len()
}

/// Just past the closing quote of a string whose contents start at `from`.
fn string_end(src: &[u8], from: usize) -> usize {
    let mut i = from;
    while i < src.len() {
        match src[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    src.len()
}

/// `r"`, `r#"`, `br"`…: an `r` that is not the end of an identifier, then hashes and a quote.
fn starts_raw_string(src: &[u8], i: usize) -> bool {
    let before = |n: usize| i.checked_sub(n).map(|j| src[j]);
    let own_start = !before(1).is_some_and(is_ident) || (before(1) == Some(b'b') && !before(2).is_some_and(is_ident));
    let hashes = src[i + 1..].iter().take_while(|b| **b == b'#').count();
    own_start && src.get(i + 1 + hashes) == Some(&b'"')
}

/// The offset of the quote that closes a raw string with `hashes` hashes.
fn raw_string_close(src: &[u8], open: usize, hashes: usize) -> usize {
    let mut i = open;
    while i < src.len() {
        if src[i] == b'"' && src[i + 1..].iter().take(hashes).filter(|b| **b == b'#').count() == hashes {
            return i;
        }
        i += 1;
    }
    src.len()
}

/// Just past a char literal starting at the quote `i` (`'x'`, `'→'`, `'\n'`, `'\''`); None for a
/// lifetime (`'a`, `'static`).
fn char_literal_end(src: &[u8], i: usize) -> Option<usize> {
    match src.get(i + 1)? {
        b'\\' => src[i + 3..].iter().position(|b| *b == b'\'').map(|n| i + 3 + n + 1),
        lead => {
            let len = match lead.leading_ones() {
                0 => 1,
                n => n as usize,
            };
            (src.get(i + 1 + len) == Some(&b'\'')).then_some(i + 2 + len)
        }
    }
}

/// The byte ranges of `#[cfg(test)]` items: the attribute up to the item's `;` or its closing
/// brace, at bracket depth 0.
fn test_items(code: &[u8]) -> Vec<(usize, usize)> {
    const ATTR: &[u8] = b"#[cfg(test)]";
    let mut items = Vec::new();
    let mut at = 0;
    while let Some(n) = code[at..].windows(ATTR.len()).position(|w| w == ATTR) {
        let start = at + n;
        let mut depth = 0i32;
        let mut end = code.len();
        for (i, b) in code.iter().enumerate().skip(start + ATTR.len()) {
            match b {
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' => depth -= 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        items.push((start, end));
        at = end;
    }
    items
}

/// Whether a string literal is SQL: `SELECT`, `INSERT INTO`, `UPDATE <table> SET`,
/// `DELETE FROM` or `CREATE TABLE` as words (SQL in this code base is upper case).
fn is_sql(text: &str) -> bool {
    let words: Vec<&str> =
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
    words.iter().enumerate().any(|(i, w)| {
        let next = |n: usize| words.get(i + n).copied();
        match *w {
            "SELECT" => true,
            "INSERT" => next(1) == Some("INTO"),
            "DELETE" => next(1) == Some("FROM"),
            "CREATE" => next(1) == Some("TABLE"),
            "UPDATE" => next(2) == Some("SET"),
            _ => false,
        }
    })
}

fn src_dir() -> &'static Path {
    static SRC: OnceLock<std::path::PathBuf> = OnceLock::new();
    SRC.get_or_init(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// Every `.rs` file of `src/` but `lib.rs` and `main.rs` (the crate root declares the modules).
fn sources() -> &'static [Source] {
    static SOURCES: OnceLock<Vec<Source>> = OnceLock::new();
    SOURCES.get_or_init(|| {
        let mut files = Vec::new();
        let mut dirs = vec![src_dir().to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        files.sort();
        files.iter().map(|p| Source::read(src_dir(), p)).filter(|s| s.file != "lib.rs" && s.file != "main.rs").collect()
    })
}

/// The layers of `src/lib.rs`'s table, top (programs) first, each with its modules.
fn layers() -> &'static [(String, Vec<String>)] {
    static LAYERS: OnceLock<Vec<(String, Vec<String>)>> = OnceLock::new();
    LAYERS.get_or_init(|| {
        let lib = std::fs::read_to_string(src_dir().join("lib.rs")).unwrap();
        let mut layers: Vec<(String, Vec<String>)> = Vec::new();
        for row in lib.lines().filter_map(|l| l.strip_prefix("//! |")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let (layer, modules) = (cells[0], cells.get(1).copied().unwrap_or(""));
            if layer == "layer" || layer.starts_with('-') {
                continue; // the header and its rule
            }
            if !layer.is_empty() {
                layers.push((layer.to_string(), Vec::new()));
            }
            let names = modules.split('`').skip(1).step_by(2).map(String::from);
            layers.last_mut().expect("the table's first row names a layer").1.extend(names);
        }
        layers
    })
}

/// Each module's layer: (index from the top, name).
fn layer_of() -> BTreeMap<&'static str, (usize, &'static str)> {
    let mut map = BTreeMap::new();
    for (i, (layer, modules)) in layers().iter().enumerate() {
        for m in modules {
            map.insert(m.as_str(), (i, layer.as_str()));
        }
    }
    map
}

/// Every arrow between two top-level modules: (from, to) → the first file and line that makes it.
fn arrows() -> BTreeMap<(String, String), (String, usize)> {
    let layer = layer_of();
    let mut arrows = BTreeMap::new();
    for s in sources() {
        for u in s.uses() {
            if u.target != s.module && layer.contains_key(u.target.as_str()) {
                arrows.entry((s.module.clone(), u.target)).or_insert((s.file.clone(), u.line));
            }
        }
    }
    arrows
}

fn violations() -> &'static [Violation] {
    static VIOLATIONS: OnceLock<Vec<Violation>> = OnceLock::new();
    VIOLATIONS.get_or_init(|| {
        let mut found = Vec::new();
        for s in sources() {
            found.extend(layer_order(s));
            found.extend(sql_outside_the_store(s));
            found.extend(policy_io(s));
            let banned: &[&str] = match s.module.as_str() {
                "tools" => &["store", "runner"],
                "engine" => &["server", "tools"],
                _ => &[],
            };
            for u in s.uses().into_iter().filter(|u| banned.contains(&u.target.as_str())) {
                let rule = if s.module == "tools" {
                    Rule::ToolsReachNeitherStoreNorRunner
                } else {
                    Rule::EngineKnowsNeitherServerNorTools
                };
                found.push(Violation {
                    file: s.file.clone(),
                    line: u.line,
                    rule,
                    what: format!("uses crate::{}", u.target),
                });
            }
        }
        found.extend(cycle());
        found
    })
}

fn layer_order(s: &Source) -> Vec<Violation> {
    let layer = layer_of();
    let Some(&(own, own_name)) = layer.get(s.module.as_str()) else { return Vec::new() };
    s.uses()
        .into_iter()
        .filter_map(|u| {
            let &(theirs, their_name) = layer.get(u.target.as_str())?;
            (theirs < own).then(|| Violation {
                file: s.file.clone(),
                line: u.line,
                rule: Rule::LayerOrder,
                what: format!(
                    "`{}` (layer {own_name}) uses crate::{} (layer {their_name}, above it)",
                    s.module, u.target
                ),
            })
        })
        .collect()
}

fn sql_outside_the_store(s: &Source) -> Vec<Violation> {
    if s.module == "store" {
        return Vec::new();
    }
    let violation =
        |line: usize, what: String| Violation { file: s.file.clone(), line, rule: Rule::OnlyTheStoreSpeaksSql, what };
    let sql = s.strings.iter().filter(|(_, text)| is_sql(text)).map(|(line, text)| {
        let shown: String = text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(60).collect();
        violation(*line, format!("SQL in a string literal: \"{shown}…\""))
    });
    let named = s.word_lines("rusqlite").into_iter().map(|line| violation(line, "names rusqlite".to_string()));
    sql.chain(named).collect()
}

fn policy_io(s: &Source) -> Vec<Violation> {
    if s.module != "policy" {
        return Vec::new();
    }
    let violation =
        |line: usize, what: String| Violation { file: s.file.clone(), line, rule: Rule::PolicyIsPure, what };
    let uses = s
        .uses()
        .into_iter()
        .filter(|u| !["policy", "config", "keys"].contains(&u.target.as_str()))
        .map(|u| violation(u.line, format!("uses crate::{}", u.target)));
    let io = heads_after(&s.code, "std::")
        .into_iter()
        .filter(|(_, head)| ["fs", "net", "process"].contains(&head.as_str()))
        .map(|(at, head)| violation(s.line_at(at), format!("uses std::{head}")));
    let tokio = s.word_lines("tokio").into_iter().map(|line| violation(line, "uses tokio".to_string()));
    uses.chain(io).chain(tokio).collect()
}

/// The first cycle between top-level modules, as one violation naming each arrow's first use.
fn cycle() -> Option<Violation> {
    let arrows = arrows();
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in arrows.keys() {
        next.entry(from.as_str()).or_default().insert(to.as_str());
    }
    fn walk<'a>(
        m: &'a str,
        next: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<&'a str>> {
        if let Some(at) = path.iter().position(|p| *p == m) {
            let mut cycle = path[at..].to_vec();
            cycle.push(m);
            return Some(cycle);
        }
        if !done.insert(m) {
            return None;
        }
        path.push(m);
        let found = next.get(m).into_iter().flatten().find_map(|n| walk(n, next, path, done));
        path.pop();
        found
    }
    let mut done = BTreeSet::new();
    let modules: Vec<&str> = next.keys().copied().collect();
    let found = modules.into_iter().find_map(|m| walk(m, &next, &mut Vec::new(), &mut done))?;
    let steps: Vec<String> = found
        .windows(2)
        .map(|w| {
            let (file, line) = &arrows[&(w[0].to_string(), w[1].to_string())];
            format!("{} → {} (src/{file}:{line})", w[0], w[1])
        })
        .collect();
    let (file, line) = arrows[&(found[0].to_string(), found[1].to_string())].clone();
    Some(Violation { file, line, rule: Rule::NoCycle, what: format!("cycle: {}", steps.join(", ")) })
}

fn assert_holds(rule: Rule) {
    let broken: Vec<String> = violations().iter().filter(|v| v.rule == rule).map(ToString::to_string).collect();
    assert!(broken.is_empty(), "{} place(s) break \"{rule}\":\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn every_module_of_src_has_one_layer_in_the_lib_rs_table() {
    let in_src: BTreeSet<&str> = sources().iter().map(|s| s.module.as_str()).collect();
    let mut seen = BTreeSet::new();
    for (layer, modules) in layers() {
        for m in modules {
            assert!(seen.insert(m.as_str()), "src/lib.rs's table names `{m}` twice (again in layer {layer})");
            assert!(
                in_src.contains(m.as_str()),
                "src/lib.rs's table names `{m}` (layer {layer}), which src/ does not have"
            );
        }
    }
    let missing: Vec<&str> = in_src.difference(&seen).copied().collect();
    assert!(
        missing.is_empty(),
        "modules with no layer in src/lib.rs's table: {missing:?}; add each to its layer's row"
    );
    assert!(layers().len() >= 2, "the table of src/lib.rs was not found or not read: {:?}", layers());
}

#[test]
fn modules_use_only_their_own_layer_or_below() {
    assert_holds(Rule::LayerOrder);
}

#[test]
fn no_cycle_between_top_level_modules() {
    assert_holds(Rule::NoCycle);
}

#[test]
fn only_the_store_speaks_sql() {
    assert_holds(Rule::OnlyTheStoreSpeaksSql);
}

#[test]
fn policy_uses_only_config_and_keys_and_does_no_io() {
    assert_holds(Rule::PolicyIsPure);
}

#[test]
fn tools_reach_neither_the_store_nor_the_runner() {
    assert_holds(Rule::ToolsReachNeitherStoreNorRunner);
}

#[test]
fn the_engine_knows_neither_the_server_nor_the_tools() {
    assert_holds(Rule::EngineKnowsNeitherServerNorTools);
}

#[test]
fn the_scanner_reads_code_and_strings_but_not_comments_or_tests() {
    let text = r####"
//! A doc naming crate::server.
use crate::{keys::{self, SessionKey}, config};
/* a block /* nested */ crate::tools */
fn f<'a>(s: &'a str) -> char { let _ = crate::store::now_ms(); '{' }
const Q: &str = "SELECT 1 FROM t // not a comment";
const R: &str = r#"UPDATE sessions SET x = "y""#;
#[cfg(test)]
mod tests { fn g() { let _ = crate::runner::x(); let _ = "DELETE FROM t"; } }
"####;
    let (code, strings) = scan(text);
    let heads: Vec<String> = heads_after(&code, "crate::").into_iter().map(|(_, h)| h).collect();
    assert_eq!(heads, ["keys", "config", "store"], "{code}");
    let sql: Vec<&str> = strings.iter().map(|(_, s)| s.as_str()).filter(|s| is_sql(s)).collect();
    assert_eq!(sql, ["SELECT 1 FROM t // not a comment", "UPDATE sessions SET x = \"y\""]);
    assert_eq!(strings[0].0, 6, "string literals keep their line");
    assert!(!is_sql("select one of them") && !is_sql("UPDATED"), "only upper-case SQL words count");
}
