"""HTTP commands, REST reads and the OpenAPI document (DESIGN §9): to be built."""

from __future__ import annotations

from starlette.routing import BaseRoute

from halfpi.gateway.http.door import Door


def routes(door: Door) -> list[BaseRoute]:
    return []
