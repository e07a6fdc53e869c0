//! Our own argument parsing from the raw JSON object, so that every bad input gets the tool's
//! JSON error body naming the field and what is allowed (rmcp's `Parameters<T>` would answer with
//! a serde message instead).
//!
//! Rules (docs/BEHAVIOUR.md, Tools): camelCase names, the reference's snake_case aliases accepted, unknown names
//! rejected listing the allowed ones, numbers as JSON integers or floats (floored), negative
//! numbers invalid, values above a maximum clamped and reported.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::ToolError;

/// Reads one tool's arguments; [`ArgReader::finish`] rejects whatever was not read.
pub struct ArgReader {
    args: Map<String, Value>,
    allowed: Vec<String>,
    /// Fields whose value was clamped: name → applied value.
    clamped: BTreeMap<String, Value>,
}

/// A number argument's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub min: u64,
    pub max: u64,
}

impl ArgReader {
    /// `allowed` are the camelCase property names of the tool's input schema.
    pub fn new(args: Option<Map<String, Value>>, allowed: Vec<String>) -> Result<Self, ToolError> {
        let raw = args.unwrap_or_default();
        let mut args = Map::new();
        for (name, value) in raw {
            let canonical = allowed.iter().find(|a| **a == name || snake_case(a) == name).cloned();
            match canonical {
                Some(c) if args.contains_key(&c) => {
                    return Err(ToolError::invalid(format!(
                        "{c} given twice (as {c} and as {}); pass it once",
                        snake_case(&c)
                    )));
                }
                Some(c) => {
                    args.insert(c, value);
                }
                None => {
                    return Err(ToolError::invalid(format!(
                        "unknown argument {name:?}; allowed: {}",
                        if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") }
                    )));
                }
            }
        }
        Ok(ArgReader { args, allowed, clamped: BTreeMap::new() })
    }

    fn take(&mut self, name: &str) -> Option<Value> {
        debug_assert!(self.allowed.iter().any(|a| a == name), "{name} is not in the input schema");
        self.args.remove(name).filter(|v| !v.is_null())
    }

    /// The arguments not read yet, under their camelCase names (what an idempotency key
    /// fingerprints, read before the first field).
    pub fn raw(&self) -> Value {
        Value::Object(self.args.clone())
    }

    /// Whether the caller passed `name` at all (before it is read).
    pub fn has(&self, name: &str) -> bool {
        self.args.get(name).is_some_and(|v| !v.is_null())
    }

