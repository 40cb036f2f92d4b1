"""The halfpi command line: the Mind, a Face or a Hand, and their credentials.

Every user error is one line on stderr that starts with ``halfpi:``, and a
non-zero exit status — 64 when the command line itself is wrong, 1 for
anything else (a port in use, a home that cannot be used) — never a
traceback (DESIGN §12). A traceback means a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from halfpi import __version__
from halfpi.config import (
    AGENT_FILE,
    AGENTS,
    DEFAULT_PORT,
    Config,
    ModelSettings,
    check_store_url,
    default_home,
    env_delta_ms,
    model_settings,
    read_agent_file,
)
from halfpi.core.policy import Rule, parse_approval
from halfpi.core.scopes import ALL_FACE_SCOPES, PROFILES
from halfpi.extras import MissingExtra, missing, need
from halfpi.mind.home import Address, CannotStart, StaleAddress, prepare_home, read_address

if TYPE_CHECKING:
    from halfpi.client.redial import Locate
    from halfpi.store.base import Store

T = TypeVar("T")

EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 1, 64, 130
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

DESCRIPTION = """\
halfpi: an always-on agent (the Mind), the Faces people and scripts reach
it from, and the Hands it acts through."""

EPILOG = f"""\
start here:
  halfpi mind                 run the Mind on ws://127.0.0.1:{DEFAULT_PORT}, data in ~/.halfpi
  halfpi face                 the terminal face, on the Mind of ~/.halfpi
  halfpi face --mode headless JSON lines in and out, for scripts (see examples/ask.sh)
  halfpi face add phone       a credential for another Face (prints its token once)
  halfpi hand add pi          a credential for a Hand on another device

