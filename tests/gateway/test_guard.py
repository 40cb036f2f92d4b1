"""The port stays open for Faces and Hands (docs/operations.md, "Limits"),
on both servers: a request head is bounded in time and its request line in
length (docs/protocol.md §1)."""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from pathlib import Path

import httpx
import pytest

from halfpi.gateway.bounded_http import PeerMistakes
from halfpi.gateway.guard import ACCEPT_RETRY_S, Acceptor, Guard, raise_descriptor_limit
from halfpi.gateway.native import FaceServer
from tests.support.client import FaceClient
from tests.support.mind import LocalMind, local_mind
from tests.support.slowloris import Dribbler
from tests.support.wait import until

SERVERS = pytest.mark.parametrize("server", ["native", "asgi"])


async def request(port: int, raw: bytes) -> bytes:
    """Send ``raw`` in one write; everything the server answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@SERVERS
@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/face"])
async def test_a_request_head_that_never_ends_is_closed_after_the_bound(
    tmp_path: Path, server: str, path: str
) -> None:
    async with local_mind(tmp_path / "home", server=server, hello_timeout_s=0.5,
                          local_hand=False) as lmind:
        # The bound is on the head, not on the connection: a Face that said
        # hello in time stays (checked once the dribbler is gone).
        face = await FaceClient.connect(lmind.url, lmind.token)
        dribbler = Dribbler(lmind.server.port, path, every_s=0.1)
        await dribbler.open()
        assert dribbler.task is not None
        await asyncio.wait_for(dribbler.task, 10)
        assert dribbler.closed_after is not None
        # One header line every 0.1 s kept nothing open past the 0.5 s bound.
        assert 0.4 < dribbler.closed_after < 3.0, dribbler.closed_after
        assert dribbler.answer in (b"", b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0"
                                        b"\r\nConnection: close\r\n\r\n")
        assert await face.create_conversation()
        await face.close()


@SERVERS
async def test_the_next_request_head_on_a_kept_alive_connection_is_bounded_too(
    tmp_path: Path, server: str
) -> None:
    async with local_mind(tmp_path / "home", server=server, hello_timeout_s=0.5,
                          local_hand=False) as lmind:
        reader, writer = await asyncio.open_connection("127.0.0.1", lmind.server.port)
        loop = asyncio.get_running_loop()
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"HTTP/1.1 200")
            started = loop.time()
            writer.write(b"GET /healthz HTTP/1.1\r\n")
            reading = asyncio.ensure_future(reader.read())
            line = 0
            while not reading.done() and loop.time() - started < 10:
                await asyncio.wait({reading}, timeout=0.1)
                writer.write(b"X-Line-%d: slow\r\n" % line)
                line += 1
            assert reading.done(), "the second request head was never bounded"
            assert loop.time() - started < 3.0
        finally:
            writer.close()


@SERVERS
async def test_a_request_line_over_8_KiB_is_answered_414(tmp_path: Path, server: str) -> None:
    async with local_mind(tmp_path / "home", server=server, local_hand=False) as lmind:
        port = lmind.server.port
        long_path = b"/v1/conversations/" + b"a" * 8200
        answer = await request(port, b"GET " + long_path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 414"), answer[:80]
        # Just under the bound it is an ordinary request (401: no token).
        fits = b"/v1/conversations/" + b"a" * 8000
        answer = await request(
            port, b"GET " + fits + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert answer.startswith(b"HTTP/1.1 401"), answer[:80]


async def test_failed_accepts_pause_accepting_and_are_told_once_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "halfpi.gateway.guard")
    readable, peer = socket.socketpair()
    peer.send(b"x")  # the "listening" socket stays readable, as the kernel reports it

    class OutOfDescriptors:
        """A listening socket whose every accept fails: no descriptor left."""

        calls = 0

        def fileno(self) -> int:
            return readable.fileno()

        def setblocking(self, flag: bool) -> None:
            pass

        def accept(self) -> tuple[socket.socket, object]:
            if self.calls == 4:  # descriptors are back, and nobody is knocking
                readable.recv(1)
                raise BlockingIOError
            self.calls += 1
            raise OSError(errno.EMFILE, "Too many open files")

        def close(self) -> None:
            pass

    listener = OutOfDescriptors()
    loop = asyncio.get_running_loop()
    started = loop.time()
    guard = Guard(1.0, frozenset(), failure_log_interval_s=1.0)
    acceptor = Acceptor(listener, lambda ticket: asyncio.Protocol(), guard,
                        None)  # type: ignore[arg-type]

    def told() -> list[str]:
        return [r.getMessage() for r in caplog.records if "accept failed" in r.getMessage()]

    try:
        await until(lambda: listener.calls >= 4, 10)
        # One attempt per pause, not thousands a turn of the loop.
        assert loop.time() - started >= 3 * ACCEPT_RETRY_S
        assert len(told()) == 1 and told()[0].startswith("accept failed 1 time(s)"), told()
        assert "Too many open files" in told()[0]
        # The burst ended: the end of the interval tells what it held back.
        await until(lambda: len(told()) == 2, 10)
        assert told()[1].startswith("accept failed 3 time(s)"), told()
        assert loop.time() - started >= 1.0
    finally:
        acceptor.close()
        readable.close()
        peer.close()
    assert not any(r.exc_info for r in caplog.records)


def pending_of(lmind: LocalMind) -> int:
    server = lmind.server
    guard = server.guard if isinstance(server, FaceServer) else server.server.guard  # type: ignore[attr-defined]
    assert guard is not None
    return int(guard.pending.count)


@SERVERS
async def test_a_connection_stops_counting_as_unauthenticated_once_it_authenticates(
    tmp_path: Path, server: str
) -> None:
    async with local_mind(tmp_path / "home", server=server, local_hand=False) as lmind:
        base = f"http://127.0.0.1:{lmind.server.port}"
        async with httpx.AsyncClient(base_url=base) as anonymous, \
                httpx.AsyncClient(base_url=base, headers={
                    "Authorization": f"Bearer {lmind.token}"}) as bearer:
            assert (await anonymous.get("/healthz")).status_code == 200
            await until(lambda: pending_of(lmind) == 1, 5)  # kept alive, never authenticated
            face = await FaceClient.connect(lmind.url, lmind.token)  # welcomed
            assert (await bearer.get("/v1/conversations")).status_code == 200
            await until(lambda: pending_of(lmind) == 1, 5)
            await face.close()
        await until(lambda: pending_of(lmind) == 0, 5)


@SERVERS
async def test_a_refused_request_whose_body_never_ends_is_closed(
    tmp_path: Path, server: str
) -> None:
    async with local_mind(tmp_path / "home", server=server, local_hand=False) as lmind:
        head = (b"POST /v1/commands/face.chat HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
        # No token: answered 401 at once, and a body nobody reads is not waited for.
        answer = await request(lmind.server.port, head)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:80]


@SERVERS
async def test_malformed_requests_are_logged_at_the_1st_2nd_4th_only(
    tmp_path: Path, server: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with local_mind(tmp_path / "home", server=server, local_hand=False) as lmind:
        (counter,) = [f for f in logging.getLogger("uvicorn.error").filters
                      if isinstance(f, PeerMistakes)]
        before = counter.count
        for _ in range(8):
            answer = await request(lmind.server.port, b"GET /x HTTP/1.1\r\nno colon\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 400")
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.error"]
    assert len(lines) <= 4, lines  # anyone can send them: the log stays small
    assert counter.count == before + 8  # counted, and told with the count
    assert all("bad requests so far" in line for line in lines), lines


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("the hard limit is unlimited here")
    low = min(256, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert raise_descriptor_limit() == (low, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        assert raise_descriptor_limit() == (hard, hard)  # nothing more to raise
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
