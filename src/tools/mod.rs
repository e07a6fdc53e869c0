//! The six session tools: one file each, a shared argument reader, one result shape.
//!
//! Every tool parses its raw arguments itself ([`args::ArgReader`]), asks `access/` for every
//! decision, and returns [`Output`]: its success object or a [`ToolError`] `{status, error}`.
//! Both go out as `structuredContent` (validated by the tool's output schema) and as text.

pub mod agents_list;
pub mod args;
pub mod sessions_history;
pub mod sessions_list;
pub mod sessions_send;
pub mod sessions_spawn;
pub mod subagents;

use std::sync::OnceLock;

use rmcp::model::{CallToolResult, ContentBlock, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::access::Access;
use crate::access::caller::Caller;
pub use crate::access::{ErrorStatus, ToolError};
use crate::policy::ToolName;
pub(crate) use crate::sanitize::json_len;
use crate::schemas::{input_settings, published_settings, schema};

/// A tool's result: its success shape or an error. The schema root is an object (rmcp drops
/// non-object output schemas for pre-2026 peers).
#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
#[schemars(extend("type" = "object"))]
pub enum Output<T> {
    Ok(T),
    Err(ToolError),
}

impl<T> From<Result<T, ToolError>> for Output<T> {
    fn from(r: Result<T, ToolError>) -> Self {
        match r {
            Ok(v) => Output::Ok(v),
            Err(e) => Output::Err(e),
        }
    }
}

/// The one success status of read tools.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OkStatus {
    Ok,
}

pub use crate::engine::Progress;

/// What a tool call runs with.
pub struct Ctx<'a> {
    pub access: &'a Access,
    pub caller: &'a Caller,
    /// The runtime (runs, waits); None where a tool call cannot start runs (benchmarks).
    pub runtime: Option<&'a std::sync::Arc<crate::engine::scheduler::Scheduler>>,
    /// Fires when the client cancels the request (stops a wait, never the run).
    pub cancel: tokio_util::sync::CancellationToken,
    /// Set when the client asked for progress.
    pub progress: Option<Progress>,
    /// The MCP client's name (`clientInfo.name`): which host is calling, when it says.
    pub host: Option<String>,
    /// The requester's project as its MCP client declares it (its roots); None: the serving
    /// process's directory.
    pub project: Option<std::path::PathBuf>,
    /// The client shows the caller's asks to a person (form elicitation, and not a host known to
    /// answer elicitations by itself).
    pub elicits: bool,
}

impl<'a> Ctx<'a> {
    /// The engine for this call.
    pub fn engine(&self) -> crate::engine::Engine<'a> {
        crate::engine::Engine::new(self.access, self.runtime)
    }

    /// The caller's host, as the engine weighs who may answer an ask.
    pub fn host(&self) -> crate::engine::ask::Host<'_> {
        crate::engine::ask::Host { client: self.host.as_deref(), elicits: self.elicits }
    }

    /// A context without runtime, cancellation or progress (in-process calls).
    pub fn plain(access: &'a Access, caller: &'a Caller) -> Self {
        let cancel = tokio_util::sync::CancellationToken::new();
        Ctx { access, caller, runtime: None, cancel, progress: None, host: None, project: None, elicits: false }
    }
}

/// One tool's static description.
pub struct ToolSpec {
    pub name: ToolName,
    pub title: &'static str,
    pub description: &'static str,
    pub read_only: bool,
    pub input: Value,
    pub output: Value,
}

impl ToolSpec {
    fn of<I: JsonSchema, O: JsonSchema>(
        name: ToolName,
        title: &'static str,
        description: &'static str,
        read_only: bool,
    ) -> Self {
        let mut input = schema::<I>(input_settings());
        // Some clients need `properties` even when a tool takes no arguments.
        if let Some(o) = input.as_object_mut() {
            o.entry("properties").or_insert_with(|| Value::Object(Map::new()));
        }
        ToolSpec { name, title, description, read_only, input, output: schema::<Output<O>>(published_settings()) }
    }

    /// The camelCase argument names of the input schema.
    pub fn arg_names(&self) -> Vec<String> {
        self.input.get("properties").and_then(Value::as_object).map(|p| p.keys().cloned().collect()).unwrap_or_default()
    }