Each command has its own --help. Errors are one line on stderr and a
non-zero exit status: 64 for a wrong command line, 1 for anything else."""


class UserError(Exception):
    """A mistake a user can fix: printed as one ``halfpi:`` line, exit ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line and exit status 64 (EX_USAGE)."""

    commands: tuple[str, ...] = ()  # the top-level parser's subcommands

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"halfpi: {message}; see '{self.prog} --help'\n")
        raise SystemExit(EXIT_USAGE)


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a port: use 0-65535 (0 picks a free one)"
        )
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: use 0 or more")
    return value


def non_negative_int(text: str) -> int:
    value = non_negative_float(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text} is not a whole number")
    return int(value)


def positive_seconds(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/?#\s]+/?$", re.IGNORECASE)


def origin(text: str) -> str:
    if not _ORIGIN.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an Origin: use scheme://host[:port], e.g. http://localhost:3000"
        )
    return text.rstrip("/")


def store_url(text: str) -> str:
    """A store URL this halfpi can use (``--store``), else one line why not."""
    try:
        check_store_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _home(value: str | None) -> Path:
    """The home, absolute: relative to where the command runs, and said in
    full wherever it is shown or written (mind.json, the listening line)."""
    return Path(os.path.abspath(Path(value).expanduser() if value else default_home()))


def _listen_problem(args: argparse.Namespace) -> str | None:
    """Why the Mind must not listen as asked (TLS and --insecure), or None."""
    from halfpi.config import is_loopback

    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together"
    if args.tls_cert is not None:
        import ssl

        from halfpi.gateway.native import server_tls_context

        try:
            server_tls_context(Path(args.tls_cert), Path(args.tls_key))
        except (OSError, ssl.SSLError) as exc:
            return f"cannot use --tls-cert/--tls-key: {getattr(exc, 'strerror', None) or exc}"
        return None
    if not is_loopback(args.host) and not args.insecure:
        return (
            f"refusing to listen on {args.host} without TLS: tokens would cross the network "
            "in clear text; pass --tls-cert/--tls-key, or --insecure if a TLS proxy or a "
            "trusted network protects the traffic"
        )
    return None


def _mind_address(home: Path) -> Address | None:
    """The address the Mind on ``home`` wrote; a stale one is named and ignored."""
    try:
        return read_address(home)
    except StaleAddress as exc:
        print(f"halfpi: {exc}", file=sys.stderr)
        return None


def cmd_mind(args: argparse.Namespace) -> int:
    from halfpi.process import serve

    problem = _listen_problem(args)
    if problem is not None:
        raise UserError(problem, EXIT_USAGE)
    try:
        delta_ms = env_delta_ms() if args.delta_ms is None else args.delta_ms
    except ValueError:
        raise UserError("HALFPI_SCRIPTED_DELTA_MS is not a number", EXIT_USAGE) from None
    home = _home(args.home)
    agent, model = _agent(args, home)
    config = Config(
        home=home,
        agent=agent,
        model=model,
        host=args.host,
        port=args.port,
        scripted_delta_ms=delta_ms,
        allowed_origins=tuple(args.allow_origin or ()),
        local_hand=not args.no_local_hand,
        max_connections_per_principal=args.max_connections_per_principal,
        trusted_proxies=tuple(args.trusted_proxy or ()),
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
        approval_ttl_s=args.approval_ttl,
        hand_grace_s=args.hand_grace,
        hand_roots=tuple(args.hand_root or ()),
        hand_approval=tuple((tool, rule.value) for tool, rule in args.hand_approval or ()),
        server=args.server,
        store_url=args.store,
        journal_kind="redis" if args.redis else "memory",
        redis_url=args.redis,
        node_id=args.node_id,
        lease_ms=args.lease_ms,
        metrics_token=_metrics_token(args.metrics_token_file),
    )
    _need_extras(config)  # before other mistakes: no other fix makes the feature run
    if config.cluster and not config.node_id:
        print(
            "halfpi: cluster mode (--store postgresql://… with --redis) needs --node-id NAME, "
            "unique in the cluster",
            file=sys.stderr,
        )
        return 2
    from halfpi import loop
    from halfpi.errors import HomeInUse
    from halfpi.logs import configure

    configure(args.log_level, args.log_format)

    try:
        with contextlib.suppress(KeyboardInterrupt):
            loop.run(serve(config))  # asyncio, or uvloop (halfpi.loop)
    except HomeInUse as exc:  # another Mind owns this home (DESIGN §12)
        print(f"halfpi: {exc}", file=sys.stderr)
        return 1
    return 0


def _need_extras(config: Config) -> None:
    """The optional packages the configured features import are installed,
    or one line names the extra to install (``halfpi.extras``)."""
    if config.agent == "openai":
        need("openai", "the model provider (--agent openai)")
    if config.postgres:
        need("asyncpg", "the PostgreSQL store (--store postgresql://…)")
    if config.journal_kind == "redis":
        need("redis", "the Redis journal (--redis)")


def _metrics_token(path: str | None) -> str | None:
    """The scrape token in ``--metrics-token-file`` (its first line)."""
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise UserError(f"cannot read the metrics token file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"the metrics token file {path} is not text") from None
    if not token:
        raise UserError(f"the metrics token file {path} is empty")
    return token


def _agent(args: argparse.Namespace, home: Path) -> tuple[str, ModelSettings | None]:
    """Which agent answers, and the model's settings: HOME/agent.toml, then
    --agent, --model and --base-url over it (docs/agent.md, "Models")."""
    try:
        named, values = read_agent_file(home)
    except ValueError as exc:  # the file, not the command line, is wrong: exit 1
        raise UserError(str(exc)) from None
    agent = args.agent or named or "scripted"
    if agent != "openai":
        if args.model or args.base_url or args.api_key_file:
            raise UserError("--model, --base-url and --api-key-file go with --agent openai",
                            EXIT_USAGE)
        return agent, None
    # The missing extra first: no other fix (a model name) makes it run.
    need("openai", "the model provider (--agent openai)")
    values = dict(values)
    if args.model:
        values["model"] = args.model
    if args.base_url:
        values["base_url"] = args.base_url
    if args.api_key_file:  # relative: to where halfpi runs, as any path on its command line
        values["api_key_file"] = str(Path(args.api_key_file).expanduser().absolute())
    try:
        settings = model_settings(values, str(home / AGENT_FILE))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not settings.model:
        raise UserError(
            f"--agent openai needs a model: --model NAME, or model = \"NAME\" under [openai] "
            f"in {home / AGENT_FILE}",
            EXIT_USAGE,
        )
    return agent, settings


def _base_url(text: str) -> str:
    if not re.match(r"^https?://[^/?#\s]+", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http(s) URL, e.g. http://127.0.0.1:8080/v1"
        )
    return text.rstrip("/")


def _on_store(args: argparse.Namespace, work: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``work`` on the Store the Mind of ``--home`` uses (or ``--store``),
    opened and closed around it; a store that cannot be used is one line."""
    from halfpi.errors import StoreError
    from halfpi.wiring import run_on_store

    config = Config(home=_home(args.home), store_url=args.store)
    _need_extras(config)
    prepare_home(config.home)
    try:
        return run_on_store(config, work)
    except StoreError as exc:
        raise UserError(str(exc)) from None


def cmd_face_add(args: argparse.Namespace) -> int:
    from halfpi.errors import LabelInUse
    from halfpi.mind.auth import add_credential

    extra = tuple(s for s in (args.scopes or "").split(",") if s)
    try:
        added = _on_store(
            args,
            lambda store: add_credential(
                store,
                "face",
                args.label,
                args.profile,
                time.time(),
                extra_scopes=extra,
                approve=args.approve,
            ),
        )
    except (ValueError, LabelInUse) as exc:
        raise UserError(str(exc)) from None
    c = added.credential
    print(f"label:        {c.label}", file=sys.stderr)
    print(f"principal_id: {c.principal_id}", file=sys.stderr)
    print(f"profile:      {c.profile}", file=sys.stderr)
    print(f"scopes:       {' '.join(sorted(c.scopes))}", file=sys.stderr)
    print("token (shown once, store it now):", file=sys.stderr)
    print(added.token)
    return 0


