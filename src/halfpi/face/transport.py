"""The Face SDK's transport seam: a re-export of :mod:`halfpi.client.transport`.

The seam, the WebSocket/TLS connector and :class:`ConnectionLost` are shared
with the Hand and live in :mod:`halfpi.client`; this module keeps the
imports users already have working.
"""

from __future__ import annotations

from halfpi.client.transport import (
    AUTH_CLOSE_CODES,
    CA_FILE_ENV,
    CLOSE_MEANINGS,
    OPEN_TIMEOUT_S,
    ConnectionLost,
    Connector,
    Transport,
    Trust,
    client_tls_context,
    pinned_tls_context,
    tls_connector,
    websocket_connector,
)

__all__ = [
    "AUTH_CLOSE_CODES",
    "CA_FILE_ENV",
    "CLOSE_MEANINGS",
    "OPEN_TIMEOUT_S",
    "ConnectionLost",
    "Connector",
    "Transport",
    "Trust",
    "client_tls_context",
    "pinned_tls_context",
    "tls_connector",
    "websocket_connector",
]
