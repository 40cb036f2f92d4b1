"""The raw Redis fan-out baseline of ``cluster_fanout.py``: a pipelined
``XADD`` publisher and ``XREAD BLOCK`` readers in load processes.

Both ends speak RESP over a plain ``asyncio.Protocol`` and parse nothing
they need not: every entry has an id of the same length (``<seq>-0`` with
``seq`` of 9 digits) and one field ``e`` of a fixed size, so a reader knows
an ``XREAD`` reply is complete from its entry count alone (the ``*N`` in its
header) and checks only the last entry's id. It is the leanest Redis
consumer we can write, as ``_client.WsClient`` counts WebSocket frames by
their prefix.

The worker (this file run as a script) speaks ``_load.Worker``'s JSON lines:

- ``{"op": "connect", "host", "port", "key", "n"}`` → n reader connections;
  answers ``{"ok": true}``;
- ``{"op": "arm", "after": SEQ, "count": N}`` → answers ``{"armed": true}``,
  then each reader reads from ``SEQ-0`` until it has N entries; then
  ``{"events", "first_ns", "last_ns"}`` (first data's and last entry's arrival);
- ``{"op": "close"}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import PYTHON
from _load import Worker

HERE = Path(__file__).resolve().parent
SEQ_BASE = 100_000_000  # 9-digit seqs: every id is 11 bytes
FIELD = b"e"
READ_COUNT = 100_000  # XREAD COUNT: everything there is


def entry_id(seq: int) -> bytes:
    return f"{seq}-0".encode()


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(bulk(p) for p in parts)


def entry_size(value_size: int) -> int:
    """Bytes of one entry in an XREAD reply (RESP2)."""
    ident = len(entry_id(SEQ_BASE))
    return (len(b"*2\r\n") + len(bulk(b"x" * ident)) + len(b"*2\r\n") + len(bulk(FIELD))
            + len(bulk(b"x" * value_size)))


class Reader(asyncio.Protocol):
    """One connection reading one stream with ``XREAD BLOCK 0``."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.prefix = b"*1\r\n*2\r\n" + bulk(key) + b"*"
        self.last = 0  # seq of the last entry read
        self.events = 0
        self.target = 0
        self.value_size = 0
        self.first_ns = 0
        self.last_ns = 0
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def arm(self, after: int, count: int, value_size: int) -> asyncio.Future[None]:
        self.last, self.events, self.target = after, 0, count
        self.value_size = value_size
        self.first_ns = self.last_ns = 0
        self.done = asyncio.get_running_loop().create_future()
        self._ask()
        return self.done

    def _ask(self) -> None:
        assert self.transport is not None
        self.transport.write(command(b"XREAD", b"COUNT", str(READ_COUNT).encode(), b"BLOCK", b"0",
                                     b"STREAMS", self.key, entry_id(self.last)))

    def data_received(self, data: bytes) -> None:
        if not self.first_ns:
            self.first_ns = time.time_ns()
        buf = self.buf
        buf += data
        if not buf.startswith(self.prefix):
            if len(buf) >= len(self.prefix):
                self._fail(f"unexpected reply {bytes(buf[:80])!r}")
            return
        end = buf.find(b"\r\n", len(self.prefix))
        if end < 0:
            return
        n = int(buf[len(self.prefix):end])
        size = entry_size(self.value_size)
        total = end + 2 + n * size
        if len(buf) < total:
            return
        ident = len(entry_id(SEQ_BASE))
        at = total - size + len(b"*2\r\n") + len(b"$%d\r\n" % ident)
        got, want = bytes(buf[at:at + ident]), entry_id(self.last + n)
        if got != want:
            self._fail(f"a gap: expected {want!r}, got {got!r}")
            return
        del buf[:total]
        self.last += n
        self.events += n
        self.last_ns = time.time_ns()
        if self.events >= self.target:
            assert self.done is not None
            if not self.done.done():
                self.done.set_result(None)
        else:
            self._ask()

    def _fail(self, why: str) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(RuntimeError(why))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection lost: {exc}")