def cmd_face_link(args: argparse.Namespace) -> int:
    """A one-time sign-in link for the web face (docs/faces.md, "Signing in")."""
    from halfpi.mind.links import create_link

    home = _home(args.home)
    prepare_home(home)
    extra = tuple(s for s in (args.scopes or "").split(",") if s)
    try:
        code = create_link(home, args.label, args.profile, time.time(), ttl_s=args.ttl,
                           extra_scopes=extra, approve=args.approve)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    base = args.url
    if base is None:
        address = _mind_address(home)
        face_url = address.face_url if address else f"ws://127.0.0.1:{DEFAULT_PORT}/v1/face"
        base = re.sub(r"^ws", "http", face_url).removesuffix("/v1/face")
    minutes = args.ttl / 60
    print(f"one-time sign-in link for a new credential {args.label!r} ({args.profile}); "
          f"it works once, within {minutes:g} min:", file=sys.stderr)
    print(f"{base.rstrip('/')}/#link={code}")
    return 0


def _list_credentials(args: argparse.Namespace, kind: str) -> int:
    rows = [c for c in _on_store(args, lambda store: store.credentials()) if c.kind == kind]
    print(f"{'LABEL':<20} {'PROFILE':<9} {'STATE':<8} {'PRINCIPAL':<34} SCOPES")
    for c in rows:
        state = "live" if c.live else "revoked"
        print(
            f"{c.label:<20} {c.profile:<9} {state:<8} {c.principal_id:<34} "
            f"{','.join(sorted(c.scopes))}"
        )
    return 0


def _revoke(args: argparse.Namespace, kind: str) -> int:
    if _on_store(args, lambda store: store.revoke_credential(kind, args.label, time.time())):
        print(f"revoked {args.label}; its live connections close within a second", file=sys.stderr)
        return 0
    print(f"halfpi: no live {kind} credential labelled {args.label!r}", file=sys.stderr)
    return 1


def _usage_error(message: str) -> NoReturn:
    raise UserError(message, EXIT_USAGE)


def _token(args: argparse.Namespace, env: str) -> str | None:
    """``--token``, ``--token-file``, ``$<env>`` or ``$<env>_FILE``, in that order.
    A file keeps the token out of ``ps`` (a command line is visible to all)."""
    if args.token and args.token_file:
        _usage_error("pass --token or --token-file, not both")
    if args.token:
        return str(args.token)
    path = args.token_file
    if not path:
        if os.environ.get(env):
            return os.environ[env]
        path = os.environ.get(f"{env}_FILE")
        if not path:
            return None
    try:
        token = Path(path).read_text().strip()
        mode = Path(path).stat().st_mode
    except OSError as exc:
        _usage_error(f"cannot read the token file {path}: {exc.strerror or exc}")
    if not token:
        _usage_error(f"the token file {path} is empty")
    if mode & 0o077:
        print(
            f"halfpi: warning: the token file {path} is readable by others "
            f"(mode {mode & 0o777:o}); chmod 600 it",
            file=sys.stderr,
        )
    return token


def _ca_file(args: argparse.Namespace) -> str | None:
    """``--ca-file`` or ``$HALFPI_CA_FILE``: checked now, one clear line if unusable."""
    path: str | None = args.ca_file or os.environ.get("HALFPI_CA_FILE") or None
    if path is not None:
        import ssl

        from halfpi.client.transport import client_tls_context

        try:
            client_tls_context(path)
        except (OSError, ssl.SSLError) as exc:
            _usage_error(f"cannot use the CA file {path}: {getattr(exc, 'strerror', None) or exc}")
    return path


def _face_target(args: argparse.Namespace) -> tuple[list[str], str, Locate | None]:
    """Where to dial: ``--url``, else ``$HALFPI_URL``, else the address the
    home's Mind wrote (DESIGN §12), else the default port on loopback; in
    that last case, how to find the Mind again before every redial."""
    home = _home(args.home)
    token = _token(args, "HALFPI_TOKEN")
    ca_file = _ca_file(args)
    if ca_file is not None:
        os.environ["HALFPI_CA_FILE"] = ca_file  # the SDK's connector verifies wss:// with it
    if not token:
        path = Config(home=home).face_token_path
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            raise UserError(
                f"no token: pass --token, set HALFPI_TOKEN, or start `halfpi mind` once "
                f"so that {path} exists",
                EXIT_USAGE,
            ) from None
        except OSError as exc:
            raise UserError(f"cannot read the token file {path}: {exc.strerror}") from None
    urls = args.url or [os.environ.get("HALFPI_URL") or ""]
    if not urls[0]:
        address = _mind_address(home)
        urls = [address.face_url if address else f"ws://127.0.0.1:{DEFAULT_PORT}/v1/face"]
        return urls, token, _locator(home)
    return urls, token, None


