"""Load spread over several processes, so that the server, not the clients,
is what saturates.

The benchmark process keeps the driver (the connection that sends
``face.chat``); the subscribers live in ``procs`` worker processes (this
file run as a script), split evenly. Parent and worker speak JSON lines
over the worker's stdin/stdout:

- ``{"op": "connect", "kind": "mind"|"raw", "url", "token",
  "conversation_id", "n", "read_pause"}`` → n subscribed connections;
  answers ``{"ok": true}``;
- ``{"op": "arm", "request_id", "stamp"}`` → resets the counters and waits
  for that chat's ``chat.completed`` on every connection; answers
  ``{"armed": true}`` at once, then, when all ended, the counts, the first
  and last delta's arrival, the last end's arrival and (stamp) the
  latencies in µs;
- ``{"op": "close"}`` → closes the connections and exits.

Each worker is one thread; its CPU is read from /proc by the parent (see
``_bench.CpuWindow``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import PYTHON
from _client import (
    WsClient,
    close_all,
    face,
    is_chat_end,
    is_reply,
    many,
    rid,
    subscribe,
)

HERE = Path(__file__).resolve().parent


class Worker:
    """The parent's handle on one worker process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")

    async def recv(self, timeout: float = 300.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"load worker {self.pid} exited (code {self.proc.returncode})")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"load worker {self.pid}: {reply['error']}")
        return reply


class LoadPool:
    """``procs`` worker processes holding ``n`` subscribers between them."""

    def __init__(self, procs: int) -> None:
        self.procs = procs
        self.workers: list[Worker] = []
        self.sizes: list[int] = []

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    async def connect(
        self,
        kind: str,
        url: str,
        n: int,
        *,
        token: str = "",
        conversation_id: str = "",
        read_pause: float = 0.0,
    ) -> LoadPool:
        procs = max(1, min(self.procs, n))
        self.sizes = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        for _ in range(procs):
            proc = await asyncio.create_subprocess_exec(
                PYTHON,
                str(HERE / "_load.py"),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=64 * 1024 * 1024,
            )
            self.workers.append(Worker(proc))
        for worker, size in zip(self.workers, self.sizes, strict=True):
            worker.send(
                op="connect",
                kind=kind,
                url=url,
                token=token,
                conversation_id=conversation_id,
                n=size,
                read_pause=read_pause,
            )
        for worker in self.workers:
            await worker.recv(120)
        return self

    async def arm(self, request_id: str, stamp: bool = False) -> None:
        for worker in self.workers:
            worker.send(op="arm", request_id=request_id, stamp=stamp)
        for worker in self.workers:
            await worker.recv(60)

    async def collect(self, timeout: float = 300.0) -> dict[str, Any]:
        """Wait for every worker's end report; merged."""
        reports = [await w.recv(timeout) for w in self.workers]
        latencies: list[int] = []
        for r in reports:
            latencies.extend(r["latencies_us"])
        return {
            "events": sum(r["events"] for r in reports),
            "frames": sum(r["frames"] for r in reports),
            "coalesced": sum(r["coalesced"] for r in reports),
            "delta_bytes": sum(r["delta_bytes"] for r in reports),
            "first_ns": min(r["first_ns"] for r in reports if r["first_ns"]),
            "last_ns": max(r["last_ns"] for r in reports),
            "end_ns": max(r["end_ns"] for r in reports),
            "latencies_us": latencies,
        }

    async def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                worker.send(op="close")
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.proc.wait(), 15)
            except TimeoutError:
                worker.proc.kill()
                await worker.proc.wait()
        self.workers.clear()


# -- the worker process -----------------------------------------------------------


async def _connect(cmd: dict[str, Any]) -> list[WsClient]:
    url, n = cmd["url"], int(cmd["n"])
    if cmd["kind"] == "mind":
        token, conversation_id = cmd["token"], cmd["conversation_id"]
        subs = await many(lambda: face(url, token), n)
        await asyncio.gather(*(subscribe(s, conversation_id) for s in subs))
    else:

        async def sub() -> WsClient:
            client = await WsClient.connect(url)
            request_id = rid("sub")
            client.send_json({"cmd": "subscribe", "request_id": request_id})
            await client.expect(is_reply(request_id, "face.accepted"))
            return client

        subs = await many(sub, n)
    for s in subs:
        s.read_pause = float(cmd.get("read_pause", 0.0))
    return subs


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out = sys.stdout

    def reply(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    subs: list[WsClient] = []
    while line := await reader.readline():
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "connect":
                subs = await _connect(cmd)
                reply({"ok": True})
            elif op == "arm":
                latencies: list[int] | None = [] if cmd.get("stamp") else None
                for s in subs:
                    s.reset_counters()
                    s.latencies = latencies
                predicate = is_chat_end(cmd["request_id"])
                waits = [asyncio.ensure_future(s.expect(predicate, 300)) for s in subs]
                reply({"armed": True})
                ends = await asyncio.gather(*waits)
                reply(
                    {
                        "events": sum(s.events for s in subs),
                        "frames": sum(s.frames for s in subs),
                        "coalesced": sum(s.coalesced for s in subs),
                        "delta_bytes": sum(s.delta_bytes for s in subs),
                        "first_ns": min((s.first_ns for s in subs if s.first_ns), default=0),
                        "last_ns": max(s.last_ns for s in subs),
                        "end_ns": max(m["_at"] for m in ends),
                        "latencies_us": [x // 1000 for x in latencies or ()],
                    }
                )
            elif op == "close":
                await close_all(subs)
                reply({"closed": True})
                return
        except Exception as exc:  # reported to the parent, which raises it
            reply({"error": f"{type(exc).__name__}: {exc}"})
            return


if __name__ == "__main__":
    asyncio.run(_serve())
