//! MCP over a line stream (stdin/stdout): rmcp's line transport between two filters. Incoming
//! lines are checked first, so that a line rmcp would drop silently (not UTF-8, not JSON, nested
//! past serde's recursion limit, longer than rmcp's `DEFAULT_MAX_LINE_LENGTH`) is answered with
//! a JSON-RPC `-32700 Parse error` with `"id": null` — a client waiting on that line's id learns
//! it will never be answered. The answer is written between rmcp's output lines, never inside
//! one. At most one line is buffered; the tail of an over-long line is skipped unread.

use std::fmt;

use rmcp::model::{ErrorCode, ErrorData};
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The in-process pipes between the filters and rmcp.
const PIPE_BYTES: usize = 64 * 1024;

/// Serves `server` (a caller's [`super::SessionsServer`], or the degraded one) over `read`/`write`
/// until `read` ends.
pub async fn serve_lines<S, R, W>(server: S, read: R, write: W) -> anyhow::Result<()>
where
    S: ServerHandler,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send,
{
    let (checked, rmcp_in) = tokio::io::duplex(PIPE_BYTES);
    let (rmcp_out, answers) = tokio::io::duplex(PIPE_BYTES);
    let (problems_tx, problems) = mpsc::channel(16);
    let _filter = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(check_lines(read, checked, problems_tx)));
    let transport = AsyncRwTransport::<RoleServer, _, _>::new_server(rmcp_in, rmcp_out);
    let serving = async {
        match server.serve(transport).await {
            Ok(running) => running.waiting().await.map(drop).map_err(anyhow::Error::from),
            // Hosts and health checks start the server and close stdin at once: not an error.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    };
    let (served, written) = tokio::join!(serving, write_answers(answers, write, problems));
    if let Err(e) = written {
        tracing::warn!(error = %e, "writing to the client failed");
    }
    served
}

/// Copies each whole line that parses to `checked` (rmcp's input) and reports every other line
/// to `problems`, until `read` ends (which closes rmcp's input: the server then ends).
async fn check_lines<R: AsyncRead + Unpin>(
    read: R,
    mut checked: tokio::io::DuplexStream,
    problems: mpsc::Sender<String>,
) {
    let mut read = BufReader::new(read);
    let mut line = Vec::new();
    for number in 1u64.. {
        line.clear();
        let problem = match next_line(&mut read, &mut line).await {
            Ok(Line::End) => return,
            Ok(Line::TooLong) => Some(format!("line {number} is longer than {DEFAULT_MAX_LINE_LENGTH} bytes")),
            Ok(Line::Read) => check(&line).err().map(|why| format!("line {number} {why}")),
            Err(e) => {
                tracing::warn!(error = %e, "reading the client's input failed");
                return;
            }
        };
        let sent = match problem {
            Some(problem) => problems.send(problem).await.is_ok(),
            None => checked.write_all(&line).await.is_ok(),
        };
        if !sent {
            return;
        }
    }
}

enum Line {
    /// `line` holds one line ending in `\n` (one is added to an unterminated last line).
    Read,
    /// The line was longer than rmcp accepts; it has been skipped.
    TooLong,
    End,
}

/// Reads one line of at most `DEFAULT_MAX_LINE_LENGTH` bytes (with its `\n`, as rmcp counts).
async fn next_line<R: AsyncBufRead + Unpin>(read: &mut R, line: &mut Vec<u8>) -> std::io::Result<Line> {
    let n = (&mut *read).take(DEFAULT_MAX_LINE_LENGTH as u64).read_until(b'\n', line).await?;
    if line.ends_with(b"\n") {
        return Ok(Line::Read);
    }
    if n == 0 {
        return Ok(Line::End);
    }
    if n < DEFAULT_MAX_LINE_LENGTH {
        line.push(b'\n');
        return Ok(Line::Read);
    }
    line.clear();
    skip_line(read).await?;
    Ok(Line::TooLong)
}

/// Consumes input up to and including the next `\n` without keeping it.
async fn skip_line<R: AsyncBufRead + Unpin>(read: &mut R) -> std::io::Result<()> {
    loop {
        let buf = read.fill_buf().await?;
        if buf.is_empty() {
            return Ok(());
        }
        let newline = buf.iter().position(|b| *b == b'\n');
        let n = newline.map_or(buf.len(), |i| i + 1);
        read.consume(n);
        if newline.is_some() {
            return Ok(());
        }
    }
}

/// Why rmcp could not parse this line as JSON (what it does with JSON of the wrong shape is its
/// own business: `-32600`). Blank lines pass (rmcp skips them); so does a UTF-8 byte-order mark.
fn check(line: &[u8]) -> Result<(), String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.is_empty() {
        return Ok(());
    }
    let text = std::str::from_utf8(line).map_err(|e| format!("is not valid UTF-8: {e}"))?;
    serde_json::from_str::<Checked>(text).map(drop).map_err(|e| format!("is not JSON: {e}"))
}

/// Any JSON value, checked as a typed parse would check it — strings decoded, so a lone surrogate
/// escape is refused (`serde::de::IgnoredAny` skips strings unchecked) — without building it.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// Copies rmcp's output to `write` and puts a parse error for each problem between two of its
/// lines, until rmcp closes its output.
async fn write_answers<W: AsyncWrite + Unpin>(
    rmcp_out: tokio::io::DuplexStream,
    mut write: W,
    mut problems: mpsc::Receiver<String>,
) -> std::io::Result<()> {
    let mut rmcp_out = BufReader::new(rmcp_out);
    let mut between_lines = true;
    loop {
        tokio::select! {
            biased;
            Some(problem) = problems.recv(), if between_lines => write_parse_error(&mut write, &problem).await?,
            chunk = rmcp_out.fill_buf() => {
                let chunk = chunk?;
                if chunk.is_empty() {
                    break;
                }
                // Up to the end of a line at most, so that a parse error can follow it.
                let n = chunk.iter().position(|b| *b == b'\n').map_or(chunk.len(), |i| i + 1);
                write.write_all(&chunk[..n]).await?;
                between_lines = chunk[n - 1] == b'\n';
                rmcp_out.consume(n);
                if between_lines {
                    write.flush().await?;
                }
            }
        }
    }
    // The input ended before rmcp did: the last lines' problems are still queued.
    while let Ok(problem) = problems.try_recv() {
        write_parse_error(&mut write, &problem).await?;
    }
    Ok(())
}

async fn write_parse_error<W: AsyncWrite + Unpin>(write: &mut W, problem: &str) -> std::io::Result<()> {
    tracing::debug!(%problem, "answering an unparsable line");
    let error = ErrorData::new(ErrorCode::PARSE_ERROR, format!("Parse error: {problem}"), None);
    let mut answer = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": error}).to_string();
    answer.push('\n');
    write.write_all(answer.as_bytes()).await?;
    write.flush().await
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn check_refuses_what_a_typed_parse_refuses_and_passes_blank_lines() {
        assert!(check(b"\n").is_ok());
        assert!(check(b"\xEF\xBB\xBF{\"a\":[1,\"x\",null,true]}\r\n").is_ok());
        assert!(check(br#"{"x":"\ud800"}"#).unwrap_err().contains("hex escape"));
        assert!(check(b"\xff{}").unwrap_err().contains("UTF-8"));
        assert!(check("[".repeat(10_000).as_bytes()).unwrap_err().contains("recursion limit"));
        assert!(check(br#"{"jsonrpc":"#).unwrap_err().starts_with("is not JSON"));
    }
}
