//! Embedded, versioned migrations. Migration `i` (0-based) brings the store to version `i + 1`.
//! Never edit a migration that has shipped; add a new one.

pub const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11, V12, V13, V14, V15, V16];

/// Version 1: sessions, messages, and the shape of runs, deliveries, tokens, idempotency and
/// attachments that the runner, send and spawn flows use.
const V1: &str = r#"
CREATE TABLE schema_version (
    version    INTEGER NOT NULL,
    applied_at INTEGER NOT NULL
);

-- state: 0 active, 1 archived, 2 deleted, 3 never listed (cron run keys)
CREATE TABLE sessions (
    id                INTEGER PRIMARY KEY,
    key               TEXT NOT NULL UNIQUE,
    session_id        TEXT NOT NULL,
    agent_id          TEXT NOT NULL,
    kind              TEXT NOT NULL,
    state             INTEGER NOT NULL DEFAULT 0,
    driver            TEXT NOT NULL CHECK (driver IN ('driven', 'external')),
    chat_type         TEXT,
    channel           TEXT,
    last_channel      TEXT,
    last_to           TEXT,
    last_account_id   TEXT,
    last_thread_id    TEXT,
    delivery_context  TEXT,
    label             TEXT,
    display_name      TEXT,
    spawned_by        TEXT,
    spawn_depth       INTEGER NOT NULL DEFAULT 0,
    subagent_role     TEXT,
    sandboxed         INTEGER NOT NULL DEFAULT 0,
    send_policy       TEXT CHECK (send_policy IN ('allow', 'deny')),
    model             TEXT,
    model_provider    TEXT,
    thinking_level    TEXT,
    verbose_level     TEXT,
    context_tokens    INTEGER,
    system_sent       INTEGER,
    aborted_last_run  INTEGER,
    tokens_in         INTEGER NOT NULL DEFAULT 0,
    tokens_out        INTEGER NOT NULL DEFAULT 0,
    tokens_total      INTEGER NOT NULL DEFAULT 0,
    cost              REAL,
    external_session_id TEXT,
    transcript_path   TEXT,
    origin            TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    archived_at       INTEGER,
    deleted_at        INTEGER,
    -- Sub-agent bookkeeping: the spawn run, when its completion was announced, when to archive.
    spawn_run         TEXT,
    announced_at      INTEGER,
    archive_due_at    INTEGER,
    next_seq          INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX sessions_archive_due ON sessions (archive_due_at) WHERE archive_due_at IS NOT NULL AND state = 0;
CREATE INDEX sessions_agent_state_updated ON sessions (agent_id, state, updated_at DESC);
CREATE INDEX sessions_agent_kind_state_updated ON sessions (agent_id, kind, state, updated_at DESC);
CREATE INDEX sessions_spawned_by ON sessions (spawned_by) WHERE spawned_by IS NOT NULL;
CREATE INDEX sessions_session_id ON sessions (session_id COLLATE NOCASE);
CREATE INDEX sessions_label ON sessions (label) WHERE label IS NOT NULL;

-- The spawn tree as a closure table: one row per (ancestor, descendant), carrying the
-- descendant's updated_at so that listing a caller's tree is an index scan (O(limit)), not a walk.
-- Triggers keep it in step with sessions; lineage never changes once set.
CREATE TABLE session_tree (
    ancestor   INTEGER NOT NULL,
    session    INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (ancestor, session)
) WITHOUT ROWID;
CREATE INDEX session_tree_ancestor_updated ON session_tree (ancestor, updated_at DESC, session DESC);
CREATE INDEX session_tree_session ON session_tree (session);
CREATE TRIGGER sessions_tree_insert AFTER INSERT ON sessions WHEN NEW.spawned_by IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO session_tree (ancestor, session, updated_at)
        SELECT id, NEW.id, NEW.updated_at FROM sessions WHERE key = NEW.spawned_by
        UNION
        SELECT t.ancestor, NEW.id, NEW.updated_at FROM session_tree t
            WHERE t.session = (SELECT id FROM sessions WHERE key = NEW.spawned_by);
END;
CREATE TRIGGER sessions_tree_updated AFTER UPDATE OF updated_at ON sessions
BEGIN
    UPDATE session_tree SET updated_at = NEW.updated_at WHERE session = NEW.id;
END;

-- Every agent id that owns a session, so cross-agent listing never scans sessions.
CREATE TABLE agent_ids (agent_id TEXT PRIMARY KEY) WITHOUT ROWID;

CREATE TABLE messages (
    id          INTEGER PRIMARY KEY,
    session     INTEGER NOT NULL REFERENCES sessions (id),
    seq         INTEGER NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'toolResult', 'system')),
    content     TEXT NOT NULL,
    timestamp   INTEGER NOT NULL,
    run_id      TEXT,
    provenance  TEXT,
    usage       TEXT,
    model       TEXT,
    stop_reason TEXT,
    silent      INTEGER NOT NULL DEFAULT 0,
    chain_id    TEXT,
    extra       TEXT,
    UNIQUE (session, seq)
);
-- The loop guard counts every message appended on a chain.
CREATE INDEX messages_chain ON messages (chain_id) WHERE chain_id IS NOT NULL;
-- What history shows without includeTools: O(limit) in both directions.
CREATE INDEX messages_visible ON messages (session, seq) WHERE role <> 'toolResult' AND silent = 0;

