"""SSE streams (docs/protocol.md §17): fan-out, resume and idle memory.

- **Fan-out** to 1, 10 and 100 SSE readers of one conversation. A driver
  Face (WebSocket, this process) sends ``/repeat N x`` to a Mind whose
  scripted agent runs at full speed; the readers live in load processes
  (this file run with ``--worker``: raw sockets, events counted by their
  bytes, never decoded) and the round ends when every reader has seen the
  chat's ``chat.completed``. Figure: delivered events/s over the whole chat
  (admission commit to every reader's end). Baseline, same run, rounds
  alternating: ``_raw_sse.py``, an ``asyncio.Protocol`` speaking the least
  HTTP/1.1 and SSE (chunked body) on the Mind's event loop, committing the
  same durable rows (``_rawsql.py``) and broadcasting the same number of
  events of the same size on the wire (measured from the Mind's own in the
  warm-up), each event built once and written with one ``transport.write``
  per reader, with no token, no queue, no flow control. Target ≥ 0.7x.
  The ASGI Mind (``--servers asgi``) is paired with the same work written
  as a Starlette ``StreamingResponse`` under uvicorn (``_raw_asgi_sse.py``,
  the ASGI reference), and with the raw server too (noted). A ratio is
  refused when a load process saturated (``_bench.figure``); the load is
  then spread over more processes, as ``fanout.py`` does.
- **Resume** of 10,000 missed events: a reader takes the stream's id, goes
  away, a chat of 10,000 deltas runs, and the reader comes back with
  ``Last-Event-ID``: time from the request to the last replayed event
  (target < 0.25 s).
- **Idle memory**: the Mind's RSS before and after 1,000 SSE streams are
  open and idle (each has its snapshot), per stream (target ≤ 30 KiB).

    python benchmarks/sse_fanout.py [--quick] [--rounds N] [--servers native asgi] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import (
    PYTHON,
    SATURATED,
    CpuWindow,
    MindServer,
    Server,
    figure,
    median,
    raise_nofile,
    rss_kib,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import close_all, create_conversation, face, is_reply, rid

HERE = Path(__file__).resolve().parent
DELTAS = {1: 20_000, 10: 6_000, 100: 1_500}
PROCS = {1: 1, 10: 2, 100: 4}
MAX_PROCS = 8
OPENING = 50  # streams a load process opens at once
RESUME_EVENTS = 10_000
RESUME_TARGET_S = 0.25
IDLE_STREAMS = 1_000
IDLE_TARGET_KIB = 30.0
FANOUT_TARGET = 0.7
DELTA_MARK = b"event: face.chat.delta\n"
END_MARK = b'"type":"chat.completed"'


class RawSseServer(Server):
    """The raw SSE baseline (``_raw_sse.py``: asyncio.Protocol, the Mind's loop)."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__([PYTHON, str(HERE / "_raw_sse.py"), "--db", str(workdir / "raw.db")],
                         dict(os.environ, PYTHONUNBUFFERED="1"), workdir / "raw-sse.log")


class RawAsgiSseServer(Server):
    """The ASGI reference: a Starlette ``StreamingResponse`` under uvicorn
    (``_raw_asgi_sse.py``), paired with ``halfpi mind --server asgi``."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__([PYTHON, str(HERE / "_raw_asgi_sse.py")],
                         dict(os.environ, PYTHONUNBUFFERED="1"), workdir / "raw-asgi-sse.log")


# The baseline each adapter is paired with.
BASELINES = {"native": "raw-sse", "asgi": "raw-asgi-sse"}


def http_base(url: str) -> str:
    return url.replace("ws://", "http://").split("/v1/", 1)[0]


# -- the reader side (a load process) ----------------------------------------------------


class Reader(asyncio.Protocol):
    """One SSE stream over a raw socket: bytes counted, never parsed."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.opened = asyncio.get_running_loop().create_future()
        self.ended: asyncio.Future[int] | None = None
        self.carry = b""
        self.events = 0
        self.bytes = 0
        self.first_ns = 0
        self.last_ns = 0
        self.end_ns = 0
        self.seen = b""  # everything until opened (headers, the snapshot)
        self.opened_mark = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.time_ns()
        if not self.opened.done():
            self.seen += data
            if self.opened_mark in self.seen:
                self.opened.set_result(None)
            return
        chunk = self.carry + data
        deltas = chunk.count(DELTA_MARK)
        if deltas:
            self.events += deltas
            if not self.first_ns:
                self.first_ns = now
            self.last_ns = now
        self.bytes += len(data)
        if self.ended is not None and not self.ended.done() and END_MARK in chunk:
            self.end_ns = now
            self.ended.set_result(0)
        self.carry = chunk[-(len(END_MARK) - 1):]  # a mark split across reads, never twice

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f"closed: {self.seen[:200]!r}"))
        if self.ended is not None and not self.ended.done():
            self.ended.set_exception(ConnectionError("stream ended"))

    def arm(self) -> None:
        self.ended = asyncio.get_running_loop().create_future()
        self.events = self.bytes = self.first_ns = self.last_ns = self.end_ns = 0


