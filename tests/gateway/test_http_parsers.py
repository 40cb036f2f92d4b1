"""The HTTP door's two parsers (docs/performance.md, "The event loop and
the HTTP parser"): httptools (C) for the native server's HTTP/1.1
connections where it is installed, h11 for HTTP/1.0 and for ``HALFPI_HTTP=
h11``; both under the same bounds (``bounded_http``), httptools' request
head bounded in size as h11 bounds its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfpi.gateway.bounded_http import GuardedH11
from halfpi.gateway.guard import MAX_REQUEST_HEAD
from halfpi.gateway.handover import httptools_chosen, protocol_for
from tests.support.mind import local_mind

pytest.importorskip("httptools")


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("HALFPI_HTTP", raising=False)  # the default, whatever CI sets
    httptools_chosen.cache_clear()
    yield
    httptools_chosen.cache_clear()


def test_http_1_1_goes_to_httptools_and_1_0_to_h11() -> None:
    from halfpi.gateway.bounded_httptools import GuardedHttpTools

    assert protocol_for(b"GET /healthz HTTP/1.1\r") is GuardedHttpTools
    assert protocol_for(b"GET /healthz HTTP/1.0\r") is GuardedH11


def test_HALFPI_HTTP_h11_keeps_every_connection_on_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALFPI_HTTP", "h11")
    assert protocol_for(b"GET /healthz HTTP/1.1\r") is GuardedH11


def test_an_unknown_HALFPI_HTTP_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HALFPI_HTTP", "llhttp")
    with pytest.raises(ValueError, match="HALFPI_HTTP is one of auto, httptools, h11"):
        protocol_for(b"GET / HTTP/1.1\r")


async def exchange(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_a_head_over_16_KiB_is_answered_431_and_one_under_it_is_served(
    tmp_path: Path,
) -> None:
    assert httptools_chosen()
    async with local_mind(tmp_path / "home", local_hand=False) as lmind:
        port = lmind.server.port
        filler = b"X-Filler: " + b"f" * 1000 + b"\r\n"
        big = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + filler * (MAX_REQUEST_HEAD // 1000 + 1)
        answer = await exchange(port, big)  # never ends: the bound, not the timeout, answers
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
        fits = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + filler * 12 + b"\r\n"
        answer = await exchange(port, fits)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]


async def test_a_large_body_in_the_heads_packet_is_not_taken_for_a_large_head(
    tmp_path: Path,
) -> None:
    async with local_mind(tmp_path / "home", local_hand=False) as lmind:
        body = b"{" + b" " * (3 * MAX_REQUEST_HEAD) + b"}"
        raw = (b"POST /v1/commands HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
               % (len(body), body))
        answer = await exchange(lmind.server.port, raw)
        assert answer.startswith(b"HTTP/1.1 4"), answer[:80]
        assert not answer.startswith(b"HTTP/1.1 431"), answer[:80]


async def test_pipelined_requests_are_all_answered(tmp_path: Path) -> None:
    async with local_mind(tmp_path / "home", local_hand=False) as lmind:
        one = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        last = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        answer = await exchange(lmind.server.port, one * 40 + last)
        assert answer.count(b"HTTP/1.1 200") == 41