CREATE TABLE runs (
    run_id          TEXT PRIMARY KEY,
    session         INTEGER NOT NULL REFERENCES sessions (id),
    mode            TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('queued', 'running', 'ok', 'error', 'timeout', 'cancelled', 'interrupted')),
    input           TEXT NOT NULL,
    provenance      TEXT,
    requester_key   TEXT,
    chain_id        TEXT,
    hop             INTEGER NOT NULL DEFAULT 0,
    announce_kind   TEXT,
    owner           TEXT,
    lease_until     INTEGER,
    waiting_on      TEXT,
    supervisor_pid  INTEGER,
    supervisor_pgid INTEGER,
    supervisor_start INTEGER,
    model           TEXT,
    thinking        TEXT,
    timeout_ms      INTEGER,
    usage           TEXT,
    cost            REAL,
    exit_status     INTEGER,
    error           TEXT,
    reply           TEXT,
    input_seq       INTEGER,
    extra           TEXT,
    created_at      INTEGER NOT NULL,
    started_at      INTEGER,
    ended_at        INTEGER
);
CREATE INDEX runs_session_status ON runs (session, status);
CREATE INDEX runs_status_created ON runs (status, created_at);
CREATE INDEX runs_waiting_on ON runs (waiting_on) WHERE waiting_on IS NOT NULL;
CREATE INDEX runs_requester_mode ON runs (requester_key, mode, status);