async def open_reader(host: str, port: int, target: str, headers: dict[str, str],
                      mark: bytes) -> Reader:
    loop = asyncio.get_running_loop()
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in
                                                                headers.items()), "", ""]
    _, reader = await loop.create_connection(Reader, host, port)
    reader.opened_mark = mark
    assert reader.transport is not None
    reader.transport.write("\r\n".join(lines).encode())
    await asyncio.wait_for(reader.opened, 60)
    return reader


async def worker() -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    readers: list[Reader] = []
    while line := await stdin.readline():
        cmd = json.loads(line)
        try:
            if cmd["op"] == "connect":
                mark = cmd["mark"].encode()
                # At most OPENING at once per worker: the Mind closes the oldest
                # unauthenticated connection beyond 256 per address (its guard),
                # and four workers share 127.0.0.1.
                for start in range(0, cmd["n"], OPENING):
                    readers += await asyncio.gather(*(
                        open_reader(cmd["host"], cmd["port"], cmd["target"], cmd["headers"], mark)
                        for _ in range(min(OPENING, cmd["n"] - start))))
                reply({"ok": True})
            elif cmd["op"] == "arm":
                for r in readers:
                    r.arm()
                reply({"armed": True})
                await asyncio.gather(*(r.ended for r in readers if r.ended is not None))
                reply({
                    "events": sum(r.events for r in readers),
                    "bytes": sum(r.bytes for r in readers),
                    "first_ns": min(r.first_ns for r in readers if r.first_ns),
                    "last_ns": max(r.last_ns for r in readers),
                    "end_ns": max(r.end_ns for r in readers),
                })
            elif cmd["op"] == "close":
                for r in readers:
                    if r.transport is not None:
                        r.transport.close()
                reply({"closed": True})
                return
        except Exception as exc:
            reply({"error": f"{type(exc).__name__}: {exc}"})
            return


class Pool:
    """Load processes holding ``n`` SSE readers between them."""

    def __init__(self, procs: int) -> None:
        self.procs = procs
        self.workers: list[asyncio.subprocess.Process] = []

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    async def _recv(self, w: asyncio.subprocess.Process, timeout: float = 300) -> dict[str, Any]:
        assert w.stdout is not None
        line = await asyncio.wait_for(w.stdout.readline(), timeout)
        if not line:
            raise RuntimeError("SSE load worker exited")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"SSE load worker: {answer['error']}")
        return answer

    def _send(self, w: asyncio.subprocess.Process, **cmd: Any) -> None:
        assert w.stdin is not None
        w.stdin.write(json.dumps(cmd).encode() + b"\n")

    async def connect(self, base: str, target: str, headers: dict[str, str], n: int,
                      mark: str) -> Pool:
        host, port = base.removeprefix("http://").split(":")
        procs = max(1, min(self.procs, n))
        sizes = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        for size in sizes:
            w = await asyncio.create_subprocess_exec(
                PYTHON, __file__, "--worker", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, limit=1 << 20)
            self.workers.append(w)
            self._send(w, op="connect", host=host, port=int(port), target=target,
                       headers=headers, n=size, mark=mark)
        for w in self.workers:
            await self._recv(w, 180)
        return self

    async def arm(self) -> None:
        for w in self.workers:
            self._send(w, op="arm")
        for w in self.workers:
            await self._recv(w, 60)

    async def collect(self) -> dict[str, Any]:
        reports = [await self._recv(w) for w in self.workers]
        return {
            "events": sum(r["events"] for r in reports),
            "bytes": sum(r["bytes"] for r in reports),
            "first_ns": min(r["first_ns"] for r in reports),
            "last_ns": max(r["last_ns"] for r in reports),
            "end_ns": max(r["end_ns"] for r in reports),
        }

    async def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._send(w, op="close")
        for w in self.workers:
            try:
                await asyncio.wait_for(w.wait(), 15)
            except TimeoutError:
                w.kill()
                await w.wait()


