//! A TCP proxy between one node and PostgreSQL, for the nodes rows: it delays each direction by
//! a set time (the database at a network distance: a round trip costs twice that), and reads the
//! protocol's framing on the way to measure, from outside the node, what its transactions hold:
//! how many round trips each makes, and for how long, split by what it locks — the global write
//! lock (`WRITE_LOCK` in its `BEGIN`), row locks only (any other write), or nothing (a read).
//!
//! The framing is PostgreSQL's v3 protocol in clear (the proxied URL says `sslmode=disable`):
//! after the client's untyped startup message every message is a type byte and a length. A
//! transaction starts with the client's simple query that begins it (the store pipelines its
//! `BEGIN` with the first statement) and ends at the server's `ReadyForQuery` saying idle. A
//! round trip is a request the client sends while none of its requests is waiting for an answer.
//! Times are taken where the proxy stands, on the server's side of the delay: the global lock is
//! held from the answer to the `BEGIN` batch (which took it) to the answer to the commit.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::postgres::backend::WRITE_LOCK;

/// What a transaction locks, read from the text that began it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// The global write lock.
    Global,
    /// Row locks only: a write without the global lock.
    Rows,
    /// Nothing: a read-only snapshot.
    Nothing,
}

impl Holds {
    fn of(begin: &str) -> Holds {
        if begin.contains(&format!("pg_advisory_xact_lock({WRITE_LOCK})")) {
            Holds::Global
        } else if begin.contains("READ ONLY") {
            Holds::Nothing
        } else {
            Holds::Rows
        }
    }
}

/// Totals over every transaction of one kind that ended.
#[derive(Debug, Clone, Copy, Default)]
pub struct Held {
    pub transactions: u64,
    /// Round trips from the one that began each transaction to the one that ended it.
    pub round_trips: u64,
    /// Summed and longest time from the answer to the `BEGIN` batch to the answer to the end.
    pub total: Duration,
    pub longest: Duration,
}

impl Held {
    fn add(&mut self, round_trips: u64, held: Duration) {
        self.transactions += 1;
        self.round_trips += round_trips;
        self.total += held;
        self.longest = self.longest.max(held);
    }

    pub fn merge(&mut self, other: &Held) {
        self.transactions += other.transactions;
        self.round_trips += other.round_trips;
        self.total += other.total;
        self.longest = self.longest.max(other.longest);
    }
}

/// What the transactions through one proxy held, by kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct WireStats {
    pub global: Held,
    pub rows: Held,
    pub reads: Held,
}

impl WireStats {
    pub fn merge(&mut self, other: &WireStats) {
        self.global.merge(&other.global);
        self.rows.merge(&other.rows);
        self.reads.merge(&other.reads);
    }

    /// Per run, as the nodes rows print it: each kind's transactions and round trips, the
    /// global lock's hold (its sum bounds the cluster's runs/s at 1 / hold per run) and the
    /// longest, and the longest row-locked write (a bound of any row lock's hold).
    pub fn per_run(&self, runs: f64) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let (g, r, q) = (&self.global, &self.rows, &self.reads);
        format!(
            "on the wire: global lock {:.1} tx, {:.1} round trips, held {:.1} ms (longest {:.1} ms); \
             row-locked writes {:.1} tx, {:.1} round trips (longest {:.1} ms); reads {:.1} tx, {:.1} round trips",
            g.transactions as f64 / runs,
            g.round_trips as f64 / runs,
            ms(g.total) / runs,
            ms(g.longest),
            r.transactions as f64 / runs,
            r.round_trips as f64 / runs,
            ms(r.longest),
            q.transactions as f64 / runs,
            q.round_trips as f64 / runs,
        )
    }

    fn held(&mut self, holds: Holds) -> &mut Held {
        match holds {
            Holds::Global => &mut self.global,
            Holds::Rows => &mut self.rows,
            Holds::Nothing => &mut self.reads,
        }
    }
}

/// A proxy listening on a loopback port of its own until dropped (its connections end with the
/// node's or the server's side).
pub struct DelayProxy {
    pub addr: SocketAddr,
    stats: Arc<Mutex<WireStats>>,
    /// Set when dropped: the accepting thread ends at its next accept.
    closed: Arc<std::sync::atomic::AtomicBool>,
}