CREATE TABLE deliveries (
    id              INTEGER PRIMARY KEY,
    run_id          TEXT,
    kind            TEXT NOT NULL CHECK (kind IN ('inbox', 'reply', 'announce', 'completion')),
    mode            TEXT NOT NULL CHECK (mode IN ('announce', 'inbox', 'channel')),
    status          TEXT NOT NULL CHECK (status IN ('queued', 'running', 'delivered', 'skipped', 'undeliverable', 'failed', 'expired')),
    target_key      TEXT,
    channel         TEXT,
    payload         TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at INTEGER,
    deadline_at     INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX deliveries_run ON deliveries (run_id);
CREATE INDEX deliveries_status_next ON deliveries (status, next_attempt_at);

CREATE TABLE tokens (
    hash        TEXT PRIMARY KEY,
    kind        TEXT NOT NULL CHECK (kind IN ('run', 'static')),
    session_key TEXT NOT NULL,
    run_id      TEXT,
    chain_id    TEXT,
    hop         INTEGER NOT NULL DEFAULT 0,
    sandboxed   INTEGER NOT NULL DEFAULT 0,
    valid_from  INTEGER,
    expires_at  INTEGER,
    created_at  INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE idempotency (
    caller     TEXT NOT NULL,
    key        TEXT NOT NULL,
    tool       TEXT NOT NULL,
    args_hash  TEXT NOT NULL,
    run_id     TEXT,
    result     TEXT,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (caller, key)
) WITHOUT ROWID;

CREATE TABLE attachments (
    id         INTEGER PRIMARY KEY,
    run_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    bytes      INTEGER NOT NULL,
    sha256     TEXT NOT NULL,
    rel_dir    TEXT NOT NULL,
    removed_at INTEGER
);
CREATE INDEX attachments_run ON attachments (run_id);
"#;

/// Version 2: a run can be asked to stop (MCP `tasks/cancel`) by any process; the owner, which
/// alone runs runs, picks the request up and cancels the agent. And the steps after a run's end
/// are recorded as taken, so that an owner that died between the two is caught up (runs that had
/// ended before this version count as done).
const V2: &str = r#"
ALTER TABLE runs ADD COLUMN cancel_requested_at INTEGER;
CREATE INDEX runs_cancel_requested ON runs (owner) WHERE cancel_requested_at IS NOT NULL AND status = 'running';
ALTER TABLE runs ADD COLUMN steps_done_at INTEGER;
UPDATE runs SET steps_done_at = coalesce(ended_at, 0) WHERE status NOT IN ('queued', 'running');
CREATE INDEX runs_steps_pending ON runs (ended_at) WHERE steps_done_at IS NULL;
-- A parent written after its children (a later import) adopts them and their descendants: it and
-- its own ancestors become their ancestors too. Then the links such stores already lack.
CREATE TRIGGER sessions_tree_adopt AFTER INSERT ON sessions
BEGIN
    INSERT OR IGNORE INTO session_tree (ancestor, session, updated_at)
        SELECT a.id, d.id, d.updated_at
        FROM (SELECT NEW.id AS id
              UNION SELECT id FROM sessions WHERE key = NEW.spawned_by
              UNION SELECT t.ancestor FROM session_tree t
                    WHERE t.session = (SELECT id FROM sessions WHERE key = NEW.spawned_by)) a,
             (SELECT c.id, c.updated_at FROM sessions c WHERE c.spawned_by = NEW.key
              UNION SELECT t.session, t.updated_at FROM session_tree t
                    JOIN sessions c ON c.id = t.ancestor WHERE c.spawned_by = NEW.key) d
        WHERE a.id <> d.id;
END;
INSERT OR IGNORE INTO session_tree (ancestor, session, updated_at)
    WITH RECURSIVE up (session, ancestor, depth) AS (
        SELECT c.id, p.id, 1 FROM sessions c JOIN sessions p ON p.key = c.spawned_by
        UNION
        SELECT up.session, p.id, up.depth + 1 FROM up
            JOIN sessions a ON a.id = up.ancestor JOIN sessions p ON p.key = a.spawned_by
        WHERE up.depth < 64
    )
    SELECT up.ancestor, up.session, s.updated_at FROM up JOIN sessions s ON s.id = up.session
    WHERE up.ancestor <> up.session;
"#;

/// Version 3: the running usage totals that a CLI reports for its own session (Codex reports the
/// thread's totals, not the turn's), so that a resumed turn records only what it used.
const V3: &str = r#"
ALTER TABLE sessions ADD COLUMN cli_usage_total TEXT;
"#;

/// Version 4: the `subagents` tool. An announce keeps the text it carried (`wait` returns it) and
/// when its requester read it; a session whose work an ancestor cancelled says so, so that the
/// completions of its own children are not run in it and it announces without waiting for them.
const V4: &str = r#"
ALTER TABLE deliveries ADD COLUMN read_at INTEGER;
ALTER TABLE sessions ADD COLUMN cancelled_at INTEGER;
"#;

/// Version 5: steering a running child (`subagents` steer). A steer is offered to the child's
/// running run first; its owner decides whether the agent took it (`steered`: the message is in
/// the transcript) or not (`queued`: it became the child's next turn), once.
const V5: &str = r#"
CREATE TABLE steers (
    id          INTEGER PRIMARY KEY,
    session     INTEGER NOT NULL REFERENCES sessions (id),
    run_id      TEXT,
    requester   TEXT NOT NULL,
    text        TEXT NOT NULL,
    provenance  TEXT,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'steered', 'queued')),
    queued_run  TEXT,
    created_at  INTEGER NOT NULL,
    decided_at  INTEGER
);
CREATE INDEX steers_pending ON steers (run_id) WHERE state = 'pending';
"#;