    /// The MCP tool definition (title and all four annotations set explicitly).
    pub fn to_tool(&self) -> Tool {
        let obj = |v: &Value| std::sync::Arc::new(v.as_object().cloned().unwrap_or_default());
        let annotations = ToolAnnotations::with_title(self.title)
            .read_only(self.read_only)
            .destructive(false)
            .idempotent(self.read_only)
            .open_world(!self.read_only);
        Tool::new(self.name.as_str(), self.description, obj(&self.input))
            .with_title(self.title)
            .with_raw_output_schema(obj(&self.output))
            .with_annotations(annotations)
    }
}

/// Every tool, in name order.
pub fn specs() -> &'static [ToolSpec] {
    static SPECS: OnceLock<Vec<ToolSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        vec![
            agents_list::spec(),
            sessions_history::spec(),
            sessions_list::spec(),
            sessions_send::spec(),
            sessions_spawn::spec(),
            subagents::spec(),
        ]
    })
}

pub fn spec(name: ToolName) -> &'static ToolSpec {
    specs().iter().find(|s| s.name == name).expect("every tool has a spec")
}

/// Runs tool `name` for the caller. `None` when no such tool exists (a protocol error).
pub async fn call(ctx: &Ctx<'_>, name: &str, args: Option<Map<String, Value>>) -> Option<CallToolResult> {
    Some(run(ctx, ToolName::parse(name)?, args).await)
}

/// Runs `tool` for the caller.
pub async fn run(ctx: &Ctx<'_>, tool: ToolName, args: Option<Map<String, Value>>) -> CallToolResult {
    let structured = match ctx.access.check_tool(ctx.caller, tool) {
        Err(e) => to_value(Output::<()>::Err(e)),
        Ok(()) => match tool {
            ToolName::AgentsList => to_value(agents_list::run(ctx, args)),
            ToolName::SessionsHistory => to_value(sessions_history::run(ctx, args)),
            ToolName::SessionsList => to_value(sessions_list::run(ctx, args)),
            ToolName::SessionsSend => to_value(sessions_send::run(ctx, args).await),
            ToolName::SessionsSpawn => to_value(sessions_spawn::run(ctx, args).await),
            ToolName::Subagents => to_value(subagents::run(ctx, args).await),
        },
    };
    result(within_budget(structured, ctx.access.config().tools.sessions.max_result_bytes))
}

/// Room kept for the field that says where a cut text can be read whole.
const POINTER_ROOM: usize = 48;

/// Cuts the text `field` picks so the whole answer fits `budget`; whether it cut.
pub(crate) fn fit_text_field<T: Serialize>(
    answer: &mut T,
    field: impl Fn(&mut T) -> Option<&mut String>,
    budget: usize,
) -> bool {
    let size = json_len(answer);
    if size <= budget {
        return false;
    }
    let Some(text) = field(answer) else { return false };
    let room = json_len(text).saturating_sub(size - budget + POINTER_ROOM);
    *text = crate::sanitize::cut_to_json_len(text, room);
    true
}

/// The last line of the budget: every tool fits its answer itself (pages, cuts), so this only
/// fires for a shape no tool foresaw, and then the caller learns why instead of getting an
/// answer a host would cut out of the middle.
fn within_budget(structured: Value, budget: usize) -> Value {
    let size = json_len(&structured);
    if size <= budget {
        return structured;
    }
    tracing::warn!(size, budget, "a tool answer did not fit the budget");
    serde_json::json!({"status": "error", "error": format!(
        "the answer ({size} bytes) is larger than tools.sessions.maxResultBytes ({budget}); ask for less (a smaller limit), or raise tools.sessions.maxResultBytes (at most 1048576)"
    )})
}

/// The result of a tool whose success shape is `ok` (a task's final result).
pub(crate) fn final_result<T: Serialize>(ok: T, budget: usize) -> CallToolResult {
    result(within_budget(to_value(Output::Ok(ok)), budget))
}

/// The result of a tool call that failed with `error` (the degraded server's every answer).
pub(crate) fn error_result(error: ToolError) -> CallToolResult {
    result(to_value(Output::<()>::Err(error)))
}

