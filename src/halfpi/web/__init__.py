"""The web face: static files the Mind serves at ``/`` (docs/faces.md).

``index.html``, ``app.js`` (one ES module, no dependencies, no build step)
and ``app.css`` ship in the wheel as package data; the routes that serve
them, with their security headers, are ``halfpi.gateway.http.web``.
"""