/// Version 6: questions and approvals a run asks (`input_request`), each answered once by whoever
/// may (an ancestor with `subagents` respond, the operator, a rule, the timeout) or withdrawn when
/// its run ends first.
const V6: &str = r#"
CREATE TABLE asks (
    id               TEXT PRIMARY KEY,
    run_id           TEXT NOT NULL,
    session          INTEGER NOT NULL REFERENCES sessions (id),
    agent_request_id TEXT NOT NULL,
    kind             TEXT NOT NULL CHECK (kind IN ('approval', 'question')),
    text             TEXT NOT NULL,
    options          TEXT,
    details          TEXT,
    target_key       TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('open', 'answered', 'expired', 'withdrawn')),
    decision         TEXT CHECK (decision IN ('allow', 'deny')),
    answer_text      TEXT,
    answered_by      TEXT,
    answered_via     TEXT,
    created_at       INTEGER NOT NULL,
    deadline_at      INTEGER NOT NULL,
    answered_at      INTEGER
);
CREATE INDEX asks_open ON asks (deadline_at) WHERE state = 'open';
CREATE INDEX asks_run ON asks (run_id);
CREATE INDEX asks_target_open ON asks (target_key) WHERE state = 'open';
"#;

/// Version 7: budgets for spawn trees. A session with a budget is an *account*: its limits, what
/// its open children reserved from it, and what was spent against it (its own runs, the runs of
/// descendants that share it, and the whole spend of reserved children once they closed). A run
/// that draws on accounts has a live row while it runs, so that its usage counts as it happens.
/// A run stopped for its budget ends `budget_exceeded`, which needs the runs table rebuilt (SQLite
/// cannot change a CHECK in place).
const V7: &str = r#"
CREATE TABLE budgets (
    session              INTEGER PRIMARY KEY REFERENCES sessions (id),
    limit_tokens         INTEGER,
    limit_cost_micros    INTEGER,
    limit_runtime_ms     INTEGER,
    reserved_tokens      INTEGER NOT NULL DEFAULT 0,
    reserved_cost_micros INTEGER NOT NULL DEFAULT 0,
    reserved_runtime_ms  INTEGER NOT NULL DEFAULT 0,
    spent_tokens         INTEGER NOT NULL DEFAULT 0,
    spent_cost_micros    INTEGER NOT NULL DEFAULT 0,
    spent_runtime_ms     INTEGER NOT NULL DEFAULT 0,
    exceeded             TEXT CHECK (exceeded IN ('tokens', 'costUsd', 'runtimeSeconds')),
    exceeded_at          INTEGER,
    unmetered            INTEGER NOT NULL DEFAULT 0,
    clamped              TEXT,
    created_at           INTEGER NOT NULL,
    closed_at            INTEGER
);
CREATE TABLE budget_live (
    run_id          TEXT PRIMARY KEY,
    session         INTEGER NOT NULL REFERENCES sessions (id),
    tokens_account  INTEGER,
    cost_account    INTEGER,
    runtime_account INTEGER,
    tokens          INTEGER NOT NULL DEFAULT 0,
    cost_micros     INTEGER NOT NULL DEFAULT 0,
    reported        INTEGER NOT NULL DEFAULT 0,
    started_at      INTEGER NOT NULL
);
CREATE INDEX budget_live_tokens ON budget_live (tokens_account) WHERE tokens_account IS NOT NULL;
CREATE INDEX budget_live_cost ON budget_live (cost_account) WHERE cost_account IS NOT NULL;
CREATE INDEX budget_live_runtime ON budget_live (runtime_account) WHERE runtime_account IS NOT NULL;

CREATE TABLE runs_v7 (
    run_id          TEXT PRIMARY KEY,
    session         INTEGER NOT NULL REFERENCES sessions (id),
    mode            TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('queued', 'running', 'ok', 'error', 'timeout', 'cancelled', 'interrupted', 'budget_exceeded')),
    input           TEXT NOT NULL,
    provenance      TEXT,
    requester_key   TEXT,
    chain_id        TEXT,
    hop             INTEGER NOT NULL DEFAULT 0,
    announce_kind   TEXT,
    owner           TEXT,
    lease_until     INTEGER,
    waiting_on      TEXT,
    supervisor_pid  INTEGER,
    supervisor_pgid INTEGER,
    supervisor_start INTEGER,
    model           TEXT,
    thinking        TEXT,
    timeout_ms      INTEGER,
    usage           TEXT,
    cost            REAL,
    exit_status     INTEGER,
    error           TEXT,
    reply           TEXT,
    input_seq       INTEGER,
    extra           TEXT,
    created_at      INTEGER NOT NULL,
    started_at      INTEGER,
    ended_at        INTEGER,
    cancel_requested_at INTEGER,
    steps_done_at   INTEGER
);
INSERT INTO runs_v7 SELECT * FROM runs;
DROP TABLE runs;
ALTER TABLE runs_v7 RENAME TO runs;
CREATE INDEX runs_session_status ON runs (session, status);
CREATE INDEX runs_status_created ON runs (status, created_at);
CREATE INDEX runs_waiting_on ON runs (waiting_on) WHERE waiting_on IS NOT NULL;
CREATE INDEX runs_requester_mode ON runs (requester_key, mode, status);
CREATE INDEX runs_cancel_requested ON runs (owner) WHERE cancel_requested_at IS NOT NULL AND status = 'running';
CREATE INDEX runs_steps_pending ON runs (ended_at) WHERE steps_done_at IS NULL;
"#;