# -- fan-out ----------------------------------------------------------------------------------


class Side:
    def __init__(self, name: str, server: Server, pool: Pool, readers: int, driver: Any = None,
                 conversation_id: str = "") -> None:
        self.name = name
        self.readers = readers
        self.server = server
        self.pool = pool
        self.driver = driver
        self.conversation_id = conversation_id

    async def round(self, count: int, size: int) -> dict[str, Any]:
        request_id = rid("chat")
        await self.pool.arm()
        with CpuWindow(self.server.pid, self.pool.pids) as window:
            sent = time.time_ns()
            if self.driver is not None:
                self.driver.send("face.chat", {"request_id": request_id, "content":
                                               f"/repeat {count} x",
                                               "conversation_id": self.conversation_id})
                subs = await self.pool.collect()
                result = await self.driver.expect(is_reply(request_id, "face.result"), 120)
                done = max(subs["end_ns"], result["_at"])
            else:
                await asyncio.to_thread(_post, f"{self.server.ready['url']}/chat?request_id="
                                        f"{request_id}&count={count}&size={size}")
                subs = await self.pool.collect()
                done = subs["end_ns"]
        chat_s = max(1e-9, (done - sent) / 1e9)
        # Every reader got every delta (a coalesced event carries several,
        # exactly: tests/e2e/test_sse*.py), so deltas delivered = count x n.
        delivered = count * self.readers
        return {"events": subs["events"], "delivered": delivered,
                "event_bytes": subs["bytes"] / max(1, subs["events"]),
                "chat_s": chat_s, "chat_eps": delivered / chat_s, **window.as_dict()}

    async def close(self) -> None:
        await self.pool.close()
        if self.driver is not None:
            await close_all([self.driver])


def _post(url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30) as r:
        r.read()


async def sides_for(servers: dict[str, Server], n: int, procs: int) -> list[Side]:
    out = []
    for name, server in servers.items():
        if isinstance(server, MindServer):
            driver = await face(server.url, server.token)
            cid = await create_conversation(driver, f"sse-{n}")
            pool = await Pool(procs).connect(
                http_base(server.url), f"/v1/events?conversations={cid}",
                {"Authorization": f"Bearer {server.token}"}, n, "face.snapshot")
            out.append(Side(name, server, pool, n, driver, cid))
        else:
            pool = await Pool(procs).connect(server.ready["url"], "/events", {}, n, "retry:")
            out.append(Side(name, server, pool, n))
    return out


async def fanout(servers: dict[str, Server], n: int, count: int, rounds: int) -> dict[str, Any]:
    procs = PROCS[n]
    sides = await sides_for(servers, n, procs)
    try:
        while True:
            size = 0
            busiest = 0.0
            for side in sides:  # the Minds first: their event size sets the baseline's
                warm = await side.round(max(200, count // 4), size)
                if side.driver is not None:
                    size = size or round(warm["event_bytes"])
                busiest = max(busiest, warm["load_max"])
            if busiest < SATURATED or procs >= min(MAX_PROCS, n):
                break
            print(f"SSE fan-out to {n}: a load process at {busiest:.0%}; spreading over "
                  f"{procs * 2}", file=sys.stderr)
            for side in sides:
                await side.close()
            procs *= 2
            sides = await sides_for(servers, n, procs)
        runs: dict[str, list[dict[str, Any]]] = {side.name: [] for side in sides}
        for index in range(rounds):
            shift = index % len(sides)
            for side in sides[shift:] + sides[:shift]:
                result = await side.round(count, size)
                runs[side.name].append(result)
    finally:
        for side in sides:
            await side.close()
    return {"n": n, "count": count, "size": size, "procs": procs, **runs}


# -- resume and idle memory ----------------------------------------------------------------


class Catcher(asyncio.Protocol):
    """A counting client for one resumed stream: deltas counted by their
    bytes until the chat's end arrives."""

    def __init__(self) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.carry = b""
        self.deltas = 0

    def data_received(self, data: bytes) -> None:
        chunk = self.carry + data
        self.deltas += chunk.count(DELTA_MARK)
        if END_MARK in chunk and not self.done.done():
            self.done.set_result(None)
        self.carry = chunk[-(len(END_MARK) - 1):]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError("closed before the end"))


async def catch_up(base: str, target: str, headers: dict[str, str]) -> tuple[float, int]:
    """Seconds from the request to the last replayed event, and deltas seen."""
    host, port = base.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    transport, catcher = await loop.create_connection(Catcher, host, int(port))
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}:{port}",
             *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    began = time.perf_counter()
    transport.write("\r\n".join(lines).encode())
    await asyncio.wait_for(catcher.done, 60)
    took = time.perf_counter() - began
    transport.close()
    return took, catcher.deltas


