"""The OpenAPI document of the HTTP door: to be built."""

from __future__ import annotations

from starlette.routing import BaseRoute

from halfpi.gateway.http.door import Door


def routes(door: Door) -> list[BaseRoute]:
    return []
