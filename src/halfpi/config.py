"""Configuration as frozen value objects (DESIGN §11 defaults).

Every number the contract names lives here once; the rest of the code reads
it from a :class:`Config`, so tests can shrink limits to provoke the edge
cases deterministically.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

import msgspec

from halfpi.core.limits import KiB, MiB, QueueLimits, RequestRetention
from halfpi.core.throttle import ThrottleLimits

DEFAULT_PORT = 15707
PROTOCOL_VERSION = 3


@dataclass(frozen=True, slots=True)
class JournalLimits:
    """In-process journal retention (DESIGN §4.2)."""

    events: int = 10_000
    seconds: float = 300.0
    bytes_per_conversation: int = 64 * MiB
    bytes_total: int = 512 * MiB


DEFAULT_SYSTEM_PROMPT = (
    "You are the agent of halfpi, an assistant the user reaches from any device. "
    "Answer briefly and plainly. You may call the tools you are offered: they run on "
    "the user's own machines, and a person approves commands before they run."
)
AGENT_FILE = "agent.toml"  # in the home: which agent, and the model's settings
AGENTS = ("scripted", "openai")


class ModelSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The model provider's settings (docs/agent.md, "Models"): ``[openai]``
    in HOME/agent.toml, then ``--model`` and ``--base-url``. Never the key
    (``$OPENAI_API_KEY`` or a 0600 key file: it is read when the provider
    starts and kept in its client only)."""

    model: str = ""
    # None: OpenAI's own (https://api.openai.com/v1).
    base_url: str | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Model requests per chat: each answers, or calls tools and asks again.
    step_limit: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16
    # Estimated tokens (characters / 4, docs/agent.md) for the system prompt,
    # the history that fits (oldest dropped first) and the user's message.
    context_budget: Annotated[int, msgspec.Meta(ge=256)] = 16_000
    # The tools offered, by name (None: every tool the conversation's Hand has).
    tools: tuple[str, ...] | None = None
    # The first request's tool_choice ("auto", "none", "required" or a tool's
    # name, forced), and every later one's, once tools ran.
    tool_choice: str = "auto"
    later_tool_choice: str = "auto"
    # Ask for token usage in the stream (stream_options.include_usage).
    stream_usage: bool = True
    # A failed request is retried this many times while it showed nothing.
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    # How long to wait for the next byte of an answer.
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    # Where the key is, when not in $OPENAI_API_KEY (relative: to the home).
    api_key_file: str | None = None