def _locator(home: Path, *, hand: bool = False) -> Locate:
    """Where the home's Mind says it is now (its Face door, or its Hand door),
    read before every redial: a Mind restarted with ``--port 0`` listens on
    a new port and is found there. A missing or stale file says nothing
    (the last address is dialed)."""

    def locate() -> list[str] | None:
        try:
            address = read_address(home)
        except StaleAddress:
            return None
        if address is None:
            return None
        return [address.hand_url if hand else address.face_url]

    return locate


def cmd_face(args: argparse.Namespace) -> int:
    if args.mode != "headless":  # the missing extra first: no other fix makes it run
        need("textual", "the terminal face")
    urls, token, locate = _face_target(args)
    if args.mode == "headless":
        # stderr is for people: every line starts with "halfpi: " (docs/faces.md).
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="halfpi: %(message)s")
        from halfpi.face.headless import HeadlessOptions, run_headless

        options = HeadlessOptions(
            urls,
            token,
            conversation=args.conversation,
            new_conversation=args.new_conversation,
            retry_interrupted=args.retry_interrupted,
            connect_timeout=args.connect_timeout,
            locate=locate,
        )
        return asyncio.run(run_headless(options))
    if not sys.stdout.isatty() or not sys.stdin.isatty():
        print(
            "halfpi: the terminal face needs a terminal (stdin and stdout are not both a tty).\n"
            "For scripts and pipes use:  halfpi face --mode headless",
            file=sys.stderr,
        )
        return 2
    from halfpi.face.terminal import run_terminal

    # The screen is the terminal: logs go to a file, never onto the screen.
    from halfpi.private import create_private

    home = _home(args.home)
    prepare_home(home)
    logging.basicConfig(
        level=logging.WARNING,
        filename=str(create_private(home / "face.log")),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    return run_terminal(urls, token, conversation=args.conversation, locate=locate)


def build_parser() -> Parser:
    parser = Parser(
        prog="halfpi",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"halfpi {__version__}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    home_help = "data directory (default $HALFPI_HOME, else ~/.halfpi)"
    store_help = (
        "where the Mind keeps its truth: sqlite:///PATH (default sqlite:///HOME/halfpi.db) "
        "or postgresql://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE (cluster mode)"
    )

    mind = sub.add_parser(
        "mind",
        help="run the Mind",
        description="Run the Mind: the always-on server Faces and Hands connect to. "
        "It prints one JSON line on stdout once it listens, logs to stderr, and drains "
        "on SIGINT/SIGTERM.",
    )
    mind.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 listens on every interface)",
    )
    mind.add_argument(
        "--port",
        type=port,
        default=DEFAULT_PORT,
        help=f"port to listen on, 0-65535 (default {DEFAULT_PORT}; 0 picks a free one, "
        "which the Mind writes to HOME/mind.json for Faces to find)",
    )
    mind.add_argument("--home", metavar="DIR", help=home_help)
    mind.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    mind.add_argument(
        "--redis",
        metavar="URL",
        help="cluster mode: keep the journal in Redis at this redis:// URL "
        "(docs/cluster.md); default: in this process",
    )
    mind.add_argument(
        "--node-id",
        metavar="NAME",
        help="cluster mode: this node's name, unique in the cluster (its leases); "
        "default: a name made at start",
    )
    mind.add_argument(
        "--lease-ms",
        type=int,
        default=10_000,
        metavar="MS",
        help="cluster mode: how long a conversation lease lives unrenewed; a dead "
        "node's conversations are taken over this long after it stopped (default 10000)",
    )
    mind.add_argument(
        "--agent",
        choices=AGENTS,
        default=None,
        help="who answers: scripted (deterministic, no network) or openai (a model on an "
        f"OpenAI-compatible server; docs/agent.md) (default: agent in HOME/{AGENT_FILE}, "
        "else scripted)",
    )
    mind.add_argument(
        "--model",
        metavar="NAME",
        help=f"--agent openai: the model to ask (default: model under [openai] in "
        f"HOME/{AGENT_FILE})",
    )
    mind.add_argument(
        "--base-url",
        type=_base_url,
        metavar="URL",
        help="--agent openai: the server's API root, e.g. http://127.0.0.1:8080/v1 "
        "(default: base_url in the file, else OpenAI's)",
    )
    mind.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="--agent openai: the file holding the provider's API key, mode 0600 (the "
        "preferred way; it wins over $OPENAI_API_KEY) (default: api_key_file under "
        f"[openai] in HOME/{AGENT_FILE}, else $OPENAI_API_KEY, else HOME/openai.key)",
    )
    mind.add_argument(
        "--delta-ms",
        type=non_negative_float,
        default=None,
        metavar="MS",
        help="scripted agent pace in milliseconds between deltas "
        "(default $HALFPI_SCRIPTED_DELTA_MS, else 20)",
    )
    mind.add_argument(
        "--allow-origin",
        action="append",
        type=origin,
        metavar="ORIGIN",
        help="an extra browser Origin allowed to connect, e.g. http://localhost:3000 "
        "(repeatable; default: only the Mind's own)",
    )
    mind.add_argument(
        "--no-local-hand",
        action="store_true",
        help="do not start the in-process Hand named 'local' (default: it starts)",
    )
    _log_flags(mind)
    mind.add_argument(
        "--approval-ttl",
        type=positive_seconds,
        default=Config(home=Path()).approval_ttl_s,
        metavar="SECONDS",
        help="how long a tool approval waits for a decision before it expires "
        "(default %(default).0f)",
    )
    mind.add_argument(
        "--hand-grace",
        type=positive_seconds,
        default=Config(home=Path()).hand_grace_s,
        metavar="SECONDS",
        help="how long a Hand may stay away before its runs are lost (default %(default).0f)",
    )
    mind.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve wss://: certificate (PEM chain; default: none, plain ws://)",
    )
    mind.add_argument(
        "--tls-key", metavar="FILE", help="the certificate's private key (PEM; default: none)"
    )
    mind.add_argument(
        "--insecure",
        action="store_true",
        help="allow plain ws:// on a non-loopback --host, behind a TLS proxy (default: refuse)",
    )
    mind.add_argument(
        "--max-connections-per-principal",
        type=int,
        default=64,
        metavar="N",
        help="live connections per credential (default 64; 0: no cap)",
    )
    mind.add_argument(
        "--trusted-proxy",
        action="append",
        metavar="ADDR",
        help="a proxy address whose X-Forwarded-For names the client (repeatable; default: none)",
    )
    mind.add_argument(
        "--metrics-token-file",
        metavar="FILE",
        help="GET /metrics answers only 'Authorization: Bearer' with the token in FILE "
        "(default: no token, like /healthz)",
    )
    _policy_flags(mind, "--hand-root", "--hand-approval", "the local Hand's")
    mind.add_argument(
        "--server",
        choices=("native", "asgi"),
        default="native",
        help="native: halfpi's own WebSocket server; asgi: the ASGI app under uvicorn "
        "(default native)",
    )
    mind.set_defaults(func=cmd_mind)

    face = sub.add_parser(
        "face",
        help="run a Face (terminal, or --mode headless), or manage Face credentials",
        description="Run a Face: the terminal face, or with --mode headless the JSON-lines "
        "face for scripts (docs/faces.md lists its exit codes). Without --url it dials the "
        "Mind whose home is --home (it reads HOME/mind.json). "
        "Or manage Face credentials: add, list, revoke.",
    )
    face.add_argument(
        "--mode",
        choices=("tui", "headless"),
        default="tui",
        help="tui: the full-screen terminal face; headless: JSON lines on stdin and stdout "
        "(default tui)",
    )
    face.add_argument(
        "--url",
        action="append",
        help="Mind URL to dial (repeatable; tried in turn; default $HALFPI_URL, else the "
        f"address in HOME/mind.json, else ws://127.0.0.1:{DEFAULT_PORT}/v1/face)",
    )
    face.add_argument("--home", metavar="DIR", help=home_help)
    face.add_argument(
        "--conversation",
        metavar="ID",
        help="open this conversation; headless: commands without conversation_id go to it "
        "(default: none)",
    )
    face.add_argument(
        "--token",
        help="Face token; visible in `ps`: prefer --token-file or $HALFPI_TOKEN "
        "(default $HALFPI_TOKEN, $HALFPI_TOKEN_FILE, else HOME/face.token)",
    )
    face.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the Face token from PATH (default $HALFPI_TOKEN_FILE)",
    )
    face.add_argument(
        "--ca-file",
        metavar="PATH",
        help="verify a wss:// Mind with this CA (default $HALFPI_CA_FILE, else the system CAs)",
    )
    face.add_argument(
        "--new-conversation",
        metavar="NAME",
        help="headless: create a conversation first and default to it (default: none)",
    )
    face.add_argument(
        "--retry-interrupted",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="headless: ask again (new request_id) up to N times when a chat ends "
        "interrupted (default 0: never)",
    )
    face.add_argument(
        "--connect-timeout",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="headless: exit 69 when no Mind could be reached for this long "
        "(default: keep trying, saying why on stderr)",
    )
    face.set_defaults(func=cmd_face)
    face_sub = face.add_subparsers(dest="face_command", metavar="{add,link,list,revoke}")
    add = face_sub.add_parser(
        "add",
        help="create a Face credential; prints its token once",
        description="Create a Face credential. Its token is printed once on stdout "
        "(only its hash is stored); the details go to stderr.",
    )
    add.add_argument("label", help="the credential's name, e.g. phone")
    add.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="operator",
        help="operator acts; observer only watches, in summary detail (default operator)",
    )
    add.add_argument(
        "--scopes",
        help=f"extra scopes, comma-separated, from {', '.join(sorted(ALL_FACE_SCOPES))} "
        "(default: the profile's)",
    )
    add.add_argument(
        "--approve",
        action="store_true",
        help="may resolve tool approvals (default: off)",
    )
    add.add_argument("--home", metavar="DIR", help=home_help)
    add.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    add.set_defaults(func=cmd_face_add)
    link = face_sub.add_parser(
        "link",
        help="print a one-time link that signs a browser in to the web face",
        description="Print a one-time sign-in link for the web face: opened within --ttl "
        "seconds, once, it gives that browser a new Face credential (LABEL; revoke it with "
        "halfpi face revoke LABEL). The code is in the link's #fragment, which browsers never "
        "send to a server.",
    )
    link.add_argument("--label", default="browser", help="the new credential's label "
                      "(default browser)")
    link.add_argument("--profile", choices=sorted(PROFILES), default="operator",
                      help="operator or observer (default operator)")
    link.add_argument("--scopes", help="extra scopes, comma-separated (default: the profile's)")
    link.add_argument("--approve", action="store_true",
                      help="may resolve tool approvals (default: off)")
    link.add_argument("--ttl", type=positive_seconds, default=300.0, metavar="SECONDS",
                      help="how long the link works (default 300)")
    link.add_argument("--url", metavar="URL", help="the web face's address as the browser "
                      "reaches it (default: the running Mind's, from HOME/mind.json)")
    link.add_argument("--home", metavar="DIR", help=home_help)
    link.set_defaults(func=cmd_face_link)
    lst = face_sub.add_parser(
        "list",
        help="list Face credentials (never their tokens)",
        description="List Face credentials: label, profile, state, principal, scopes.",
    )
    lst.add_argument("--home", metavar="DIR", help=home_help)
    lst.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    lst.set_defaults(func=lambda a: _list_credentials(a, "face"))
    rev = face_sub.add_parser(
        "revoke",
        help="revoke a credential; closes its connections",
        description="Revoke a Face credential; its live connections close within a second.",
    )
    rev.add_argument("label", help="the label of the credential to revoke")
    rev.add_argument("--home", metavar="DIR", help=home_help)
    rev.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    rev.set_defaults(func=lambda a: _revoke(a, "face"))
    hand = sub.add_parser(
        "hand",
        help="run a Hand, or manage Hand credentials",
        description="Run a Hand: an executor on this device that connects out to the Mind "
        "and runs its tools. Or manage Hand credentials: add, list, revoke.",
    )
    hand.add_argument(
        "--mind",
        metavar="URL",
        help="the Mind's Hand URL (default: the address in HOME/mind.json, else "
        f"ws://127.0.0.1:{DEFAULT_PORT}/v1/hand)",
    )
    hand.add_argument(
        "--token",
        help="Hand token, from `halfpi hand add`; visible in `ps`: prefer --token-file "
        "(default $HALFPI_HAND_TOKEN)",
    )
    hand.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the Hand token from PATH (default $HALFPI_HAND_TOKEN_FILE)",
    )
    hand.add_argument(
        "--ca-file",
        metavar="PATH",
        help="verify a wss:// Mind with this CA (default $HALFPI_CA_FILE, else the system CAs)",
    )
    hand.add_argument(
        "--id",
        help="this Hand's name: its credential's label (no default: required to run a Hand)",
    )
    hand.add_argument("--home", metavar="DIR", help=home_help)
    _log_flags(hand)
    _policy_flags(hand, "--root", "--approval", "this Hand's")
    hand.set_defaults(func=cmd_hand)
    hand_sub = hand.add_subparsers(dest="hand_command", metavar="{add,list,revoke}")
    hadd = hand_sub.add_parser(
        "add",
        help="create a Hand credential; prints its token once",
        description="Create a Hand credential. Its token is printed once on stdout.",
    )
    hadd.add_argument("label", help="the Hand's name, e.g. pi (run it with --id pi)")
    hadd.add_argument("--home", metavar="DIR", help=home_help)
    hadd.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    hadd.set_defaults(func=cmd_hand_add)
    hlist = hand_sub.add_parser(
        "list",
        help="list Hand credentials",
        description="List Hand credentials (never their tokens).",
    )
    hlist.add_argument("--home", metavar="DIR", help=home_help)
    hlist.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    hlist.set_defaults(func=lambda a: _list_credentials(a, "hand"))
    hrev = hand_sub.add_parser(
        "revoke",
        help="revoke a Hand credential",
        description="Revoke a Hand credential; its live connection closes.",
    )
    hrev.add_argument("label", help="the label of the Hand credential to revoke")
    hrev.add_argument("--home", metavar="DIR", help=home_help)
    hrev.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    hrev.set_defaults(func=lambda a: _revoke(a, "hand"))

    back = sub.add_parser(
        "backup",
        help="copy the home's database and files into a new folder, while the Mind runs",
        description="Back up a home into the new folder DEST: the database (SQLite's online "
        "backup API: the Mind keeps serving), the tokens, the stream key and the agent's "
        "settings. DEST is as secret as the home (0700, files 0600). For a PostgreSQL store "
        "it prints how to use pg_dump instead.",
    )
    back.add_argument("dest", metavar="DEST", help="a folder that does not exist yet")
    back.add_argument("--home", metavar="DIR", help=home_help)
    back.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    back.set_defaults(func=cmd_backup)
    rest = sub.add_parser(
        "restore",
        help="restore a backup into a new or empty home",
        description="Restore the backup folder SRC (made by halfpi backup) into --home, "
        "which must be empty or not exist; then start halfpi mind on it. Faces resume with "
        "a reset (epoch_changed); every request record is kept.",
    )
    rest.add_argument("src", metavar="SRC", help="a folder made by halfpi backup")
    rest.add_argument("--home", metavar="DIR", help=home_help)
    rest.add_argument("--store", type=store_url, metavar="URL", help=store_help)
    rest.set_defaults(func=cmd_restore)
    conf = sub.add_parser(
        "conformance",
        help="run the session contract against a running Mind and print a pass/fail table",
        description="Start a fault-injecting proxy on 127.0.0.1 in front of URL "
        "(ws://HOST:PORT/v1/face or http://HOST:PORT) and check request replay and conflict, "
        "a break before the answer, resume mid-reply, reset, bad input, the approvals race, a "
        "slow consumer and (with --revocable-token and --revoke-command) revocation. "
        "The target must run the scripted agent (no --model: /pace, /tool); TOKEN is an "
        "operator Face credential that may approve. Exit 0 only when no check failed.",
    )
    conf.add_argument("url", metavar="URL", help="the Mind's Face URL or HTTP address")
    conf.add_argument("--token", required=True, help="an operator Face token")
    conf.add_argument(
        "--node",
        metavar="URL",
        help="behind a load balancer: one server of the deployment, reached without it, for "
        "the two checks a proxy in the way spoils (a frame over the limit must close 1009; "
        "a stalled reader's bytes must back up into the server) (default: URL)",
    )
    conf.add_argument(
        "--revocable-token",
        metavar="TOKEN",
        help="a Face token the revocation check may lose (with --revoke-command; default: "
        "the check is skipped)",
    )
    conf.add_argument(
        "--revoke-command",
        metavar="CMD",
        help="a command that revokes --revocable-token's credential on the target's store, "
        "e.g. \"halfpi face revoke kit --home /srv/halfpi\" (split as a shell would, run "
        "without one) (default: none: the check is skipped)",
    )
    conf.set_defaults(func=cmd_conformance)
    parser.commands = tuple(sub.choices)
    sub.metavar = "{" + ",".join(parser.commands) + "}"  # every command, in the usage line
    return parser