    /// An optional string, trimmed; empty counts as absent unless `keep_empty`.
    pub fn opt_string(&mut self, name: &str, max_bytes: usize) -> Result<Option<String>, ToolError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => {
                if s.len() > max_bytes {
                    return Err(ToolError::invalid(format!(
                        "{name} is too long ({} bytes); at most {max_bytes} bytes are allowed",
                        s.len()
                    )));
                }
                let t = s.trim();
                Ok(if t.is_empty() { None } else { Some(t.to_string()) })
            }
            Some(other) => Err(wrong_type(name, "a string", &other)),
        }
    }

    /// A required session reference, untrimmed, so that a control character at either end is
    /// seen (and refused) by the key parser instead of being trimmed away.
    pub fn req_key(&mut self, name: &str, max_bytes: usize) -> Result<String, ToolError> {
        let raw = self.args.get(name).and_then(Value::as_str).map(String::from);
        let trimmed = self.req_string(name, max_bytes)?;
        Ok(raw.filter(|r| r.chars().any(char::is_control)).unwrap_or(trimmed))
    }

    /// An optional session reference, untrimmed like [`ArgReader::req_key`].
    pub fn opt_key(&mut self, name: &str, max_bytes: usize) -> Result<Option<String>, ToolError> {
        let raw = self.args.get(name).and_then(Value::as_str).map(String::from);
        let trimmed = self.opt_string(name, max_bytes)?;
        Ok(trimmed.map(|t| raw.filter(|r| r.chars().any(char::is_control)).unwrap_or(t)))
    }

    /// A required, non-empty string.
    pub fn req_string(&mut self, name: &str, max_bytes: usize) -> Result<String, ToolError> {
        let present = self.has(name);
        self.opt_string(name, max_bytes)?.ok_or_else(|| {
            ToolError::invalid(if present { format!("{name} must not be empty") } else { format!("{name} required") })
        })
    }

    /// An optional value from a closed set, matched regardless of ASCII case; anything else is
    /// invalid, naming the field and the set.
    pub fn opt_choice(&mut self, name: &str, allowed: &[&'static str]) -> Result<Option<&'static str>, ToolError> {
        let Some(v) = self.opt_string(name, 64)? else { return Ok(None) };
        match allowed.iter().find(|a| a.eq_ignore_ascii_case(&v)) {
            Some(a) => Ok(Some(a)),
            None => Err(ToolError::invalid(format!("{name} {v:?} is not allowed; allowed: {}", allowed.join(", ")))),
        }
    }

    /// A required value from a closed set: missing, it is named with the set too, so a caller
    /// learns what to pass from the first error.
    pub fn req_choice(&mut self, name: &str, allowed: &[&'static str]) -> Result<&'static str, ToolError> {
        let present = self.has(name);
        self.opt_choice(name, allowed)?.ok_or_else(|| {
            let problem = if present { "must not be empty" } else { "required" };
            ToolError::invalid(format!("{name} {problem}; allowed: {}", allowed.join(", ")))
        })
    }

    /// An optional non-negative number, floored, clamped to `bounds.max` (reported), and at least
    /// `bounds.min` (below it is invalid).
    pub fn opt_number(&mut self, name: &str, bounds: Bounds) -> Result<Option<u64>, ToolError> {
        let Some(v) = self.take(name) else { return Ok(None) };
        let Some(n) = v.as_f64() else { return Err(wrong_type(name, "a number", &v)) };
        if n < 0.0 {
            return Err(ToolError::invalid(format!(
                "{name} must not be negative (got {v}); allowed: {}..{}",
                bounds.min, bounds.max
            )));
        }
        let floored = n.floor();
        if floored < bounds.min as f64 {
            return Err(ToolError::invalid(format!(
                "{name} must be at least {} (got {v}); allowed: {}..{}",
                bounds.min, bounds.min, bounds.max
            )));
        }
        if floored > bounds.max as f64 {
            self.clamped.insert(name.to_string(), bounds.max.into());
            return Ok(Some(bounds.max));
        }
        Ok(Some(floored as u64))
    }

    /// An optional signed number (e.g. a seq), floored; negative is invalid.
    pub fn opt_seq(&mut self, name: &str) -> Result<Option<i64>, ToolError> {
        self.opt_number(name, Bounds { min: 0, max: i64::MAX as u64 }).map(|o| o.map(|n| n as i64))
    }

    pub fn opt_bool(&mut self, name: &str) -> Result<Option<bool>, ToolError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(wrong_type(name, "true or false", &other)),
        }
    }

    /// An optional list of strings; a single string is accepted as a one-element list.
    pub fn opt_string_list(&mut self, name: &str, max_items: usize) -> Result<Option<Vec<String>>, ToolError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(vec![s.trim().to_string()])),
            Some(Value::Array(items)) => {
                if items.len() > max_items {
                    return Err(ToolError::invalid(format!("{name} has {} items; at most {max_items}", items.len())));
                }
                items
                    .into_iter()
                    .map(|i| match i {
                        Value::String(s) => Ok(s.trim().to_string()),
                        other => Err(wrong_type(&format!("{name}[]"), "a string", &other)),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)
            }
            Some(other) => Err(wrong_type(name, "a list of strings", &other)),
        }
    }

    /// An optional raw value (for nested objects the tool validates itself).
    pub fn opt_value(&mut self, name: &str) -> Option<Value> {
        self.take(name)
    }

    /// Ends parsing: everything passed was read. Returns the clamped fields.
    pub fn finish(self) -> Result<BTreeMap<String, Value>, ToolError> {
        if let Some(name) = self.args.keys().next() {
            return Err(ToolError::invalid(format!("argument {name} is not used by this tool")));
        }
        Ok(self.clamped)
    }
}