/// Version 8: sub-agents bound to a thread of their requester's channel (`sessions_spawn
/// {thread: true}`): the thread a child answers in, and, for `mode: "session"`, how long it stays
/// available for the thread's follow-ups (idle time and age; the archive sweep ends it).
const V8: &str = r#"
CREATE TABLE thread_bindings (
    session     INTEGER PRIMARY KEY REFERENCES sessions (id),
    channel     TEXT NOT NULL,
    to_addr     TEXT NOT NULL,
    thread_id   TEXT NOT NULL,
    mode        TEXT NOT NULL CHECK (mode IN ('run', 'session')),
    idle_ms     INTEGER,
    max_age_ms  INTEGER,
    created_at  INTEGER NOT NULL
);
CREATE INDEX thread_bindings_thread ON thread_bindings (channel, to_addr, thread_id);
"#;

/// Version 9: an operator may dismiss a delivery that failed, expired or could not be delivered
/// (the dashboard's ledger): a status of its own, so it is never mistaken for an agent's skip.
/// SQLite changes a CHECK only by rebuilding the table.
const V9: &str = r#"
CREATE TABLE deliveries_v9 (
    id              INTEGER PRIMARY KEY,
    run_id          TEXT,
    kind            TEXT NOT NULL CHECK (kind IN ('inbox', 'reply', 'announce', 'completion')),
    mode            TEXT NOT NULL CHECK (mode IN ('announce', 'inbox', 'channel')),
    status          TEXT NOT NULL CHECK (status IN ('queued', 'running', 'delivered', 'skipped', 'undeliverable', 'failed', 'expired', 'dismissed')),
    target_key      TEXT,
    channel         TEXT,
    payload         TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at INTEGER,
    deadline_at     INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    read_at         INTEGER
);
INSERT INTO deliveries_v9 SELECT id, run_id, kind, mode, status, target_key, channel, payload, attempts, last_error,
    next_attempt_at, deadline_at, created_at, updated_at, read_at FROM deliveries;
DROP TABLE deliveries;
ALTER TABLE deliveries_v9 RENAME TO deliveries;
CREATE INDEX deliveries_run ON deliveries (run_id);
CREATE INDEX deliveries_status_next ON deliveries (status, next_attempt_at);
"#;

/// Version 10: on a database several nodes share, an attachment's bytes and media type are kept
/// with its receipt, so that whichever node claims a run of the child writes them into its own
/// copy of the child's workdir (`engine::attachments::materialise`). Alone (SQLite) the files are
/// written once, at the spawn, by the only node, and `content` stays NULL.
const V10: &str = r#"
ALTER TABLE attachments ADD COLUMN content BLOB;
ALTER TABLE attachments ADD COLUMN mime_type TEXT;
"#;

