//! A running turn's questions and approval requests (docs/RUNNER-PROTOCOL.md, Asking): each
//! well-formed `input_request` goes to the engine as an [`InputRequest`] and stays open until the
//! engine answers it; one the engine cannot take, or one the agent got wrong, is answered deny at
//! once, so an agent's bug costs it an answer, not its run. The runner writes every answer into
//! the turn's stdin ([`super::stdin::AgentStdin::write_answer`]) and pauses the idle timer while
//! any request is open. Dropping [`Asking`] drops the open requests' receivers: the engine sees
//! them withdrawn.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;

use super::{Decision, InputAnswer, InputKind, InputRequest};

/// The answer the engine gives to one open request: its id, and the answer (None: the engine
/// dropped the request's sender without answering).
type Pending = Pin<Box<dyn Future<Output = (String, Option<InputAnswer>)> + Send>>;

/// What an `input_request` event asks, once it is known to be well-formed.
#[derive(Debug, PartialEq)]
struct Asked {
    id: String,
    kind: InputKind,
    text: String,
    options: Option<Value>,
    details: Option<Value>,
}

/// The requests of one run: where they go, and those still open.
pub(super) struct Asking<'a> {
    engine: Option<&'a UnboundedSender<InputRequest>>,
    open: FuturesUnordered<Pending>,
    open_ids: HashSet<String>,
    run_id: &'a str,
}

impl<'a> Asking<'a> {
    pub(super) fn new(engine: Option<&'a UnboundedSender<InputRequest>>, run_id: &'a str) -> Self {
        Asking { engine, open: FuturesUnordered::new(), open_ids: HashSet::new(), run_id }
    }

    /// Takes one `input_request` event: hands it to the engine (None), or returns the id and the
    /// deny answer to write at once when it is malformed or nobody can answer it.
    pub(super) fn ask(&mut self, event: &Value) -> Option<(String, InputAnswer)> {
        let asked = match parse(event) {
            Ok(asked) if self.open_ids.contains(&asked.id) => {
                Err((asked.id.clone(), format!("input_request id {:?} is already open", asked.id)))
            }
            parsed => parsed,
        };
        let asked = match asked {
            Ok(asked) => asked,
            Err((id, why)) => {
                tracing::warn!(run_id = self.run_id, %why, "the agent sent a malformed input_request; answered deny");
                return Some((id, deny(why)));
            }
        };
        let (answer, answered) = tokio::sync::oneshot::channel();
        let id = asked.id.clone();
        let request = InputRequest {
            id: asked.id,
            kind: asked.kind,
            text: asked.text,
            options: asked.options,
            details: asked.details,
            answer,
        };
        if self.engine.is_none_or(|engine| engine.send(request).is_err()) {
            return Some((id, deny("this run cannot ask".into())));
        }
        self.open_ids.insert(id.clone());
        self.open.push(Box::pin(async move { (id, answered.await.ok()) }));
        None
    }

    /// The next answer the engine gives (never resolves while no request is open). A request
    /// whose sender the engine dropped unanswered is answered deny, so the agent does not wait
    /// on it for the rest of its run.
    pub(super) async fn next_answer(&mut self) -> (String, InputAnswer) {
        match self.open.next().await {
            Some((id, answer)) => {
                self.open_ids.remove(&id);
                (id, answer.unwrap_or_else(|| deny("the request was dropped unanswered".into())))
            }
            None => std::future::pending().await,
        }
    }

    /// Whether any request is open (the idle timer is paused meanwhile).
    pub(super) fn waiting(&self) -> bool {
        !self.open_ids.is_empty()
    }
}

fn deny(text: String) -> InputAnswer {
    InputAnswer { decision: Decision::Deny, text: Some(text) }
}