fn wrong_type(name: &str, expected: &str, got: &Value) -> ToolError {
    let kind = match got {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    ToolError::invalid(format!("{name} must be {expected}, got {kind}"))
}

/// `sessionKey` → `session_key`.
pub fn snake_case(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reader(v: Value) -> Result<ArgReader, ToolError> {
        ArgReader::new(v.as_object().cloned(), vec!["sessionKey".into(), "limit".into(), "includeTools".into()])
    }

    #[test]
    fn snake_case_aliases_and_unknowns() {
        let mut r = reader(json!({"session_key": "main"})).unwrap();
        assert_eq!(r.req_string("sessionKey", 100).unwrap(), "main");
        let e = reader(json!({"sessionKey": "a", "session_key": "b"})).err().unwrap();
        assert!(e.message.contains("given twice"));
        let e = reader(json!({"bogus": 1})).err().unwrap();
        assert!(e.message.contains("allowed: sessionKey, limit, includeTools"), "{}", e.message);
    }

    #[test]
    fn choices_name_the_field_and_the_set_when_missing_or_wrong() {
        let set = &["list", "wait"];
        let mut r = ArgReader::new(json!({}).as_object().cloned(), vec!["action".into()]).unwrap();
        assert_eq!(r.req_choice("action", set).unwrap_err().message, "action required; allowed: list, wait");
        let mut r = ArgReader::new(json!({"action": " "}).as_object().cloned(), vec!["action".into()]).unwrap();
        assert_eq!(r.req_choice("action", set).unwrap_err().message, "action must not be empty; allowed: list, wait");
        let mut r = ArgReader::new(json!({"action": "stop"}).as_object().cloned(), vec!["action".into()]).unwrap();
        assert_eq!(
            r.req_choice("action", set).unwrap_err().message,
            "action \"stop\" is not allowed; allowed: list, wait"
        );
        let mut r = ArgReader::new(json!({"action": "WAIT"}).as_object().cloned(), vec!["action".into()]).unwrap();
        assert_eq!(r.req_choice("action", set).unwrap(), "wait");
    }

    #[test]
    fn numbers_floor_clamp_and_refuse_negatives() {
        let b = Bounds { min: 1, max: 1000 };
        let mut r = reader(json!({"limit": 2.9})).unwrap();
        assert_eq!(r.opt_number("limit", b).unwrap(), Some(2));
        let mut r = reader(json!({"limit": 5000})).unwrap();
        assert_eq!(r.opt_number("limit", b).unwrap(), Some(1000));
        assert_eq!(r.finish().unwrap().get("limit"), Some(&json!(1000)));
        let mut r = reader(json!({"limit": -1})).unwrap();
        assert!(r.opt_number("limit", b).unwrap_err().message.contains("negative"));
        let mut r = reader(json!({"limit": 0})).unwrap();
        assert!(r.opt_number("limit", b).unwrap_err().message.contains("at least 1"));
        let mut r = reader(json!({"limit": "10"})).unwrap();
        assert!(r.opt_number("limit", b).unwrap_err().message.contains("must be a number, got a string"));
    }

    #[test]
    fn required_strings_say_required_or_empty() {
        let mut r = reader(json!({})).unwrap();
        assert_eq!(r.req_string("sessionKey", 10).unwrap_err().message, "sessionKey required");
        let mut r = reader(json!({"sessionKey": "  "})).unwrap();
        assert!(r.req_string("sessionKey", 10).unwrap_err().message.contains("must not be empty"));
        let mut r = reader(json!({"includeTools": "yes"})).unwrap();
        assert!(r.opt_bool("includeTools").unwrap_err().message.contains("true or false"));
    }
}