def read_agent_file(home: Path) -> tuple[str | None, dict[str, Any]]:
    """HOME/agent.toml: its ``agent`` and its ``[openai]`` table (raw).
    Missing: (None, {}). Raises ValueError, one line, for a file that is
    not what it must be."""
    path = home / AGENT_FILE
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None, {}  # (a home that is not a directory is said when it is opened)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    # Imported only when there is a file: a home without one (the embedded
    # default's) never loads the parser (docs/performance.md, "Start-up").
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"agent", "openai"})
    if unknown:
        raise ValueError(f"{path}: unknown key {unknown[0]!r} (known: agent, [openai])")
    agent = data.get("agent")
    if agent is not None and agent not in AGENTS:
        raise ValueError(f"{path}: agent must be one of {', '.join(AGENTS)}, not {agent!r}")
    table = data.get("openai", {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [openai] must be a table")
    return agent, table


def model_settings(values: dict[str, Any], where: str = AGENT_FILE) -> ModelSettings:
    """Settings from raw values; ValueError naming the key for a wrong one."""
    try:
        return msgspec.convert(values, ModelSettings)
    except msgspec.ValidationError as exc:
        why = str(exc).replace("$.", "[openai].")
        why = why.replace("Object contains unknown field", "[openai] has no setting")
        raise ValueError(f"{where}: {why}") from None


@dataclass(frozen=True, slots=True)
class Config:
    home: Path
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    heartbeat_s: float = 15.0
    dead_after_s: float = 45.0
    hello_timeout_s: float = 10.0
    max_frame_bytes: int = 1 * MiB
    max_chat_bytes: int = 256 * KiB
    invalid_frames_before_close: int = 3
    queue: QueueLimits = field(default_factory=QueueLimits)
    journal: JournalLimits = field(default_factory=JournalLimits)
    # An idle conversation (no subscriber, no chat, tool run or approval,
    # nothing published) is unloaded from memory after this long; None: the
    # journal's time window (journal.seconds). docs/protocol.md §7 (resume).
    unload_idle_s: float | None = None
    # The backends, picked in one place (halfpi.wiring; docs/operations.md,
    # "The store"). The Store: ``sqlite:///PATH``, None for HOME/halfpi.db;
    # ``postgresql://…`` for cluster mode (docs/cluster.md). The Journal: "memory"
    # (in-process), the only kind so far; "redis" is reserved.
    store_url: str | None = None
    journal_kind: str = "memory"
    # Cluster mode (docs/cluster.md, "Redis"): ``redis://…`` for the Redis
    # journal (journal_kind "redis"), and this node's name for its leases.
    redis_url: str | None = None
    node_id: str | None = None
    # Cluster mode proper (a PostgreSQL Store and a Redis journal): how long a
    # conversation lease lives unrenewed; its owner renews it every third of
    # this (docs/cluster.md, "Several nodes"). A dead owner's conversations
    # are taken over this long after it stopped renewing.
    lease_ms: int = 10_000
    # How long a node waits for the owner to answer a forwarded command
    # before it answers ``unavailable`` (a retry with the same request_id is
    # safe: the registry is shared, I5).
    forward_timeout_s: float = 10.0
    requests: RequestRetention = field(default_factory=RequestRetention)
    # Browsers must present one of these Origins; clients that send no Origin
    # header (scripts, terminals) are not browsers and are not checked.
    allowed_origins: tuple[str, ...] = ()
    scripted_delta_ms: float = 20.0
    # Which agent answers (``--agent``): "scripted" (the embedded default) or
    # "openai" (a model, with ``model``'s settings).
    agent: str = "scripted"
    model: ModelSettings | None = None
    # The reply's text so far is saved while it streams (DESIGN §5): at most
    # this many seconds or characters behind what Faces were shown. None:
    # never (only the benchmarks' baseline turns it off).
    checkpoint_s: float | None = 1.0
    checkpoint_chars: int = 4096
    shutdown_grace_s: float = 5.0
    # How often the Mind re-reads the credential table so that a revocation
    # made by another process closes live connections within a second.
    credential_poll_s: float = 0.25
    snapshot_messages: int = 50
    approval_ttl_s: float = 120.0
    # A Hand away longer than this loses its runs (they become ``lost``).
    hand_grace_s: float = 10.0
    # Start an in-process Hand named "local" so the embedded set-up can run tools.
    local_hand: bool = True
    # This Mind's floor: tools that need a human's approval on every Hand,
    # whatever the Hand's own rule says (docs/hands.md, "Tool policy").
    approval_required: tuple[str, ...] = ("exec_command",)
    tool_history: int = 50
    # The local Hand's tool policy (DESIGN §8): its roots (default: the
    # Mind's working directory) and (tool, rule) pairs over the defaults.
    hand_roots: tuple[str, ...] = ()
    hand_approval: tuple[tuple[str, str], ...] = ()
    # -- connections: caps, throttling, TLS (docs/operations.md) ------------------
    # Live connections per principal, Faces and Hands alike (DESIGN §11); 0: no cap.
    max_connections_per_principal: int = 64
    # Failed handshakes, throttled per address (core/throttle.py).
    handshake_throttle: ThrottleLimits = field(default_factory=ThrottleLimits)
    # An unknown token re-reads the credential table, at most once per this
    # interval however many arrive (a credential just created waits no longer).
    credential_reread_s: float = 0.1
    # Peers (a TLS-terminating proxy) trusted to name the client in
    # X-Forwarded-For; the throttle then counts per real client address.
    trusted_proxies: tuple[str, ...] = ()
    # Serve wss:// natively: a PEM certificate (chain) and its private key.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # What carries /v1/face and /v1/hand (``--server``): "native", our own
    # asyncio protocol, or "asgi", the Starlette application under uvicorn
    # (docs/asgi.md). ``halfpi.process.SERVERS`` maps the names.
    server: str = "native"
    # GET /metrics answers only a request with this bearer token when set
    # (``--metrics-token-file``); None: it is served to anyone who can
    # reach the port, as /healthz is (docs/operations.md).
    metrics_token: str | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def cluster(self) -> bool:
        """Several nodes share this Mind's truth: a PostgreSQL Store and a
        Redis journal (leases, fencing, forwarding; docs/cluster.md)."""
        return self.postgres and self.journal_kind == "redis"

    @property
    def local_hand_label(self) -> str:
        """The embedded Hand's label: ``local``; in cluster mode one per node
        (``local-NODE``), since the credentials are shared by every node."""
        return f"local-{self.node_id}" if self.cluster and self.node_id else "local"

    @property
    def db_path(self) -> Path:
        """The SQLite database: the file ``store_url`` names, else HOME/halfpi.db."""
        return self.home / "halfpi.db" if self.store_url is None else sqlite_file(self.store_url)

    @property
    def postgres(self) -> bool:
        """True when the Store is PostgreSQL (``postgresql://…``)."""
        return self.store_url is not None and is_postgres_url(self.store_url)

    @property
    def private_paths(self) -> tuple[Path, ...]:
        """What no tool may ever reach, whatever the policy (DESIGN §8): the
        home, and the database's files wherever the store keeps them (none
        on this machine for PostgreSQL)."""
        if self.postgres:
            return (self.home,)
        db = self.db_path
        return (self.home, *(db.with_name(db.name + s) for s in ("", "-wal", "-shm", "-journal")))

    @property
    def face_token_path(self) -> Path:
        return self.home / "face.token"

    @property
    def hand_token_path(self) -> Path:
        return self.home / "hand.token"

    def origins(self, port: int | None = None) -> tuple[str, ...]:
        """Allowed browser Origins: the configured ones plus the Mind's own
        (on ``port``, the port actually bound when ``--port 0`` picked one)."""
        port = port or self.port
        scheme = "https" if self.tls else "http"
        own = (f"{scheme}://127.0.0.1:{port}", f"{scheme}://localhost:{port}")
        return tuple(dict.fromkeys(self.allowed_origins + own))


_USE_SQLITE = "use sqlite:///PATH (the default is sqlite:///HOME/halfpi.db)"
_USE_STORE = (
    "use sqlite:///PATH (the default is sqlite:///HOME/halfpi.db)"
    " or postgresql://HOST/DATABASE (cluster mode)"
)


_POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_postgres_url(url: str) -> bool:
    """True for ``postgresql://…`` (also ``postgres://``, ``postgresql+driver://``)."""
    return urlsplit(url).scheme.lower().split("+", 1)[0] in _POSTGRES_SCHEMES


def check_store_url(url: str) -> str:
    """``url`` if this halfpi can use it as a store (``sqlite:`` or
    ``postgresql:``), else ValueError: one line that never repeats the URL."""
    if is_postgres_url(url):
        return url  # asyncpg reads the rest (host, port, user, database, options)
    sqlite_file(url)
    return url


def sqlite_file(url: str) -> Path:
    """The database file a store URL names (``sqlite:///PATH``, or
    ``sqlite:PATH`` relative). Raises ValueError, one line that never
    repeats the URL (it may hold a password), for any URL that names no
    SQLite file (``postgresql://`` names a server: :func:`check_store_url`)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower().split("+", 1)[0]
    if scheme in _POSTGRES_SCHEMES:
        raise ValueError(f"a PostgreSQL store names no file on this machine: {_USE_SQLITE}")
    if scheme != "sqlite":
        what = f"{scheme}: is not a store this halfpi knows" if scheme else "not a store URL"
        raise ValueError(f"{what}: {_USE_STORE}")
    if parts.netloc:
        raise ValueError(f"a sqlite: URL names a file on this machine, with no host: {_USE_SQLITE}")
    if parts.query or parts.fragment:
        raise ValueError(f"a sqlite: URL takes no options: {_USE_SQLITE}")
    if not parts.path:
        raise ValueError(f"the sqlite: URL names no file: {_USE_SQLITE}")
    return Path(unquote(parts.path)).expanduser()


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (``--host``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_home() -> Path:
    env = os.environ.get("HALFPI_HOME")
    return Path(env).expanduser() if env else Path.home() / ".halfpi"


def env_delta_ms(default: float = 20.0) -> float:
    raw = os.environ.get("HALFPI_SCRIPTED_DELTA_MS")
    if raw is None or raw == "":
        return default
    return max(0.0, float(raw))