fn to_value<T: Serialize>(out: Output<T>) -> Value {
    serde_json::to_value(out).unwrap_or_else(|e| serde_json::json!({"status": "error", "error": e.to_string()}))
}

/// The MCP result: structuredContent plus the same JSON as text; `isError` from the status.
fn result(structured: Value) -> CallToolResult {
    let is_error = matches!(
        structured.get("status").and_then(Value::as_str),
        Some("error" | "forbidden" | "not_found" | "invalid")
    );
    let text = structured.to_string();
    let mut r = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    r.structured_content = Some(structured);
    r
}

/// Parses arguments with the tool's schema names; maps the result into [`Output`].
pub(crate) fn reader(tool: ToolName, args: Option<Map<String, Value>>) -> Result<args::ArgReader, ToolError> {
    args::ArgReader::new(args, spec(tool).arg_names())
}

/// `{field: appliedValue}` for clamped arguments, or nothing.
pub(crate) fn limit_applied(clamped: std::collections::BTreeMap<String, Value>) -> Option<Map<String, Value>> {
    (!clamped.is_empty()).then(|| clamped.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node of a schema, depth first.
    fn nodes(v: &Value) -> Vec<&Value> {
        let children: Vec<&Value> = match v {
            Value::Object(m) => m.values().collect(),
            Value::Array(a) => a.iter().collect(),
            _ => vec![],
        };
        std::iter::once(v).chain(children.into_iter().flat_map(nodes)).collect()
    }

    #[test]
    fn input_schemas_use_only_what_every_function_calling_api_accepts() {
        for spec in specs() {
            for node in nodes(&spec.input).into_iter().filter_map(Value::as_object) {
                let name = spec.name.as_str();
                assert!(!node.get("type").is_some_and(Value::is_array), "{name}: a type array in {node:?}");
                assert!(node.get("type").is_none_or(|t| t != "null"), "{name}: a null type in {node:?}");
                assert!(!node.get("enum").and_then(Value::as_array).is_some_and(|e| e.contains(&Value::Null)));
                for keyword in ["$ref", "$defs", "anyOf", "oneOf", "allOf"] {
                    assert!(!node.contains_key(keyword), "{name}: {keyword} in {node:?}");
                }
            }
        }
    }

    /// The whole numbers a text states (`0-20` and `at least 1` both count).
    fn numbers_in(text: &str) -> Vec<f64> {
        text.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect()
    }

    #[test]
    fn every_input_range_is_stated_in_its_description() {
        // Codex strips `minimum` and `maximum` from input schemas: its model sees only the description.
        for spec in specs() {
            for node in nodes(&spec.input).into_iter().filter_map(Value::as_object) {
                for bound in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
                    let Some(n) = node.get(bound).and_then(Value::as_f64) else { continue };
                    let description = node.get("description").and_then(Value::as_str).unwrap_or_default();
                    let name = spec.name.as_str();
                    assert!(numbers_in(description).contains(&n), "{name}: {bound} {n} is not in {description:?}");
                }
            }
        }
    }

    #[test]
    fn published_schemas_use_only_standard_formats_and_keep_their_ranges() {
        let config = crate::config::json_schema();
        let schemas = specs().iter().flat_map(|s| [&s.input, &s.output]).chain([&config]);
        for node in schemas.flat_map(nodes) {
            if let Some(format) = node.get("format").and_then(Value::as_str) {
                assert!(crate::schemas::STANDARD_FORMATS.contains(&format), "format {format:?} in {node}");
            }
        }
        // `usize` fields were `"format": "uint", "minimum": 0`: the format goes, the range stays.
        let count = &spec(ToolName::SessionsList).output["$defs"]["ListOk"]["properties"]["count"];
        assert_eq!(count.get("minimum"), Some(&Value::from(0)), "{count}");
    }

    #[test]
    fn output_schemas_still_say_which_fields_can_be_null() {
        let list = &spec(ToolName::SessionsList).output;
        assert!(
            nodes(list)
                .iter()
                .any(|n| n.get("type").is_some_and(|t| t.as_array().is_some_and(|a| a.contains(&"null".into()))))
        );
    }
}
