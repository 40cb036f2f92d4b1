"""The ``halfpi`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from halfpi.config import DEFAULT_PORT, Config, default_home, env_delta_ms
from halfpi.core.scopes import ALL_FACE_SCOPES, PROFILES


def _home(value: str | None) -> Path:
    return Path(value).expanduser() if value else default_home()


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


def cmd_mind(args: argparse.Namespace) -> int:
    from halfpi.mind.run import serve

    problem = _listen_problem(args)
    if problem is not None:
        print(f"halfpi: {problem}", file=sys.stderr)
        return 2
    config = Config(
        home=_home(args.home),
        host=args.host,
        port=args.port,
        scripted_delta_ms=env_delta_ms() if args.delta_ms is None else args.delta_ms,
        allowed_origins=tuple(args.allow_origin or ()),
        local_hand=not args.no_local_hand,
        max_connections_per_principal=args.max_connections_per_principal,
        trusted_proxies=tuple(args.trusted_proxy or ()),
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
        server=args.server,
    )
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))
    return 0


def _db(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from halfpi.store.sqlite import open_db

    return open_db(Config(home=_home(args.home)).db_path)


def cmd_face_add(args: argparse.Namespace) -> int:
    from halfpi.mind.auth import add_credential

    extra = tuple(s for s in (args.scopes or "").split(",") if s)
    try:
        added = add_credential(
            _db(args),
            "face",
            args.label,
            args.profile,
            time.time(),
            extra_scopes=extra,
            approve=args.approve,
        )
    except ValueError as exc:
        print(f"halfpi: {exc}", file=sys.stderr)
        return 2
    c = added.credential
    print(f"label:        {c.label}", file=sys.stderr)
    print(f"principal_id: {c.principal_id}", file=sys.stderr)
    print(f"profile:      {c.profile}", file=sys.stderr)
    print(f"scopes:       {' '.join(sorted(c.scopes))}", file=sys.stderr)
    print("token (shown once, store it now):", file=sys.stderr)
    print(added.token)
    return 0


def _list_credentials(args: argparse.Namespace, kind: str) -> int:
    from halfpi.store.sqlite import select_credentials

    rows = [c for c in select_credentials(_db(args)) if c.kind == kind]
    print(f"{'LABEL':<20} {'PROFILE':<9} {'STATE':<8} {'PRINCIPAL':<34} SCOPES")
    for c in rows:
        state = "live" if c.live else "revoked"
        print(
            f"{c.label:<20} {c.profile:<9} {state:<8} {c.principal_id:<34} "
            f"{','.join(sorted(c.scopes))}"
        )
    return 0


def _revoke(args: argparse.Namespace, kind: str) -> int:
    from halfpi.store.sqlite import revoke_credential

    if revoke_credential(_db(args), kind, args.label, time.time()):
        print(f"revoked {args.label}; its live connections close within a second", file=sys.stderr)
        return 0
    print(f"halfpi: no live {kind} credential labelled {args.label!r}", file=sys.stderr)
    return 1


def _usage_error(message: str) -> NoReturn:
    print(f"halfpi: {message}", file=sys.stderr)
    raise SystemExit(2)


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

        from halfpi.face.transport import client_tls_context

        try:
            client_tls_context(path)
        except (OSError, ssl.SSLError) as exc:
            _usage_error(f"cannot use the CA file {path}: {getattr(exc, 'strerror', None) or exc}")
    return path


def _face_target(args: argparse.Namespace) -> tuple[list[str], str]:
    urls = args.url or [os.environ.get("HALFPI_URL") or f"ws://127.0.0.1:{DEFAULT_PORT}/v1/face"]
    token = _token(args, "HALFPI_TOKEN")
    ca_file = _ca_file(args)
    if ca_file is not None:
        os.environ["HALFPI_CA_FILE"] = ca_file  # the SDK's connector verifies wss:// with it
    if not token:
        path = Config(home=_home(args.home)).face_token_path
        try:
            token = path.read_text().strip()
        except OSError:
            raise SystemExit(
                f"halfpi: no token: pass --token, set HALFPI_TOKEN, or run `halfpi mind` once "
                f"so that {path} exists"
            ) from None
    return urls, token


def cmd_face(args: argparse.Namespace) -> int:
    urls, token = _face_target(args)
    if args.mode == "headless":
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
        from halfpi.face.headless import HeadlessOptions, run_headless

        options = HeadlessOptions(
            urls,
            token,
            conversation=args.conversation,
            new_conversation=args.new_conversation,
            retry_interrupted=args.retry_interrupted,
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
    home = _home(args.home)
    home.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.WARNING,
        filename=str(home / "face.log"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    return run_terminal(urls, token, conversation=args.conversation)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="halfpi", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    mind = sub.add_parser("mind", help="run the Mind")
    mind.add_argument("--host", default="127.0.0.1")
    mind.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    mind.add_argument("--home", help="data directory (default $HALFPI_HOME or ~/.halfpi)")
    mind.add_argument(
        "--delta-ms",
        type=float,
        default=None,
        help="scripted agent pace (default $HALFPI_SCRIPTED_DELTA_MS or 20)",
    )
    mind.add_argument(
        "--allow-origin",
        action="append",
        help="an extra browser Origin allowed to connect (repeatable)",
    )
    mind.add_argument(
        "--no-local-hand",
        action="store_true",
        help="do not start the in-process Hand named 'local'",
    )
    mind.add_argument("--tls-cert", metavar="FILE", help="serve wss://: certificate (PEM chain)")
    mind.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    mind.add_argument(
        "--insecure",
        action="store_true",
        help="allow plain ws:// on a non-loopback --host (behind a TLS proxy)",
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
        help="a proxy address whose X-Forwarded-For names the client (repeatable)",
    )
    mind.add_argument(
        "--server",
        choices=("native", "asgi"),
        default="native",
        help="native (default): halfpi's own WebSocket server; asgi: the ASGI app under uvicorn",
    )
    mind.add_argument("--log-level", default="info")
    mind.set_defaults(func=cmd_mind)

    face = sub.add_parser(
        "face", help="run a Face (terminal, or --mode headless), or manage Face credentials"
    )
    face.add_argument("--mode", choices=("tui", "headless"), default="tui")
    face.add_argument(
        "--url",
        action="append",
        help="Mind URL (repeatable; tried in turn). Default $HALFPI_URL or "
        f"ws://127.0.0.1:{DEFAULT_PORT}/v1/face",
    )
    face.add_argument(
        "--token",
        help="Face token; visible in `ps`: prefer --token-file or $HALFPI_TOKEN "
        "(default $HALFPI_TOKEN, $HALFPI_TOKEN_FILE, or HOME/face.token)",
    )
    face.add_argument("--token-file", metavar="PATH", help="read the Face token from PATH")
    face.add_argument(
        "--ca-file", metavar="PATH", help="verify a wss:// Mind with this CA (or $HALFPI_CA_FILE)"
    )
    face.add_argument("--home")
    face.add_argument("--conversation", help="open (and for headless: default to) this id")
    face.add_argument(
        "--new-conversation",
        metavar="NAME",
        help="headless: create a conversation first and default to it",
    )
    face.add_argument(
        "--retry-interrupted",
        type=int,
        default=0,
        metavar="N",
        help="headless: ask again (new request_id) up to N times when a chat ends interrupted",
    )
    face.set_defaults(func=cmd_face)
    face_sub = face.add_subparsers(dest="face_command")
    add = face_sub.add_parser("add", help="create a Face credential; prints its token once")
    add.add_argument("label")
    add.add_argument("--profile", choices=sorted(PROFILES), default="operator")
    add.add_argument("--scopes", help=f"extra scopes, comma-separated: {sorted(ALL_FACE_SCOPES)}")
    add.add_argument("--approve", action="store_true", help="may resolve tool approvals")
    add.add_argument("--home")
    add.set_defaults(func=cmd_face_add)
    lst = face_sub.add_parser("list", help="list Face credentials (never their tokens)")
    lst.add_argument("--home")
    lst.set_defaults(func=lambda a: _list_credentials(a, "face"))
    rev = face_sub.add_parser("revoke", help="revoke a credential; closes its connections")
    rev.add_argument("label")
    rev.add_argument("--home")
    rev.set_defaults(func=lambda a: _revoke(a, "face"))
    hand = sub.add_parser("hand", help="run a Hand, or manage Hand credentials")
    hand.add_argument("--mind", help=f"the Mind (default ws://127.0.0.1:{DEFAULT_PORT}/v1/hand)")
    hand.add_argument(
        "--token",
        help="Hand token; visible in `ps`: prefer --token-file or $HALFPI_HAND_TOKEN",
    )
    hand.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the Hand token from PATH (or $HALFPI_HAND_TOKEN_FILE)",
    )
    hand.add_argument(
        "--ca-file", metavar="PATH", help="verify a wss:// Mind with this CA (or $HALFPI_CA_FILE)"
    )
    hand.add_argument("--id", help="this Hand's name (its credential's label)")
    hand.add_argument("--home")
    hand.set_defaults(func=cmd_hand)
    hand_sub = hand.add_subparsers(dest="hand_command")
    hadd = hand_sub.add_parser("add", help="create a Hand credential; prints its token once")
    hadd.add_argument("label")
    hadd.add_argument("--home")
    hadd.set_defaults(func=cmd_hand_add)
    hlist = hand_sub.add_parser("list", help="list Hand credentials")
    hlist.add_argument("--home")
    hlist.set_defaults(func=lambda a: _list_credentials(a, "hand"))
    hrev = hand_sub.add_parser("revoke", help="revoke a Hand credential")
    hrev.add_argument("label")
    hrev.add_argument("--home")
    hrev.set_defaults(func=lambda a: _revoke(a, "hand"))
    return parser


def cmd_hand(args: argparse.Namespace) -> int:
    from halfpi.hand.node import run_hand

    token = _token(args, "HALFPI_HAND_TOKEN")
    ca_file = _ca_file(args)
    if not token or not args.id:
        print(
            "halfpi: a Hand needs --id NAME and a token (from `halfpi hand add NAME`): "
            "--token-file, $HALFPI_HAND_TOKEN or --token",
            file=sys.stderr,
        )
        return 2
    url = args.mind or f"ws://127.0.0.1:{DEFAULT_PORT}/v1/hand"
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    state_dir = _home(args.home) / "hands"
    served = True
    with contextlib.suppress(KeyboardInterrupt):
        served = asyncio.run(run_hand(url, token, args.id, state_dir, ca_file=ca_file))
    return 0 if served else 3  # 3: refused by the Mind (bad or revoked token)


def cmd_hand_add(args: argparse.Namespace) -> int:
    from halfpi.mind.auth import add_credential

    try:
        added = add_credential(_db(args), "hand", args.label, "hand", time.time())
    except ValueError as exc:
        print(f"halfpi: {exc}", file=sys.stderr)
        return 2
    print(f"hand:         {added.credential.label}", file=sys.stderr)
    print(f"principal_id: {added.credential.principal_id}", file=sys.stderr)
    print("token (shown once, store it now):", file=sys.stderr)
    print(added.token)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