def cmd_conformance(args: argparse.Namespace) -> int:
    from halfpi.conformance.kit import Revocation, run_checks, table, target_of

    try:
        for url in (args.url, args.node or args.url):
            target_of(url)
    except ValueError as exc:
        raise UserError(str(exc), EXIT_USAGE) from None
    if (args.revocable_token is None) != (args.revoke_command is None):
        raise UserError("--revocable-token and --revoke-command go together", EXIT_USAGE)
    revocation = None
    if args.revoke_command is not None:
        try:
            argv = tuple(shlex.split(args.revoke_command))
        except ValueError as exc:
            raise UserError(f"argument --revoke-command: {exc}", EXIT_USAGE) from None
        if not argv:
            raise UserError("argument --revoke-command is empty", EXIT_USAGE)
        revocation = Revocation(args.revocable_token, argv)
    outcomes = asyncio.run(run_checks(args.url, args.token, node=args.node,
                                      revocation=revocation))
    print(table(outcomes))
    return EXIT_FAILURE if any(o.result == "fail" for o in outcomes) else 0


def cmd_backup(args: argparse.Namespace) -> int:
    from halfpi.backup import PG_DUMP_GUIDANCE, BackupError, backup

    config = Config(home=_home(args.home), store_url=args.store)
    if config.postgres:
        print(PG_DUMP_GUIDANCE, file=sys.stderr)
        return EXIT_FAILURE
    try:
        taken = backup(config.home, config.db_path, Path(args.dest))
    except BackupError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot back up into {args.dest}: {exc.strerror or exc}") from None
    print(f"backed up {', '.join(taken.files)} (schema version {taken.schema}) "
          f"into {taken.folder} in {taken.seconds:.2f} s", file=sys.stderr)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from halfpi.backup import PG_DUMP_GUIDANCE, BackupError, restore

    config = Config(home=_home(args.home), store_url=args.store)
    if config.postgres:
        print(PG_DUMP_GUIDANCE, file=sys.stderr)
        return EXIT_FAILURE
    try:
        taken = restore(Path(args.src), config.home, config.db_path)
    except BackupError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot restore into {config.home}: {exc.strerror or exc}") from None
    print(f"restored {', '.join(taken.files)} (schema version {taken.schema}) into "
          f"{taken.folder}; start it with: halfpi mind --home {taken.folder}", file=sys.stderr)
    return 0