async def resume(mind: MindServer, rounds: int, events: int) -> list[dict[str, Any]]:
    """Time to catch up on ``events`` missed deltas through Last-Event-ID:
    with a counting client (what the server takes), and with httpx-sse
    parsing every event (what a Python client takes)."""
    import httpx
    from httpx_sse import aconnect_sse

    base = http_base(mind.url)
    auth = {"Authorization": f"Bearer {mind.token}"}
    driver = await face(mind.url, mind.token)
    out = []
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(rounds + 1):  # the first is a warm-up
                cid = await create_conversation(driver, "sse-resume")
                token = None
                async with aconnect_sse(client, "GET", f"{base}/v1/events",
                                        params={"conversations": cid}, headers=auth) as source:
                    async for sse in source.aiter_sse():
                        if sse.event == "face.snapshot":
                            token = sse.id
                            break
                request_id = rid("missed")
                driver.send("face.chat", {"request_id": request_id, "conversation_id": cid,
                                          "content": f"/repeat {events} x"})
                await driver.expect(is_reply(request_id, "face.result"), 120)
                counted, deltas = await catch_up(
                    base, f"/v1/events?conversations={cid}",
                    {**auth, "Last-Event-ID": token or ""})
                began = time.perf_counter()
                got = 0
                async with aconnect_sse(client, "GET", f"{base}/v1/events",
                                        params={"conversations": cid},
                                        headers={**auth, "Last-Event-ID": token or ""}) as source:
                    async for sse in source.aiter_sse():
                        if sse.event == "face.chat.delta":
                            got += 1
                        elif sse.event == "face.event" and "chat.completed" in sse.data:
                            break
                took = time.perf_counter() - began
                if deltas != events or got != events:
                    print(f"warning: resume saw {deltas:,} / {got:,} deltas, {events:,} missed",
                          file=sys.stderr)
                out.append({"resume_s": counted, "parsed_s": took, "events": got})
    finally:
        await close_all([driver])
    return out[1:]


async def idle_memory(mind: MindServer, streams: int) -> dict[str, Any]:
    driver = await face(mind.url, mind.token)
    cid = await create_conversation(driver, "sse-idle")
    await asyncio.sleep(1.0)  # let the Mind settle before the first reading (not synchronisation)
    before = rss_kib(mind.pid)
    pool = await Pool(4).connect(http_base(mind.url), f"/v1/events?conversations={cid}",
                                 {"Authorization": f"Bearer {mind.token}"}, streams,
                                 "face.snapshot")
    await asyncio.sleep(1.0)
    after = rss_kib(mind.pid)
    await pool.close()
    await close_all([driver])
    return {"streams": streams, "rss_before_kib": before, "rss_after_kib": after,
            "per_stream_kib": (after - before) / streams}


