"""What every client of the Mind shares: the Face SDK and the Hand.

- :mod:`~halfpi.client.errors` — :class:`ConnectionLost`, to which every
  library exception is mapped at the boundary, and what its close codes mean;
- :mod:`~halfpi.client.transport` — the transport seam (a connection moves
  text frames) and the WebSocket/TLS connector;
- :mod:`~halfpi.client.redial` — the reconnect plan, pure: the URLs in turn,
  full-jitter backoff (:func:`halfpi.core.backoff.backoff`), reset after a
  welcomed session, a shorter cap for a Mind on this machine, and the
  words a log or a status line says about it;
- :mod:`~halfpi.client.reconnect` — ``async for link in Reconnect(...)``:
  the one asyncio loop that dials, says hello, backs off and stops when
  refused, driven by the plan;
- :mod:`~halfpi.client.memory` — an in-memory transport, the seam's test
  double (httpx ships its ``MockTransport`` the same way).

Nothing here imports the Face SDK, the Hand or the Mind.
"""
