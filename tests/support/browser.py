"""A real browser for tests: Debian's ``chromium`` driven by Playwright.

Playwright's own browser download is never used: the system's chromium is
launched by path. ``.ci/run`` installs both (apt ``chromium``, pip
``playwright`` through ``.[dev]``). Where either is missing the browser
tests are skipped — unless ``HALFPI_BROWSER=required`` (CI sets it), where
they fail, saying what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support import programs

REQUIRED = os.environ.get("HALFPI_BROWSER") == "required"


def missing() -> str | None:
    """Why no browser can run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install -e '.[dev]')"
    if programs.which("chromium") is None:
        return "chromium is not installed (apt-get install chromium)"
    return None


def require_browser() -> None:
    why = missing()
    if why is not None and "chromium" in why:  # the run's summary names it
        programs.skip_missing("chromium", why)
    if why is not None:
        if REQUIRED:
            pytest.fail(f"HALFPI_BROWSER=required but {why}")
        pytest.skip(why)


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """A headless chromium (Playwright's ``Browser``)."""
    require_browser()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=shutil.which("chromium"))
        try:
            yield browser
        finally:
            await browser.close()


class PageServer:
    """Serves one HTML page on 127.0.0.1 (any path): the page's own origin,
    which the Mind must be configured to allow."""

    def __init__(self, html: str) -> None:
        self.html = html.encode()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> PageServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    break
                status = b"200 OK" if head.startswith(b"GET / ") or head.startswith(
                    b"GET /?") else b"404 Not Found"
                body = self.html if status == b"200 OK" else b""
                writer.write(b"HTTP/1.1 %b\r\nContent-Type: text/html; charset=utf-8\r\n"
                             b"Content-Length: %d\r\n\r\n%b" % (status, len(body), body))
                await writer.drain()
        writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
