"""The Mind's end of one Hand connection, scripted by a test: a queue pair
(no sockets) — the test says what the Mind sends and reads what the Hand
answers (``tests/hand``)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from halfpi.client.transport import ConnectionLost

Frame = dict[str, Any]


@dataclass
class ScriptedMind:
    """The Mind's end of one Hand connection."""

    to_hand: asyncio.Queue[Frame | None] = field(default_factory=asyncio.Queue)
    from_hand: list[Frame] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, text: str) -> None:  # the Hand sends
        self.from_hand.append(json.loads(text))
        self.arrived.set()

    async def recv(self) -> str:  # the Hand receives
        frame = await self.to_hand.get()
        if frame is None:
            raise ConnectionLost(1000, "test over")
        return json.dumps(frame)

    async def close(self) -> None:
        self.to_hand.put_nowait(None)

    def tell(self, type_: str, **payload: Any) -> None:
        self.to_hand.put_nowait({"type": type_, "payload": payload})

    async def expect(self, type_: str, timeout: float = 10.0, **match: Any) -> Frame:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for frame in self.from_hand:
                body = frame["payload"]
                if frame["type"] == type_ and all(body.get(k) == v for k, v in match.items()):
                    return body
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), deadline - loop.time())
