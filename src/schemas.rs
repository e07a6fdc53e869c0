//! The JSON Schema dialect of everything we publish (the tools' input and output schemas, the
//! config schema): JSON Schema 2020-12 with only the spec's own `format`s, and for inputs the
//! subset every model's function calling accepts.

use schemars::generate::SchemaSettings;
use schemars::transform::RecursiveTransform;
use schemars::{JsonSchema, Schema};
use serde_json::Value;

/// The settings of every schema we publish (tools and config): JSON Schema 2020-12 with only the
/// spec's own `format`s (see `without_custom_format`).
pub fn published_settings() -> SchemaSettings {
    SchemaSettings::draft2020_12().with(|s| s.transforms.push(Box::new(RecursiveTransform(without_custom_format))))
}

/// Input schemas in the subset every model's function calling accepts: an optional argument is
/// one plain type, absent from `required` (Gemini refuses `"type": [T, "null"]`, and one such tool
/// fails every request of the session), and no `$ref`s. An explicit `null` is still read as absent.
pub fn input_settings() -> SchemaSettings {
    published_settings().with(|s| {
        s.inline_subschemas = true;
        s.transforms.push(Box::new(RecursiveTransform(without_null)));
    })
}

/// The `format`s JSON Schema 2020-12 defines that Ajv (with ajv-formats) also knows.
pub(crate) const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "uri-template",
    "uuid",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Drops a `format` outside [`STANDARD_FORMATS`]: schemars marks numbers `uint`, `int64`,
/// `double`, ..., which Ajv-based clients (the TypeScript SDK, Gemini CLI, the Inspector) log as
/// `unknown format "uint" ignored`. The range stays in `minimum`/`maximum`, and the other keys
/// keep their order.
fn without_custom_format(schema: &mut Schema) {
    if schema.get("format").and_then(Value::as_str).is_some_and(|f| !STANDARD_FORMATS.contains(&f))
        && let Some(o) = schema.as_object_mut()
    {
        o.shift_remove("format");
    }
}

/// Takes `null` out of a schema's `type`, `enum` and `anyOf` (what `Option<T>` puts there).
fn without_null(schema: &mut Schema) {
    if let Some(Value::Array(types)) = schema.get_mut("type") {
        types.retain(|t| t != "null");
        if let [single] = types.as_slice() {
            let single = single.clone();
            schema.insert("type".into(), single);
        }
    }
    if let Some(Value::Array(values)) = schema.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    if let Some(Value::Array(branches)) = schema.get_mut("anyOf") {
        branches.retain(|b| b.get("type").is_none_or(|t| t != "null"));
        if let [Value::Object(only)] = branches.as_slice() {
            let only = only.clone();
            schema.remove("anyOf");
            for (k, v) in only {
                schema.insert(k, v);
            }
        }
    }
}

/// A JSON schema for `T` without the root title (clients show the tool's own title).
pub fn schema<T: JsonSchema>(settings: SchemaSettings) -> Value {
    let root = settings.into_generator().into_root_schema_for::<T>();
    let mut v = serde_json::to_value(root).expect("schema serialises");
    if let Some(o) = v.as_object_mut() {
        o.remove("title");
    }
    v
}
