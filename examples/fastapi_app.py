"""halfpi's Mind mounted in a FastAPI application, next to the app's own routes.

    pip install halfpi fastapi
    HALFPI_HOME=/tmp/halfpi-demo uvicorn examples.fastapi_app:app --port 8000 \\
        --ws-max-size 4194304 --ws-ping-interval 15 --ws-ping-timeout 30
    curl http://127.0.0.1:8000/hello
    halfpi face --home /tmp/halfpi-demo --url ws://127.0.0.1:8000/halfpi/v1/face

The Mind serves ``/halfpi/v1/face`` (Faces), ``/halfpi/v1/hand`` (Hands) and
``/halfpi/healthz``; the host app keeps every other path. Starlette gives a
mounted application no lifespan events, so the host app runs the Mind's
lifespan as its own: the Mind opens its home when the app starts and drains
(chats end ``interrupted``, the store is closed) when it stops. See
docs/asgi.md for the server settings and what differs from ``halfpi mind``.
"""

from __future__ import annotations

import os

from fastapi import FastAPI

from halfpi.asgi import MindApp
from halfpi.config import Config, default_home

PORT = int(os.environ.get("PORT", "8000"))


def create_app(config: Config, *, hand_url: str | None = None) -> FastAPI:
    # hand_url: where the in-process Hand "local" reaches this app. Only the
    # host knows its address and mount path; without it no local Hand runs.
    mind = MindApp(config, hand_url=hand_url)
    app = FastAPI(lifespan=mind.lifespan)

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "from the host app"}

    @app.get("/mind")
    async def mind_status() -> dict[str, object]:
        # The running Mind is there for the app's own routes too.
        return {"node_id": mind.mind.node_id, "local_hand": mind.mind.hands.connected("local")}

    app.mount("/halfpi", mind)
    return app


app = create_app(Config(home=default_home()), hand_url=f"ws://127.0.0.1:{PORT}/halfpi/v1/hand")

if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=PORT, ws_max_size=4 * 1024 * 1024,
                ws_ping_interval=15, ws_ping_timeout=30)
