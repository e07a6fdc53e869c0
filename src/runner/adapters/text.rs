//! `text`: plain CLIs (`llm`, aider, ollama, scripts). The whole stdout is the reply, known only at
//! its end; lines stream as `text_delta`s meanwhile. No usage, no tool events, no session id.
//! Failure is the process's: a non-zero exit fails the run with the stderr tail, as for any agent.

use serde_json::Value;

use super::event;
use super::{Decoder, NotJson};

#[derive(Default)]
pub struct Text {
    stdout: String,
}

impl Decoder for Text {
    fn line(&mut self, line: &str) -> Result<Vec<Value>, NotJson> {
        let piece = format!("{line}\n");
        self.stdout.push_str(&piece);
        Ok(vec![event::text_delta(&piece)])
    }

    fn end(&mut self) -> Vec<Value> {
        vec![event::final_(self.stdout.trim_end(), "end_turn", None)]
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_fixture, decoder, of_type};
    use crate::config::RunnerKind::Text;

    #[test]
    fn the_whole_stdout_is_the_reply_and_lines_stream_as_deltas() {
        let events = decode_fixture(Text, "text-llm-echo.txt");
        let reply = events.last().unwrap();
        assert_eq!(reply["type"], "final");
        let text = reply["text"].as_str().unwrap();
        let echoed: serde_json::Value = serde_json::from_str(text).expect("llm -m echo prints JSON");
        assert_eq!((echoed["prompt"].as_str(), echoed["system"].as_str()), (Some("Say hello"), Some("You are terse.")));
        let deltas: String = of_type(&events, "text_delta").iter().map(|e| e["text"].as_str().unwrap()).collect();
        assert_eq!(deltas.trim_end(), text);
        assert!(of_type(&events, "usage").is_empty());
    }

    #[test]
    fn blank_lines_are_part_of_the_reply_and_silence_is_an_empty_one() {
        let mut d = decoder(Text);
        for line in ["one", "", "two", ""] {
            d.line(line).unwrap();
        }
        assert_eq!(d.end()[0]["text"], "one\n\ntwo");
        assert_eq!(decoder(Text).end()[0]["text"], "");
    }
}
