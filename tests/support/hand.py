"""Hands for tests: a fake link for the registry, and raw Hand protocol payloads.

A raw Hand (a plain WebSocket client speaking ``/v1/hand``) must do what a
real one does: answer ``hand.check`` and report honest lengths and digests,
or the Mind treats it as faulty (DESIGN §8). These builders do it right, so
a test that wants a lying Hand changes one field on purpose.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from halfpi.core.hand_wire import HAND_PROTOCOL, MindMessage, encode_to_hand, output_digest
from halfpi.mind.hands import HandRegistry


class FakeLink:
    """A Hand connection as the registry sees it; records what it is sent.

    Like the real session, closing it tells the registry it is gone."""

    def __init__(self, registry: HandRegistry, hand_id: str = "dev") -> None:
        self.registry = registry
        self.hand_id: str | None = hand_id
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.closed: list[tuple[int, str]] = []
        self.address = "127.0.0.1:4242"
        self.live = True  # False: it failed its liveness check (an unanswered ping)

    def alive(self) -> bool:
        return self.live and not self.closed

    def send(self, message: MindMessage) -> None:
        frame = msgspec.json.decode(encode_to_hand(message))  # as it would travel
        self.sent.append((frame["type"], frame["payload"]))

    def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))
        self.registry.disconnect(self)

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [p for t, p in self.sent if t == type_]

    def acked(self) -> list[str]:
        return [rid for p in self.of("hand.ack") for rid in p["run_ids"]]


def hello_payload(
    token: str,
    hand_id: str,
    instance_id: str,
    *,
    runs: list[dict[str, Any]] | None = None,
    rules: Mapping[str, str] | None = None,
    roots: list[str] | None = None,
) -> dict[str, Any]:
    """A ``hand.hello``; by default its tools run without approval anywhere."""
    rules = dict(rules or {"exec_command": "never", "read_file": "never"})
    return {
        "token": token,
        "hand_id": hand_id,
        "instance_id": instance_id,
        "info": {"hostname": "h", "os": "o", "arch": "a", "version": "0"},
        "tools": [{"name": name} for name in sorted(rules)],
        "policy": {"roots": roots or ["/"], "rules": rules},
        "protocol": HAND_PROTOCOL,
        "runs": runs or [],
    }


def honest_result(
    run_id: str,
    generation: int,
    status: str = "succeeded",
    stdout: str | None = None,
    stderr: str = "",
    **fields: Any,
) -> dict[str, Any]:
    """A ``hand.result`` payload whose length and digest are true."""
    stdout = f"{status}\n" if stdout is None else stdout
    out, err = stdout.encode(), stderr.encode()
    payload: dict[str, Any] = {
        "run_id": run_id,
        "generation": generation,
        "status": status,
        "exit_code": 0 if status == "succeeded" else -15,
        "stdout": stdout,
        "stderr": stderr,
        "output_bytes": len(out) + len(err),
        "digest": output_digest(out, err),
        "truncated": False,
    }
    payload.update(fields)
    return payload


def allow_check(check: dict[str, Any]) -> dict[str, Any]:
    """The ``hand.checked`` answer that lets a checked call run."""
    return {"check_id": check["check_id"], "verdict": "allow", "reason": "test Hand"}


class HandProcess:
    """``halfpi hand`` as a child process; its token travels in the environment."""

    def __init__(self, url: str | None, token: str, hand_id: str, log_path: Path,
                 extra_args: tuple[str, ...] = ()) -> None:
        """``url`` None: no ``--mind`` (give ``--home`` in ``extra_args``)."""
        self.log_path = log_path
        # One Hand home per test: a restarted Hand finds what its previous
        # instance left running there.
        env = dict(os.environ, HALFPI_HAND_TOKEN=token, PYTHONUNBUFFERED="1",
                   HALFPI_HOME=str(log_path.parent / "hand-home"))
        # Started in the test's directory: that is the Hand's root, where
        # read_file runs without approval.
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "halfpi.cli", "hand", *(["--mind", url] if url else []),
                 "--id", hand_id, *extra_args],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=log_path.parent,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """``kill -9``: no goodbye, no cleanup."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text()[-4000:] if self.log_path.exists() else ""
