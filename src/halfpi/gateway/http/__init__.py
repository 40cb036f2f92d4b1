"""The HTTP door (DESIGN §9): SSE streams, HTTP commands, REST reads and the
OpenAPI document, as Starlette routes over the Mind API.

``door.py`` holds what every route shares (the running Mind, bearer
authentication, the Origin rule, errors as HTTP responses); ``sse.py`` the
event streams and stream tickets; ``commands.py`` the HTTP commands;
``reads.py`` the REST reads; ``agui.py`` the AG-UI endpoint; ``ops.py``
health, readiness and metrics; ``openapi.py`` the OpenAPI document and the
served docs, made from the other modules' route tables. :func:`routes` lists them all for the ASGI
gateway, which serves them for ``--server asgi``, for ``MindApp`` mounted
in someone's app, and behind the native server for every request that is not a WebSocket upgrade.
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from halfpi.gateway.http import agui, commands, durable, openapi, ops, reads, sse, web
from halfpi.gateway.http.door import Door


def routes(door: Door) -> list[BaseRoute]:
    return [*sse.routes(door), *commands.routes(door), *reads.routes(door), *openapi.routes(door),
            *web.routes(door), *durable.routes(door), *agui.routes(door), *ops.routes(door)]