def _root_dir(value: str) -> str:
    path = Path(value).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {value}")
    return str(path.resolve())


def _approval(value: str) -> tuple[str, Rule]:
    try:
        return parse_approval(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _policy_flags(parser: argparse.ArgumentParser, root: str, approval: str, whose: str) -> None:
    """The tool policy flags (docs/hands.md, "Tool policy")."""
    parser.add_argument(
        root,
        action="append",
        type=_root_dir,
        metavar="DIR",
        help=f"{whose} root: read_file runs there without approval (repeatable; "
        "default: the working directory)",
    )
    parser.add_argument(
        approval,
        action="append",
        type=_approval,
        metavar="TOOL=RULE",
        help=f"{whose} approval rule for TOOL: always, outside_roots or never "
        "(repeatable; defaults: exec_command=always, read_file=outside_roots)",
    )


def _log_flags(parser: argparse.ArgumentParser) -> None:
    """--log-level and --log-format, the same on the Mind and the Hand."""
    parser.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=LOG_LEVELS,
        help="how much to log on stderr: %(choices)s (default info)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines, or JSON lines (ts, level, logger, message, and the conversation, "
        "request and run ids when known) (default text)",
    )


def cmd_hand(args: argparse.Namespace) -> int:
    from halfpi.hand.node import run_hand

    token = _token(args, "HALFPI_HAND_TOKEN")
    ca_file = _ca_file(args)
    if not token or not args.id:
        raise UserError(
            "a Hand needs --id NAME and a token (from `halfpi hand add NAME`): "
            "--token-file, $HALFPI_HAND_TOKEN or --token",
            EXIT_USAGE,
        )
    home = _home(args.home)
    prepare_home(home)  # the Hand keeps its runs' state there
    url, locate = args.mind, None
    if not url:
        address = _mind_address(home)
        url = address.hand_url if address else f"ws://127.0.0.1:{DEFAULT_PORT}/v1/hand"
        locate = _locator(home, hand=True)
    from halfpi.logs import configure

    configure(args.log_level, args.log_format)
    state_dir = home / "hands"
    served = True
    with contextlib.suppress(KeyboardInterrupt):
        served = asyncio.run(
            run_hand(
                url,
                token,
                args.id,
                state_dir,
                roots=args.root or (),
                rules=dict(args.approval or ()),
                protected=(home,),
                ca_file=ca_file,
                locate=locate,
            )
        )
    return 0 if served else 3  # 3: refused by the Mind (bad or revoked token)