# -- report ----------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    raise_nofile(8192)
    summary: list[dict[str, Any]] = []
    with workdir("halfpi-sse-") as tmp:
        servers: dict[str, Server] = {}
        try:
            for kind in args.servers:
                servers[f"halfpi-{kind}"] = MindServer(tmp / f"mind-{kind}", delta_ms=0,
                                                       server=kind).start()
            if "native" in args.servers:
                servers["raw-sse"] = RawSseServer(tmp / "raw").start()
            if "asgi" in args.servers:
                servers["raw-asgi-sse"] = RawAsgiSseServer(tmp / "raw-asgi").start()
            readers = args.readers if "fanout" in args.parts else []
            results = [await fanout(servers, n, DELTAS[n],
                                    args.rounds) for n in readers]
            rows = []
            for r in results:
                for name, runs in r.items():
                    if not isinstance(runs, list):
                        continue
                    for i, x in enumerate(runs):
                        rows.append([f"{r['n']} readers, {name} #{i + 1}", x["chat_eps"],
                                     x["chat_s"], x["events"], x["delivered"] - x["events"],
                                     f"{x['server_util']:.0%}",
                                     f"{x['load_util']:.0%}", x["saturated"],
                                     f"{x['others_util']:.0%}"])
                for kind in args.servers:
                    label = "ASGI: " if kind == "asgi" else ""
                    base = BASELINES[kind]
                    extra = ""
                    if kind == "asgi" and "raw-sse" in r:  # what ASGI costs the baselines
                        pairs = [a["chat_eps"] / b["chat_eps"]
                                 for a, b in zip(r["raw-asgi-sse"], r["raw-sse"], strict=False)]
                        extra = f"; raw ASGI SSE / raw SSE {median(pairs):.2f}"
                    summary.append({**figure(
                        "sse_fanout", f"{label}SSE fan-out to {r['n']} readers, whole chat",
                        "deltas/s", r[f"halfpi-{kind}"], r[base], "chat_eps",
                        target=f"≥ {FANOUT_TARGET:g}x raw {'ASGI ' if kind == 'asgi' else ''}SSE",
                        judge=lambda _m, ratio: None if ratio is None else ratio >= FANOUT_TARGET,
                        note=f"{r['count']:,} deltas x {r['size']} B per round; {r['procs']} "
                             "load processes; baseline: "
                             + ("Starlette StreamingResponse under uvicorn (_raw_asgi_sse.py)"
                                if kind == "asgi" else
                                "asyncio.Protocol raw SSE server (_raw_sse.py)") + extra,
                    ), "adapter": kind})
            if rows:
                print(table(["round", "deltas/s", "chat s", "events", "coalesced",
                             "server CPU", "load CPU", "saturated", "rest"], rows,
                            f"SSE fan-out rounds ({args.rounds} per side, order rotating)"))
            mind = servers[f"halfpi-{args.servers[0]}"]
            assert isinstance(mind, MindServer)
            resumed = (await resume(mind, args.rounds, RESUME_EVENTS)
                       if "resume" in args.parts else [])
            summary.extend([] if not resumed else [{**figure(
                "sse_fanout", f"SSE resume of {RESUME_EVENTS:,} missed events, counting client",
                "s", resumed, None, "resume_s", lower_is_better=True,
                target=f"< {RESUME_TARGET_S:g} s",
                judge=lambda m, _r: m < RESUME_TARGET_S,
                note="Last-Event-ID to the last replayed event",
            ), "adapter": args.servers[0]}, {**figure(
                "sse_fanout", "SSE resume, httpx-sse parsing every event", "s",
                resumed, None, "parsed_s", lower_is_better=True,
            ), "adapter": args.servers[0]}])
            await stop_all(*servers.values())
            for kind in args.servers if "idle" in args.parts else []:
                # A fresh Mind: one that streamed keeps freed memory to reuse,
                # which would hide what the streams cost.
                m = MindServer(tmp / f"idle-{kind}", delta_ms=0, server=kind).start()
                try:
                    idle = await idle_memory(m, args.idle)
                finally:
                    await stop_all(m)
                label = "ASGI: " if kind == "asgi" else ""
                summary.append({**figure(
                    "sse_fanout", f"{label}memory per idle SSE stream", "KiB", [idle], None,
                    "per_stream_kib", lower_is_better=True, target=f"≤ {IDLE_TARGET_KIB:g} KiB",
                    judge=lambda med, _r: med <= IDLE_TARGET_KIB,
                    note=f"RSS {idle['rss_before_kib']:,} -> {idle['rss_after_kib']:,} KiB "
                         f"with {idle['streams']:,} streams",
                ), "adapter": kind})
        finally:
            await stop_all(*servers.values())
    print()
    print(summary_table(summary, "SSE summary (medians; ratio = median of per-round ratios, "
                                 "halfpi / raw SSE)"))
    return summary


def main() -> None:
    if "--worker" in sys.argv:
        asyncio.run(worker())
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, 1 and 100 readers; each round's work as in the full run")
    parser.add_argument("--readers", type=int, nargs="+")
    parser.add_argument("--servers", nargs="+", choices=("native", "asgi"),
                        default=["native", "asgi"])
    parser.add_argument("--idle", type=int, default=IDLE_STREAMS, help="idle streams to open")
    parser.add_argument("--parts", nargs="+", choices=("fanout", "resume", "idle"),
                        default=["fanout", "resume", "idle"])
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    # --quick keeps each round's work (a chat's length, the streams held): a
    # shorter chat measures the socket buffers more than the servers, and
    # its ratio would not be the full run's. It cuts rounds and sizes only.
    if args.readers is None:
        args.readers = [1, 100] if args.quick else [1, 10, 100]
    if args.quick:
        args.rounds = min(args.rounds, 3)
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "sse_fanout"})


if __name__ == "__main__":
    main()
