"""The ``halfpi`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from pathlib import Path

from halfpi.config import DEFAULT_PORT, Config, default_home, env_delta_ms
from halfpi.core.scopes import ALL_FACE_SCOPES, PROFILES


def _home(value: str | None) -> Path:
    return Path(value).expanduser() if value else default_home()


def cmd_mind(args: argparse.Namespace) -> int:
    from halfpi.mind.run import serve

    config = Config(
        home=_home(args.home),
        host=args.host,
        port=args.port,
        scripted_delta_ms=env_delta_ms() if args.delta_ms is None else args.delta_ms,
        allowed_origins=tuple(args.allow_origin or ()),
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


def cmd_face_list(args: argparse.Namespace) -> int:
    from halfpi.store.sqlite import select_credentials

    rows = [c for c in select_credentials(_db(args)) if c.kind == "face"]
    print(f"{'LABEL':<20} {'PROFILE':<9} {'STATE':<8} {'PRINCIPAL':<34} SCOPES")
    for c in rows:
        state = "live" if c.live else "revoked"
        print(
            f"{c.label:<20} {c.profile:<9} {state:<8} {c.principal_id:<34} "
            f"{','.join(sorted(c.scopes))}"
        )
    return 0


def cmd_face_revoke(args: argparse.Namespace) -> int:
    from halfpi.store.sqlite import revoke_credential

    if revoke_credential(_db(args), "face", args.label, time.time()):
        print(f"revoked {args.label}; its live connections close within a second", file=sys.stderr)
        return 0
    print(f"halfpi: no live face credential labelled {args.label!r}", file=sys.stderr)
    return 1


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
    mind.add_argument("--log-level", default="info")
    mind.set_defaults(func=cmd_mind)

    face = sub.add_parser("face", help="manage Face credentials")
    face_sub = face.add_subparsers(dest="face_command", required=True)
    add = face_sub.add_parser("add", help="create a Face credential; prints its token once")
    add.add_argument("label")
    add.add_argument("--profile", choices=sorted(PROFILES), default="operator")
    add.add_argument("--scopes", help=f"extra scopes, comma-separated: {sorted(ALL_FACE_SCOPES)}")
    add.add_argument("--approve", action="store_true", help="may resolve tool approvals")
    add.add_argument("--home")
    add.set_defaults(func=cmd_face_add)
    lst = face_sub.add_parser("list", help="list Face credentials (never their tokens)")
    lst.add_argument("--home")
    lst.set_defaults(func=cmd_face_list)
    rev = face_sub.add_parser("revoke", help="revoke a credential; closes its connections")
    rev.add_argument("label")
    rev.add_argument("--home")
    rev.set_defaults(func=cmd_face_revoke)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
