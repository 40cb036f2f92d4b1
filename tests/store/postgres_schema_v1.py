"""The PostgreSQL schema of version 1 (``meta.schema_version = 1``): the
SQLite schema at its version 4, plus ``conversation_fences``.

Frozen here (the statements of that release, long ones wrapped) so that a
test can build a database exactly as a node of that version left it, and
upgrade it. Never edit it: a new schema version gets a new file.
"""

SCHEMA_V1: tuple[str, ...] = (
    """CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    )""",
    """CREATE TABLE credentials (
        principal_id TEXT PRIMARY KEY,
        label TEXT NOT NULL,
        kind TEXT NOT NULL,
        profile TEXT NOT NULL,
        scopes TEXT NOT NULL,
        token_hash TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        CONSTRAINT credentials_token_hash UNIQUE (token_hash)
    )""",
    """CREATE UNIQUE INDEX credentials_live_label ON credentials (kind, label) WHERE revoked_at
    IS NULL""",
    """CREATE TABLE conversations (
        conversation_id TEXT PRIMARY KEY,
        name TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        created_by TEXT,
        seq_reserved BIGINT NOT NULL DEFAULT 0,
        epoch TEXT
    )""",
    """CREATE TABLE conversation_fences (
        conversation_id TEXT PRIMARY KEY,
        fence BIGINT NOT NULL
    )""",
    """CREATE TABLE events (
        conversation_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        ts DOUBLE PRECISION NOT NULL,
        terminal_of TEXT,
        PRIMARY KEY (conversation_id, seq)
    )""",
    """CREATE UNIQUE INDEX events_terminal_of ON events (terminal_of) WHERE terminal_of IS NOT
    NULL""",
    """CREATE TABLE messages (
        conversation_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        request_id TEXT,
        status TEXT,
        ts DOUBLE PRECISION NOT NULL,
        error_code TEXT,
        reason TEXT,
        usage TEXT,
        PRIMARY KEY (conversation_id, seq)
    )""",
    """CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        principal_id TEXT NOT NULL,
        status TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        content TEXT,
        error_code TEXT
    )""",
    """CREATE INDEX runs_open ON runs (status) WHERE finished_at IS NULL""",
    """CREATE INDEX runs_by_request ON runs (conversation_id, request_id)""",
    """CREATE TABLE requests (
        principal_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        type TEXT NOT NULL,
        digest TEXT NOT NULL,
        status TEXT NOT NULL,
        conversation_id TEXT,
        run_id TEXT,
        accepted TEXT NOT NULL,
        result TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        PRIMARY KEY (principal_id, request_id)
    )""",
    """CREATE INDEX requests_open ON requests (status) WHERE finished_at IS NULL""",
    """CREATE INDEX requests_finished ON requests (principal_id, finished_at) WHERE finished_at
    IS NOT NULL""",
    """CREATE TABLE tombstones (
        principal_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        digest TEXT NOT NULL,
        result TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (principal_id, request_id)
    )""",
    """CREATE TABLE tool_calls (
        tool_call_id TEXT PRIMARY KEY,
        conversation_id TEXT NOT NULL,
        chat_run_id TEXT NOT NULL,
        request_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        detail_mode TEXT NOT NULL,
        args_digest TEXT NOT NULL,
        args TEXT,
        scan_warnings TEXT NOT NULL,
        called_seq BIGINT NOT NULL,
        status TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        hand_id TEXT,
        run_id TEXT,
        success BOOLEAN,
        output_bytes BIGINT,
        digest TEXT,
        truncated BOOLEAN,
        error_category TEXT,
        result TEXT,
        completed_seq BIGINT,
        finished_at DOUBLE PRECISION
    )""",
    """CREATE INDEX tool_calls_by_conversation ON tool_calls (conversation_id, called_seq)""",
    """CREATE INDEX tool_calls_open ON tool_calls (status) WHERE finished_at IS NULL""",
    """CREATE TABLE approvals (
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
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        decision TEXT,
        decided_by TEXT,
        decision_reason TEXT,
        decided_at DOUBLE PRECISION
    )""",
    """CREATE INDEX approvals_open ON approvals (status) WHERE decided_at IS NULL""",
    """CREATE TABLE tool_runs (
        run_id TEXT PRIMARY KEY,
        tool_call_id TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        hand_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        exit_code BIGINT,
        output_bytes BIGINT,
        digest TEXT
    )""",
    """CREATE INDEX tool_runs_open ON tool_runs (status) WHERE finished_at IS NULL""",
    """INSERT INTO meta (key, value) VALUES ('credentials_version', '0')""",
    """
CREATE OR REPLACE FUNCTION halfpi_fence(conv TEXT, token BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO conversation_fences AS f (conversation_id, fence) VALUES (conv, token)
    ON CONFLICT (conversation_id) DO UPDATE SET fence = EXCLUDED.fence
        WHERE f.fence <= EXCLUDED.fence;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'halfpi: fencing token % of conversation % is stale', token, conv
            USING ERRCODE = 'HPFEN';
    END IF;
END $$
""",
    """
CREATE OR REPLACE FUNCTION halfpi_first_outcome_stands() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'halfpi: this run already has its outcome' USING ERRCODE = 'HPI10';
END $$
""",
    """CREATE TRIGGER runs_first_outcome_stands BEFORE UPDATE ON runs FOR EACH ROW WHEN
    (OLD.finished_at IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status) EXECUTE
    FUNCTION halfpi_first_outcome_stands()""",
    """CREATE TRIGGER tool_runs_first_outcome_stands BEFORE UPDATE ON tool_runs FOR EACH ROW
    WHEN (OLD.finished_at IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status) EXECUTE
    FUNCTION halfpi_first_outcome_stands()""",
    """CREATE TRIGGER tool_calls_first_outcome_stands BEFORE UPDATE ON tool_calls FOR EACH ROW
    WHEN (OLD.finished_at IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status) EXECUTE
    FUNCTION halfpi_first_outcome_stands()""",
    """CREATE TRIGGER approvals_first_outcome_stands BEFORE UPDATE ON approvals FOR EACH ROW
    WHEN (OLD.decided_at IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status) EXECUTE
    FUNCTION halfpi_first_outcome_stands()""",
)
