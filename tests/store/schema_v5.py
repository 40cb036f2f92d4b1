"""The SQLite schema of version 5 (``PRAGMA user_version = 5``): the
background tasks' outbox (``tasks``), its states moved by triggers drawn
from the outbox's state table.

Frozen here (the statements of that release, long ones wrapped) so that a
test can build a database exactly as a Mind of that version left it, and
upgrade it. Never edit it: a new schema version gets a new file.
"""

SCHEMA_V5 = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS credentials (
    principal_id TEXT PRIMARY KEY,
    label TEXT NOT NULL,
    kind TEXT NOT NULL,
    profile TEXT NOT NULL,
    scopes TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS credentials_live_label
    ON credentials (kind, label) WHERE revoked_at IS NULL;
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    name TEXT,
    created_at REAL NOT NULL,
    created_by TEXT,
    seq_reserved INTEGER NOT NULL DEFAULT 0,
    epoch TEXT  -- the journal epoch its cursors carry (DESIGN §3), NULL until first loaded
);
CREATE TABLE IF NOT EXISTS events (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    ts REAL NOT NULL,
    terminal_of TEXT,  -- the run this event ends (store.base.terminal_of), else NULL
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    request_id TEXT,
    status TEXT,
    ts REAL NOT NULL,
    error_code TEXT,
    reason TEXT,
    usage TEXT,
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    content TEXT,
    error_code TEXT
);
CREATE INDEX IF NOT EXISTS runs_open ON runs (status) WHERE finished_at IS NULL;
CREATE TABLE IF NOT EXISTS requests (
    principal_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    type TEXT NOT NULL,
    digest TEXT NOT NULL,
    status TEXT NOT NULL,
    conversation_id TEXT,
    run_id TEXT,
    accepted TEXT NOT NULL,
    result TEXT,
    created_at REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (principal_id, request_id)
);
CREATE INDEX IF NOT EXISTS requests_open ON requests (status) WHERE finished_at IS NULL;
CREATE INDEX IF NOT EXISTS requests_finished
    ON requests (principal_id, finished_at) WHERE finished_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS tombstones (
    principal_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    result TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (principal_id, request_id)
);
CREATE TABLE IF NOT EXISTS tool_calls (
    tool_call_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    chat_run_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    detail_mode TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    args TEXT,
    scan_warnings TEXT NOT NULL,
    called_seq INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    hand_id TEXT,
    run_id TEXT,
    success INTEGER,
    output_bytes INTEGER,
    digest TEXT,
    truncated INTEGER,
    error_category TEXT,
    result TEXT,
    completed_seq INTEGER,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS tool_calls_by_conversation
    ON tool_calls (conversation_id, called_seq);
CREATE INDEX IF NOT EXISTS tool_calls_open
    ON tool_calls (status) WHERE finished_at IS NULL;
CREATE TABLE IF NOT EXISTS approvals (
    approval_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    reason TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    args TEXT,
    detail_mode TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    decision TEXT,
    decided_by TEXT,
    decision_reason TEXT,
    decided_at REAL
);
CREATE INDEX IF NOT EXISTS approvals_open ON approvals (status) WHERE decided_at IS NULL;
CREATE TABLE IF NOT EXISTS tool_runs (
    run_id TEXT PRIMARY KEY,
    tool_call_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    hand_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    exit_code INTEGER,
    output_bytes INTEGER,
    digest TEXT
);
CREATE INDEX IF NOT EXISTS tool_runs_open ON tool_runs (status) WHERE finished_at IS NULL;
INSERT OR IGNORE INTO meta (key, value) VALUES ('credentials_version', '0');
CREATE UNIQUE INDEX IF NOT EXISTS events_terminal_of
    ON events (terminal_of) WHERE terminal_of IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS runs_first_outcome_stands
    BEFORE UPDATE ON runs WHEN OLD.finished_at IS NOT NULL AND NEW.status IS NOT OLD.status
    BEGIN SELECT RAISE(ABORT, 'halfpi: this run already has its outcome'); END;
CREATE TRIGGER IF NOT EXISTS tool_runs_first_outcome_stands
    BEFORE UPDATE ON tool_runs WHEN OLD.finished_at IS NOT NULL AND NEW.status IS NOT OLD.status
    BEGIN SELECT RAISE(ABORT, 'halfpi: this run already has its outcome'); END;
CREATE TRIGGER IF NOT EXISTS tool_calls_first_outcome_stands
    BEFORE UPDATE ON tool_calls WHEN OLD.finished_at IS NOT NULL AND NEW.status IS NOT OLD.status
    BEGIN SELECT RAISE(ABORT, 'halfpi: this run already has its outcome'); END;
CREATE TRIGGER IF NOT EXISTS approvals_first_outcome_stands
    BEFORE UPDATE ON approvals WHEN OLD.decided_at IS NOT NULL AND NEW.status IS NOT OLD.status
    BEGIN SELECT RAISE(ABORT, 'halfpi: this run already has its outcome'); END;
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    delivery_id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL,
    hand_id TEXT NOT NULL,
    hand_label TEXT NOT NULL,
    tool TEXT NOT NULL,
    args TEXT,
    timeout_s REAL,
    digest TEXT NOT NULL,
    detail_mode TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('cancelled', 'dead', 'failed', 'lost', 'queued',
        'running', 'succeeded', 'timed_out')),
    approved INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    delivered_at REAL,
    hand_task_id TEXT,
    answer TEXT,
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    error TEXT,
    log_bytes INTEGER,
    log_truncated INTEGER
);
CREATE INDEX IF NOT EXISTS tasks_by_time ON tasks (created_at, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_conversation
    ON tasks (conversation_id, created_at, task_id);
CREATE INDEX IF NOT EXISTS tasks_by_hand ON tasks (hand_id, created_at, task_id);
CREATE INDEX IF NOT EXISTS tasks_due ON tasks (next_attempt_at, created_at, task_id)
    WHERE delivered_at IS NULL AND state IN ('queued', 'running');
CREATE TRIGGER IF NOT EXISTS tasks_first_outcome_stands
    BEFORE UPDATE ON tasks
    WHEN OLD.state IN ('cancelled', 'dead', 'failed', 'lost', 'succeeded', 'timed_out')
    AND NEW.state IS NOT OLD.state
    BEGIN SELECT RAISE(ABORT, 'halfpi: this run already has its outcome'); END;
CREATE TRIGGER IF NOT EXISTS tasks_move_by_their_table
    BEFORE UPDATE ON tasks
    WHEN OLD.state NOT IN ('cancelled', 'dead', 'failed', 'lost', 'succeeded', 'timed_out')
    AND NEW.state IS NOT OLD.state
    AND (OLD.state || '>' || NEW.state NOT IN ('queued>cancelled', 'queued>dead', 'queued>failed',
        'queued>lost', 'queued>running', 'queued>succeeded', 'queued>timed_out',
        'running>cancelled', 'running>failed', 'running>lost', 'running>succeeded',
        'running>timed_out')
        OR (NEW.state = 'dead' AND NEW.delivered_at IS NOT NULL))
    BEGIN SELECT RAISE(ABORT, 'halfpi: a task cannot make this move (core.states.OUTBOX)'); END;
"""