/// Version 11: repairs the token totals one hostile usage report could corrupt before reports were
/// checked. SQLite turns an integer sum that overflows into a REAL, which every later read of the
/// row refused (`a real is not an integer`); such a value becomes the largest integer (CAST
/// saturates), which the checked sums then never pass. A negative total or spend becomes 0.
const V11: &str = r#"
UPDATE sessions SET tokens_in = max(CAST(tokens_in AS INTEGER), 0) WHERE typeof(tokens_in) <> 'integer' OR tokens_in < 0;
UPDATE sessions SET tokens_out = max(CAST(tokens_out AS INTEGER), 0) WHERE typeof(tokens_out) <> 'integer' OR tokens_out < 0;
UPDATE sessions SET tokens_total = max(CAST(tokens_total AS INTEGER), 0) WHERE typeof(tokens_total) <> 'integer' OR tokens_total < 0;
UPDATE budgets SET spent_tokens = max(CAST(spent_tokens AS INTEGER), 0) WHERE typeof(spent_tokens) <> 'integer' OR spent_tokens < 0;
UPDATE budgets SET spent_cost_micros = max(CAST(spent_cost_micros AS INTEGER), 0) WHERE typeof(spent_cost_micros) <> 'integer' OR spent_cost_micros < 0;
UPDATE budget_live SET tokens = max(CAST(tokens AS INTEGER), 0) WHERE typeof(tokens) <> 'integer' OR tokens < 0;
"#;

/// Version 12: a channel bridge's message ids are remembered under a caller of their own
/// (`channel_bridge:<session key>`, see `ledger::bridge_message_key`) instead of the session's,
/// where the tools' idempotency keys are: a spawn's key `message:m-1` no longer makes the user's
/// message m-1 a duplicate, nor the other way round. The rows written before move there.
const V12: &str = r#"
UPDATE idempotency SET caller = 'channel_bridge:' || caller WHERE tool = 'channel_bridge';
"#;

/// Version 13: the bearer tokens `sessions-mcp token create` mints for the HTTP server (an
/// operator's, or a client's acting as a session), kept as sha256 hashes only; a revoked one
/// keeps its row (for `token list`) with `revoked_at` set. A label names at most one live token.
/// And since when a live run waits for an answer (its runtime stands still meanwhile).
const V13: &str = r#"
ALTER TABLE budget_live ADD COLUMN waiting_since INTEGER;
CREATE TABLE access_tokens (
    id          TEXT PRIMARY KEY,
    hash        TEXT NOT NULL UNIQUE,
    kind        TEXT NOT NULL CHECK (kind IN ('operator', 'client')),
    session_key TEXT,
    label       TEXT,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
CREATE UNIQUE INDEX access_tokens_label ON access_tokens (label) WHERE label IS NOT NULL AND revoked_at IS NULL;
"#;

/// Version 14: who an ask was put to and how each way to a person went (`routes`, a JSON array of
/// `{route, outcome, client?, ms?, at}`), and the MCP client of the person who answered at a host
/// (`answered_host`).
const V14: &str = r#"
ALTER TABLE asks ADD COLUMN routes TEXT;
ALTER TABLE asks ADD COLUMN answered_host TEXT;
"#;

/// Version 15: a sub-agent's approval is posted to the chat its tree is bound to (a delivery of
/// kind `ask`, one per ask). SQLite changes a CHECK only by rebuilding the table.
const V15: &str = r#"
CREATE TABLE deliveries_v15 (
    id              INTEGER PRIMARY KEY,
    run_id          TEXT,
    kind            TEXT NOT NULL CHECK (kind IN ('inbox', 'reply', 'announce', 'completion', 'ask')),
    mode            TEXT NOT NULL CHECK (mode IN ('announce', 'inbox', 'channel')),
    status          TEXT NOT NULL CHECK (status IN ('queued', 'running', 'delivered', 'skipped', 'undeliverable', 'failed', 'expired', 'dismissed')),
    target_key      TEXT,
    channel         TEXT,
    payload         TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    next_attempt_at INTEGER,
    deadline_at     INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    read_at         INTEGER
);
INSERT INTO deliveries_v15 SELECT id, run_id, kind, mode, status, target_key, channel, payload, attempts, last_error,
    next_attempt_at, deadline_at, created_at, updated_at, read_at FROM deliveries;
DROP TABLE deliveries;
ALTER TABLE deliveries_v15 RENAME TO deliveries;
CREATE INDEX deliveries_run ON deliveries (run_id);
CREATE INDEX deliveries_status_next ON deliveries (status, next_attempt_at);
"#;

/// Version 16: the remote task a run of a remote agent (`runner.kind: "a2a"`) started, so that a
/// restart follows that task instead of interrupting the run or sending its message again.
const V16: &str = r#"
ALTER TABLE runs ADD COLUMN remote_task_id TEXT;
"#;