def cmd_hand_add(args: argparse.Namespace) -> int:
    from halfpi.errors import LabelInUse
    from halfpi.mind.auth import add_credential

    try:
        added = _on_store(
            args, lambda store: add_credential(store, "hand", args.label, "hand", time.time())
        )
    except (ValueError, LabelInUse) as exc:
        raise UserError(str(exc)) from None
    print(f"hand:         {added.credential.label}", file=sys.stderr)
    print(f"principal_id: {added.credential.principal_id}", file=sys.stderr)
    print("token (shown once, store it now):", file=sys.stderr)
    print(added.token)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Unknown options are named before a missing command is asked for
    # (argparse alone says "arguments are required" for `halfpi --bogus`).
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error(f"name a command: {', '.join(parser.commands)}")
    try:
        return int(args.func(args))
    except (UserError, CannotStart, MissingExtra) as exc:
        print(f"halfpi: {exc}", file=sys.stderr)
        return exc.code if isinstance(exc, UserError) else EXIT_FAILURE
    except ModuleNotFoundError as exc:  # an optional package on a path no need() guards
        extra = missing(exc)
        if extra is None:
            raise
        print(f"halfpi: {extra}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``halfpi face list | head -1``): not an error
        # worth a traceback; stop writing to the closed pipe.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE


if __name__ == "__main__":
    raise SystemExit(main())
