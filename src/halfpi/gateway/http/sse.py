"""SSE streams and stream tickets (DESIGN §9): to be built."""

from __future__ import annotations

from starlette.routing import BaseRoute

from halfpi.gateway.http.door import Door


def routes(door: Door) -> list[BaseRoute]:
    return []