impl DelayProxy {
    /// Forwards every connection made to [`DelayProxy::addr`] to `upstream`, each direction
    /// `one_way` late.
    pub fn start(upstream: SocketAddr, one_way: Duration) -> std::io::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let stats: Arc<Mutex<WireStats>> = Arc::default();
        let addr = listener.local_addr()?;
        let closed: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let (totals, ended) = (stats.clone(), closed.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if ended.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                if let Err(e) = connect(client, server, one_way, totals.clone()) {
                    tracing::warn!(error = %e, "the delay proxy could not forward a connection");
                }
            }
        });
        Ok(DelayProxy { addr, stats, closed })
    }

    /// What the transactions that ended since the last take held (counting starts again).
    pub fn take(&self) -> WireStats {
        std::mem::take(&mut *self.stats.lock().unwrap())
    }
}

impl Drop for DelayProxy {
    /// Ends the accepting thread, woken by one last connection of its own.
    fn drop(&mut self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// One connection's state as both directions see it.
struct Conversation {
    /// Requests (a simple query or a sync) not answered yet (`ReadyForQuery`).
    waiting: u64,
    /// The transaction under way.
    open: Option<Open>,
    totals: Arc<Mutex<WireStats>>,
}

struct Open {
    holds: Holds,
    round_trips: u64,
    /// When the answer to the `BEGIN` batch came (its locks taken).
    begun: Option<Instant>,
}

impl Conversation {
    /// A message of the client: a simple query (`Q`, its text) or a sync (`S`) asks for an answer.
    fn client_said(&mut self, kind: u8, text: &[u8]) {
        if kind != b'Q' && kind != b'S' {
            return;
        }
        if kind == b'Q' && self.open.is_none() {
            let text = String::from_utf8_lossy(text);
            if text.trim_start().starts_with("BEGIN") {
                self.open = Some(Open { holds: Holds::of(&text), round_trips: 0, begun: None });
            }
        }
        if self.waiting == 0
            && let Some(open) = &mut self.open
        {
            open.round_trips += 1;
        }
        self.waiting += 1;
    }

    /// A message of the server: `ReadyForQuery` (`Z`) answers a request, its one byte the
    /// transaction's state after it (`I`: none under way).
    fn server_said(&mut self, kind: u8, body: &[u8]) {
        if kind != b'Z' {
            return;
        }
        self.waiting = self.waiting.saturating_sub(1);
        let now = Instant::now();
        let Some(open) = &mut self.open else { return };
        let begun = *open.begun.get_or_insert(now);
        if body.first() == Some(&b'I') {
            let open = self.open.take().expect("just matched");
            self.totals.lock().unwrap().held(open.holds).add(open.round_trips, now - begun);
        }
    }
}

/// Reads a byte stream's messages: a type byte and a 4-byte length counting itself (after an
/// untyped first message on the client's side), keeping the first bytes of each body.
struct Framing {
    /// Whether the next message has no type byte (the client's startup message).
    untyped: bool,
    header: Vec<u8>,
    kind: u8,
    /// Body bytes still to come of the current message.
    left: usize,
    body: Vec<u8>,
}

/// How much of a message's body is kept: the start of a query's text is enough to know it.
const KEPT: usize = 256;

impl Framing {
    fn new(untyped: bool) -> Framing {
        Framing { untyped, header: Vec::with_capacity(5), kind: 0, left: 0, body: Vec::new() }
    }

    /// Feeds `bytes`; `done` gets each message completed, with the start of its body.
    fn feed(&mut self, mut bytes: &[u8], done: &mut impl FnMut(u8, &[u8])) {
        while !bytes.is_empty() {
            if self.left == 0 {
                let need = if self.untyped { 4 } else { 5 };
                let take = (need - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.header.len() < need {
                    return;
                }
                let (kind, length) = match self.untyped {
                    true => (0, &self.header[..4]),
                    false => (self.header[0], &self.header[1..5]),
                };
                let length = u32::from_be_bytes(length.try_into().expect("four bytes")) as usize;
                (self.kind, self.left, self.untyped) = (kind, length.saturating_sub(4), false);
                self.header.clear();
                self.body.clear();
                if self.left == 0 {
                    done(self.kind, &self.body);
                }
                continue;
            }
            let take = self.left.min(bytes.len());
            let keep = take.min(KEPT.saturating_sub(self.body.len()));
            self.body.extend_from_slice(&bytes[..keep]);
            self.left -= take;
            bytes = &bytes[take..];
            if self.left == 0 {
                done(self.kind, &self.body);
            }
        }
    }
}

/// Forwards both directions of one connection, each through a reader (which reads the framing
/// as the bytes arrive) and a writer (which sends each chunk once its delay passed, so that
/// chunks in flight overlap as on a network).
fn connect(
    client: TcpStream,
    server: TcpStream,
    one_way: Duration,
    totals: Arc<Mutex<WireStats>>,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let talk = Arc::new(Mutex::new(Conversation { waiting: 0, open: None, totals }));
    let (up_talk, down_talk) = (talk.clone(), talk);
    forward(client.try_clone()?, server.try_clone()?, one_way, Framing::new(true), move |kind, body| {
        up_talk.lock().unwrap().client_said(kind, body)
    });
    forward(server, client, one_way, Framing::new(false), move |kind, body| {
        down_talk.lock().unwrap().server_said(kind, body)
    });
    Ok(())
}

fn forward(
    mut from: TcpStream,
    mut to: TcpStream,
    one_way: Duration,
    mut framing: Framing,
    mut seen: impl FnMut(u8, &[u8]) + Send + 'static,
) {
    let (chunks, due) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let at = Instant::now();
            framing.feed(&buf[..n], &mut seen);
            if chunks.send((at + one_way, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (at, chunk) in due {
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// A global-lock write pipelined with its first statement, one more statement and its
    /// commit: three round trips, held from the `BEGIN` batch's answer to the commit's; a read
    /// after it counts apart. The bytes come split anywhere.
    #[test]
    fn transactions_are_told_by_what_they_lock_and_their_round_trips_counted() {
        let totals: Arc<Mutex<WireStats>> = Arc::default();
        let mut talk = Conversation { waiting: 0, open: None, totals: totals.clone() };
        let mut client = Framing::new(true);
        let mut server = Framing::new(false);
        let startup = [&9u32.to_be_bytes()[..], &[0, 3, 0, 0, 0]].concat();
        let begin = format!("BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})\0");
        let statement = [message(b'P', b"x"), message(b'B', b""), message(b'E', b""), message(b'S', b"")].concat();
        let first = [startup, message(b'Q', begin.as_bytes()), statement.clone()].concat();
        let mut to_server = |bytes: &[u8], talk: &mut Conversation| {
            for piece in bytes.chunks(3) {
                client.feed(piece, &mut |k, b| talk.client_said(k, b));
            }
        };
        let mut to_client = |bytes: &[u8], talk: &mut Conversation| {
            for piece in bytes.chunks(2) {
                server.feed(piece, &mut |k, b| talk.server_said(k, b));
            }
        };
        to_server(&first, &mut talk);
        to_client(&[message(b'Z', b"T"), message(b'Z', b"T")].concat(), &mut talk);
        to_server(&statement, &mut talk);
        to_client(&message(b'Z', b"T"), &mut talk);
        to_server(&message(b'Q', b"COMMIT\0"), &mut talk);
        to_client(&message(b'Z', b"I"), &mut talk);
        let read = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY\0";
        to_server(&[message(b'Q', read.as_bytes()), statement].concat(), &mut talk);
        to_client(&[message(b'Z', b"T"), message(b'Z', b"T")].concat(), &mut talk);
        to_server(&message(b'Q', b"ROLLBACK\0"), &mut talk);
        to_client(&message(b'Z', b"I"), &mut talk);
        let stats = *totals.lock().unwrap();
        assert_eq!((stats.global.transactions, stats.global.round_trips), (1, 3));
        assert_eq!((stats.reads.transactions, stats.reads.round_trips), (1, 2));
        assert_eq!(stats.rows.transactions, 0);
    }
}