/// Reads an `input_request` event; a malformed one gives the id to answer on (`""` when it has
/// none) and what is wrong with it.
fn parse(event: &Value) -> Result<Asked, (String, String)> {
    let id = event.get("id").and_then(Value::as_str).unwrap_or("").to_string();
    if id.is_empty() {
        return Err((id, "input_request has no id".into()));
    }
    let kind = match event.get("kind").and_then(Value::as_str) {
        Some("approval") => InputKind::Approval,
        Some("question") => InputKind::Question,
        other => {
            let other = other.map_or_else(|| "none".to_string(), |k| format!("{k:?}"));
            return Err((id, format!("input_request kind is {other}, not \"approval\" or \"question\"")));
        }
    };
    let present = |key: &str| event.get(key).filter(|v| !v.is_null()).cloned();
    Ok(Asked {
        text: event.get("text").and_then(Value::as_str).unwrap_or("").to_string(),
        options: present("options"),
        details: present("details"),
        id,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_well_formed_request_keeps_its_fields_and_a_malformed_one_says_what_is_wrong() {
        let asked = parse(&json!({"type": "input_request", "id": "q1", "kind": "question", "text": "Which?",
                                  "options": ["a", "b"], "details": null}))
        .unwrap();
        assert_eq!(
            asked,
            Asked {
                id: "q1".into(),
                kind: InputKind::Question,
                text: "Which?".into(),
                options: Some(json!(["a", "b"])),
                details: None
            }
        );
        assert_eq!(parse(&json!({"kind": "approval"})).unwrap_err(), ("".into(), "input_request has no id".into()));
        assert_eq!(parse(&json!({"id": "", "kind": "approval"})).unwrap_err().1, "input_request has no id");
        let (id, why) = parse(&json!({"id": "x", "kind": "vote"})).unwrap_err();
        assert_eq!(
            (id.as_str(), why.as_str()),
            ("x", "input_request kind is \"vote\", not \"approval\" or \"question\"")
        );
        assert!(parse(&json!({"id": "x"})).unwrap_err().1.contains("kind is none"));
    }

    fn request(id: &str) -> Value {
        json!({"type": "input_request", "id": id, "kind": "approval", "text": "May I?"})
    }

    #[tokio::test]
    async fn requests_go_to_the_engine_and_are_answered_in_the_order_the_engine_answers() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut asking = Asking::new(Some(&tx), "r");
        assert!(asking.ask(&request("a")).is_none() && asking.ask(&request("b")).is_none());
        assert!(asking.waiting());
        let (a, b) = (rx.recv().await.unwrap(), rx.recv().await.unwrap());
        b.answer.send(InputAnswer { decision: Decision::Allow, text: Some("yes".into()) }).unwrap();
        let (id, answer) = asking.next_answer().await;
        assert_eq!((id.as_str(), answer.decision, answer.text.as_deref()), ("b", Decision::Allow, Some("yes")));
        assert!(asking.waiting(), "a is still open");
        drop(a);
        let (id, answer) = asking.next_answer().await;
        assert_eq!((id.as_str(), answer.decision), ("a", Decision::Deny), "dropped unanswered: denied");
        assert!(!asking.waiting());
    }

    #[test]
    fn a_request_nobody_can_answer_or_a_duplicate_id_is_denied_at_once() {
        let mut nobody = Asking::new(None, "r");
        let (id, answer) = nobody.ask(&request("a")).unwrap();
        assert_eq!(
            (id.as_str(), answer.decision, answer.text.as_deref()),
            ("a", Decision::Deny, Some("this run cannot ask"))
        );
        assert!(!nobody.waiting());

        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut asking = Asking::new(Some(&tx), "r");
        assert!(asking.ask(&request("a")).is_none());
        let (_, answer) = asking.ask(&request("a")).unwrap();
        assert_eq!(answer.text.as_deref(), Some("input_request id \"a\" is already open"));
        drop(rx);
        let (_, answer) = asking.ask(&request("b")).unwrap();
        assert_eq!(answer.text.as_deref(), Some("this run cannot ask"), "the engine stopped listening");
    }
}
