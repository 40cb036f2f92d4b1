"""The Mind inside your own ASGI application (DESIGN §9; docs/asgi.md).

::

    from fastapi import FastAPI
    from halfpi.asgi import MindApp
    from halfpi.config import Config

    mind = MindApp(Config(home=Path("~/.halfpi").expanduser()))
    app = FastAPI(lifespan=mind.lifespan)
    app.mount("/halfpi", mind)      # ws://HOST:PORT/halfpi/v1/face, …/v1/hand

Starlette does not pass lifespan events to a mounted application, so the
host application starts and drains the Mind in its own lifespan: pass
:meth:`MindApp.lifespan` as it, enter it inside yours (``async with
mind.lifespan(app): yield``), or call :meth:`MindApp.start` and
:meth:`MindApp.stop`. Served on its own (``uvicorn module:mind``) a
``MindApp`` handles the lifespan itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Receive, Scope, Send

from halfpi.agents.base import Agent
from halfpi.config import Config
from halfpi.gateway.asgi import AsgiGateway
from halfpi.mind.home import prepare_home
from halfpi.mind.home_lock import HomeLock
from halfpi.mind.service import Mind
from halfpi.process import build_mind, start_local_hand


class MindApp:
    """An ASGI application serving one Mind's ``/v1/face``, ``/v1/hand`` and
    ``/healthz``. Until it is started, WebSocket handshakes get 503.

    ``hand_url``: where the in-process Hand named ``local`` dials this very
    app (``ws://127.0.0.1:8000/halfpi/v1/hand``). Only the host app knows
    its address and mount path, so without it (or with
    ``config.local_hand`` off) no local Hand runs; Hands on other devices
    connect as always.
    """

    def __init__(
        self,
        config: Config,
        agent: Agent | None = None,
        *,
        hand_url: str | None = None,
        close_wait_s: float = 2.0,
    ) -> None:
        self.config = config
        self.agent = agent
        self.hand_url = hand_url
        self.close_wait_s = close_wait_s
        self.gateway = AsgiGateway(lifespan=self.lifespan)
        self._mind: Mind | None = None
        self._lock: HomeLock | None = None

    @property
    def mind(self) -> Mind:
        """The running Mind (after :meth:`start`)."""
        if self._mind is None:
            raise RuntimeError("the Mind is not started: enter MindApp.lifespan first")
        return self._mind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.gateway(scope, receive, send)

    async def start(self) -> None:
        """Open the home and the store, recover, and (with ``hand_url``)
        start the local Hand; from then on handshakes are served."""
        if self._mind is not None:
            return
        prepare_home(self.config.home)
        # One Mind per home (DESIGN §12), mounted or not: the lock is taken
        # before the store opens and held until stop().
        lock = HomeLock.take(self.config.home)
        try:
            mind = build_mind(self.config, self.agent)
            await mind.start()
        except BaseException:
            lock.release()
            raise
        self._lock = lock
        self._mind = mind
        self.gateway.accepting = True
        self.gateway.mind = mind
        if self.config.local_hand and self.hand_url is not None:
            start_local_hand(mind, self.hand_url)

    async def stop(self) -> None:
        """Drain as ``halfpi mind`` does on SIGTERM: refuse new handshakes
        (503), close Faces with 1012, end running chats as ``interrupted``,
        close the store, and wait a bounded time for connections to close."""
        mind = self._mind
        if mind is None:
            return
        self.gateway.stop_accepting()
        await mind.drain()
        await self.gateway.wait_closed(self.close_wait_s)
        self._mind = None
        self.gateway.mind = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any = None) -> AsyncIterator[None]:
        """The Mind's life as an app lifespan: ``FastAPI(lifespan=mind.lifespan)``."""
        await self.start()
        try:
            yield
        finally:
            await self.stop()