class Publisher(asyncio.Protocol):
    """One connection writing pipelined ``XADD``s, ``batch`` per round trip."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pending = 0  # reply bytes still expected
        self.got = 0
        self.wake: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= self.pending and self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    async def send(self, commands: bytes, reply_bytes: int) -> None:
        assert self.transport is not None
        self.got = 0
        self.pending = reply_bytes
        self.wake = asyncio.get_running_loop().create_future()
        self.transport.write(commands)
        await asyncio.wait_for(self.wake, 30)


def xadds(key: bytes, first: int, count: int, value: bytes, maxlen: int,
          batch: int) -> list[tuple[bytes, int]]:
    """The pre-encoded pipelines (and the reply bytes each waits for) that
    append seqs first .. first+count-1."""
    reply = len(bulk(entry_id(SEQ_BASE)))
    out = []
    for start in range(first, first + count, batch):
        seqs = range(start, min(first + count, start + batch))
        out.append((b"".join(command(b"XADD", key, b"MAXLEN", b"~", str(maxlen).encode(),
                                     entry_id(s), FIELD, value) for s in seqs),
                    reply * len(seqs)))
    return out


class XreadPool:
    """``procs`` worker processes holding ``n`` readers between them."""

    def __init__(self, procs: int) -> None:
        self.procs = procs
        self.workers: list[Worker] = []
        self.sizes: list[int] = []

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    async def connect(self, host: str, port: int, key: str, n: int) -> XreadPool:
        procs = max(1, min(self.procs, n))
        self.sizes = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        for _ in range(procs):
            proc = await asyncio.create_subprocess_exec(
                PYTHON, str(HERE / "_xread.py"), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            self.workers.append(Worker(proc))
        for worker, size in zip(self.workers, self.sizes, strict=True):
            worker.send(op="connect", host=host, port=port, key=key, n=size)
        for worker in self.workers:
            await worker.recv(60)
        return self

    async def arm(self, after: int, count: int, value_size: int) -> None:
        for worker in self.workers:
            worker.send(op="arm", after=after, count=count, value_size=value_size)
        for worker in self.workers:
            await worker.recv(60)

    async def collect(self, timeout: float = 300.0) -> dict[str, Any]:
        reports = [await w.recv(timeout) for w in self.workers]
        return {
            "events": sum(r["events"] for r in reports),
            "first_ns": min(r["first_ns"] for r in reports),
            "last_ns": max(r["last_ns"] for r in reports),
        }

    async def close(self) -> None:
        for worker in self.workers:
            worker.send(op="close")
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.proc.wait(), 15)
            except TimeoutError:
                worker.proc.kill()
                await worker.proc.wait()
        self.workers.clear()


# -- the worker process -----------------------------------------------------------


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    readers: list[Reader] = []
    while line := await reader.readline():
        cmd = json.loads(line)
        try:
            if cmd["op"] == "connect":
                key: bytes = cmd["key"].encode()

                def make(key: bytes = key) -> Reader:
                    return Reader(key)

                for _ in range(int(cmd["n"])):
                    _, r = await loop.create_connection(make, cmd["host"], int(cmd["port"]))
                    readers.append(r)
                reply({"ok": True})
            elif cmd["op"] == "arm":
                waits = [r.arm(int(cmd["after"]), int(cmd["count"]), int(cmd["value_size"]))
                         for r in readers]
                reply({"armed": True})
                await asyncio.gather(*waits)
                reply({"events": sum(r.events for r in readers),
                       "first_ns": min(r.first_ns for r in readers),
                       "last_ns": max(r.last_ns for r in readers)})
            elif cmd["op"] == "close":
                for r in readers:
                    if r.transport is not None:
                        r.transport.close()
                reply({"closed": True})
                return
        except Exception as exc:  # reported to the parent, which raises it
            reply({"error": f"{type(exc).__name__}: {exc}"})
            return


if __name__ == "__main__":
    asyncio.run(_serve())
