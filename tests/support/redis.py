"""A throwaway redis-server for the tests (or ``HALFPI_REDIS_URL``).

Skipped when ``redis-server`` is missing, unless ``HALFPI_REDIS=required``
(CI sets it), where the tests fail instead."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.support import programs

REQUIRED = os.environ.get("HALFPI_REDIS") == "required"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    """A redis-server without persistence: stopped and started again, it has lost its data."""

    port: int
    folder: str
    proc: subprocess.Popen[bytes] | None = field(default=None)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.folder],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not _answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("redis-server did not start")
            time.sleep(0.02)  # polling a condition with a deadline

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def require_redis_server() -> None:
    """Skip (or, with HALFPI_REDIS=required, fail) without ``redis-server``."""
    programs.require("redis-server")


def free_port() -> int:
    """A free port of 127.0.0.1 for a server of one's own."""
    return _free_port()


def _server() -> Iterator[RedisServer]:
    require_redis_server()
    server = RedisServer(_free_port(), tempfile.mkdtemp(prefix="halfpi-redis-"))
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(server.folder, ignore_errors=True)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A server of one's own (tests that kill and restart it)."""
    yield from _server()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A shared server's URL (each test uses its own conversation or key names)."""
    url = os.environ.get("HALFPI_REDIS_URL")
    if url:
        yield url
        return
    for server in _server():
        yield server.url
