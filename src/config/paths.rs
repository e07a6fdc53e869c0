//! Key-path classification: ours (from our config schema), reference (the checked-in list of
//! OpenClaw 2026.3.13 config paths), unknown (an error naming the nearest known key).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::{Map, Value};

/// The reference's config key paths, extracted from npm `openclaw@2026.3.13`.
const REFERENCE_PATHS: &str = include_str!("reference_paths.txt");

/// The result of classifying a raw config value.
#[derive(Debug)]
pub struct Classified {
    /// The value with every non-ours path removed.
    pub ours: Value,
    /// Reference paths present in the file (top-most only), accepted and ignored.
    pub reference: Vec<String>,
    /// One message per unknown path.
    pub unknown: Vec<String>,
}

/// The shape of our config as far as key paths go.
#[derive(Debug)]
enum Shape {
    Leaf,
    Object(BTreeMap<String, Shape>),
    Map(Box<Shape>),
    Array(Box<Shape>),
}

impl Shape {
    fn child(&self, key: &str) -> Option<&Shape> {
        match self {
            Shape::Object(fields) => fields.get(key),
            Shape::Map(inner) => Some(inner),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<String> {
        match self {
            Shape::Object(fields) => fields.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

/// A trie of reference paths; `*` matches any key. A `*` with nothing listed below it is a
/// free-form value: everything deeper is accepted.
#[derive(Debug, Default)]
struct Trie {
    children: BTreeMap<String, Trie>,
    star: bool,
}

impl Trie {
    fn insert(&mut self, path: &str) {
        let mut node = self;
        for seg in path.split('.') {
            let (name, arrays) = split_array_suffix(seg);
            node = node.children.entry(name.to_string()).or_default();
            node.star = name == "*";
            for _ in 0..arrays {
                node = node.children.entry("[]".to_string()).or_default();
            }
        }
    }

    fn any_below(&self) -> bool {
        self.star && self.children.is_empty()
    }

    fn child(&self, key: &str) -> Option<&Trie> {
        self.children.get(key).or_else(|| self.children.get("*"))
    }
}

fn split_array_suffix(seg: &str) -> (&str, usize) {
    let mut name = seg;
    let mut n = 0;
    while let Some(stripped) = name.strip_suffix("[]") {
        name = stripped;
        n += 1;
    }
    (name, n)
}

fn reference_trie() -> &'static Trie {
    static TRIE: OnceLock<Trie> = OnceLock::new();
    TRIE.get_or_init(|| {
        let mut trie = Trie::default();
        for line in REFERENCE_PATHS.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            trie.insert(line);
        }
        trie
    })
}

fn our_shape() -> &'static Shape {
    static SHAPE: OnceLock<Shape> = OnceLock::new();
    SHAPE.get_or_init(|| {
        let schema = super::json_schema();
        let defs = schema.get("$defs").and_then(Value::as_object).cloned().unwrap_or_default();
        shape_of(&schema, &defs, 0)
    })
}

fn shape_of(schema: &Value, defs: &Map<String, Value>, depth: usize) -> Shape {
    if depth > 32 {
        return Shape::Leaf;
    }
    if let Some(name) = schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
        return defs.get(name).map_or(Shape::Leaf, |d| shape_of(d, defs, depth + 1));
    }
    for combinator in ["anyOf", "oneOf", "allOf"] {
        if let Some(variants) = schema.get(combinator).and_then(Value::as_array) {
            for v in variants {
                let s = shape_of(v, defs, depth + 1);
                if !matches!(s, Shape::Leaf) {
                    return s;
                }
            }
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        return Shape::Object(props.iter().map(|(k, v)| (k.clone(), shape_of(v, defs, depth + 1))).collect());
    }
    if let Some(ap) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        return Shape::Map(Box::new(shape_of(ap, defs, depth + 1)));
    }
    if let Some(items) = schema.get("items").filter(|v| v.is_object()) {
        return Shape::Array(Box::new(shape_of(items, defs, depth + 1)));
    }
    Shape::Leaf
}

/// Splits a raw config into our part, the reference paths it holds and the unknown ones.
pub fn classify(mut raw: Value) -> Classified {
    let mut out = Classified { ours: Value::Null, reference: Vec::new(), unknown: Vec::new() };
    walk(&mut raw, Some(our_shape()), Some(reference_trie()), "", &mut out);
    out.ours = raw;
    out
}

fn walk(value: &mut Value, ours: Option<&Shape>, reference: Option<&Trie>, path: &str, out: &mut Classified) {
    match value {
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let child_path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                let our_child = ours.and_then(|s| s.child(&key));
                let ref_child = reference.and_then(|t| t.child(&key));
                let ref_any = reference.is_some_and(Trie::any_below);
                if let Some(shape) = our_child {
                    let v = map.get_mut(&key).expect("key listed");
                    walk(v, Some(shape), ref_child, &child_path, out);
                } else if ref_child.is_some() || ref_any {
                    map.remove(&key);
                    out.reference.push(child_path);
                } else {
                    map.remove(&key);
                    out.unknown.push(unknown_message(&child_path, &key, ours, reference));
                }
            }
        }
        Value::Array(items) => {
            let inner = match ours {
                Some(Shape::Array(inner)) => Some(inner.as_ref()),
                _ => None,
            };
            let ref_inner = reference.and_then(|t| t.children.get("[]"));
            if inner.is_none() {
                return;
            }
            for (i, item) in items.iter_mut().enumerate() {
                walk(item, inner, ref_inner, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn unknown_message(path: &str, key: &str, ours: Option<&Shape>, reference: Option<&Trie>) -> String {
    let mut known: Vec<String> = ours.map(Shape::keys).unwrap_or_default();
    if let Some(t) = reference {
        known.extend(t.children.keys().filter(|k| *k != "*" && *k != "[]").cloned());
    }
    known.sort();
    known.dedup();
    let parent = path.strip_suffix(key).unwrap_or("");
    let nearest = known.iter().map(|k| (levenshtein(&k.to_ascii_lowercase(), &key.to_ascii_lowercase()), k)).min();
    match nearest {
        Some((d, k)) if d <= 2.max(key.len() / 3) => {
            format!("unknown config key \"{path}\" (did you mean \"{parent}{k}\"?)")
        }
        _ if known.is_empty() => format!("unknown config key \"{path}\""),
        _ => format!(
            "unknown config key \"{path}\"; known keys here: {}",
            known.iter().take(20).cloned().collect::<Vec<_>>().join(", ")
        ),
    }
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_shape_knows_nested_and_map_paths() {
        let shape = our_shape();
        let tools = shape.child("tools").unwrap();
        assert!(tools.child("sessions").unwrap().child("visibility").is_some());
        let channels = shape.child("channels").unwrap();
        assert!(channels.child("anything").unwrap().child("deliver").is_some());
        let list = shape.child("agents").unwrap().child("list").unwrap();
        assert!(matches!(list, Shape::Array(_)));
    }

    #[test]
    fn levenshtein_counts_edits() {
        assert_eq!(levenshtein("sessions", "sesions"), 1);
        assert_eq!(levenshtein("", "abc"), 3);
    }
}
