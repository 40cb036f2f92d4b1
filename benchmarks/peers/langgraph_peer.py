"""Peer comparison: the same 20,000-event workload on a LangGraph dev server and on halfpi.

The peer is LangGraph's in-memory dev server (``langgraph dev``, from
``langgraph-cli[inmem]``, versions pinned in PINS), installed by this script
into its own virtual environment (``--venv``, default
``~/.cache/halfpi-bench/langgraph-venv``; re-used while its pins match). It
serves ``langgraph_app/graph.py``: one node writing N events to the
``custom`` stream, each ``{"i": i, "t": time_ns}``, yielding to the loop
between events (or sleeping ``pace_ms``), as halfpi's scripted agent does
with ``/repeat`` and ``/stamp``. Clients read LangGraph's SSE streams with a
lean HTTP/1.1 client (chunked decoding, events counted by their ``event:
custom`` line, nothing JSON-decoded) and halfpi's WebSocket streams with the
lean client of ``_client.py``; both read each socket at most every few ms.

Workloads, alternating between the two servers round by round:

- **throughput, 1 client**: one run of 20,000 events streamed to one client
  (LangGraph: ``POST /threads/{t}/runs/stream``; halfpi: ``/repeat 20000 x``
  to one subscribed Face); events/s from the first event's arrival to the
  last one's, and the whole run (request sent → stream ended);
- **throughput, 10 clients**: one run of 20,000 events watched by 10
  clients (LangGraph: a resumable run joined by 10 clients with
  ``Last-Event-ID: -1``; halfpi: 10 subscribed Faces);
- **server CPU per delivered event** in both (the server process, all its
  threads, from /proc);
- **paced p99**: 600 events at ~200/s (``pace_ms`` 5 / ``HALFPI_SCRIPTED_DELTA_MS=5``)
  to one client; latency = arrival time minus the emission stamp in the event;
- **resume**: a client reads the first event of a 10,001-event run and
  disconnects; once the run ended it resumes from that event (LangGraph:
  ``GET /threads/{t}/runs/{r}/stream`` with ``Last-Event-ID``; halfpi:
  ``face.subscribe{since}`` for 10,000 missed events); time from the
  request to the last event.

The load side's CPU is printed beside the server's; a ratio is refused when
a load process saturated. The LangGraph server is started in its own
process group and stopped (SIGTERM, then SIGKILL) when the script ends.

    python benchmarks/peers/langgraph_peer.py [--rounds N] [--events N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

import fanout  # noqa: E402
import resume  # noqa: E402
from _bench import (  # noqa: E402
    PYTHON,
    CpuWindow,
    MindServer,
    figure,
    percentile,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)

APP = Path(__file__).resolve().parent / "langgraph_app"
PINS = (
    "langgraph-cli[inmem]==0.4.40",
    "langgraph==1.2.24",
    "langgraph-api==0.16.7",
    "langgraph-runtime-inmem==0.36.7",
    "langgraph-checkpoint==4.3.2",
    "langgraph-sdk==0.4.14",
)
DEFAULT_VENV = Path.home() / ".cache" / "halfpi-bench" / "langgraph-venv"
READ_PAUSE_S = 0.002
PACE_MS = 5.0
PACED_EVENTS = 600
MISSED = 10_000


# -- the peer's environment and server --------------------------------------------------


def ensure_venv(venv: Path) -> Path:
    """A virtual environment with exactly PINS installed; returns its ``langgraph``."""
    marker = venv / "halfpi-pins.txt"
    exe = venv / "bin" / "langgraph"
    if marker.exists() and marker.read_text() == "\n".join(PINS) and exe.exists():
        return exe
    print(f"installing {', '.join(PINS)} into {venv} ...", file=sys.stderr, flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([PYTHON, "-m", "venv", "--clear", str(venv)], check=True)
    with open(venv.parent / "langgraph-pip.log", "wb") as log:  # pip's chatter, kept
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *PINS],
            check=True,
            timeout=1800,
            stdout=log,
            stderr=log,
        )
    marker.write_text("\n".join(PINS))
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LangGraphServer:
    """``langgraph dev`` on 127.0.0.1 in its own process group."""

    def __init__(self, exe: Path, log: Path) -> None:
        self.exe = exe
        self.log_path = log
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> LangGraphServer:
        env = dict(os.environ, LANGSMITH_TRACING="false", LANGCHAIN_TRACING_V2="false",
                   LANGGRAPH_CLI_NO_ANALYTICS="1", PYTHONUNBUFFERED="1")
        argv = [str(self.exe), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1",
                "--port", str(self.port), "--config", str(APP / "langgraph.json")]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=APP, env=env, stdout=log, stderr=log,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"langgraph dev exited:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + "/ok", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"langgraph dev did not start in {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.base + path, data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=30) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            result: dict[str, Any] = json.loads(r.read())
            return result


# -- a lean SSE client ------------------------------------------------------------------

_CUSTOM = b"event: custom"
_STAMP = re.compile(rb'"t":(\d+)')
_RUN_ID = re.compile(rb'"run_id":"([^"]+)"')
_ID = re.compile(rb"event: custom\r?\ndata: [^\n]*\nid: ([^\r\n]+)")


class Sse(asyncio.Protocol):
    """One HTTP/1.1 request whose response is an SSE stream (chunked or not).
    Counts ``event: custom`` lines; with ``stamp`` parses each event's ``t``;
    notes the run id and the first custom event's ``id``; ``stop_after``
    closes the connection after that many events."""

    def __init__(self, request: bytes, *, pause: float = 0.0, stamp: bool = False,
                 stop_after: int = 0) -> None:
        loop = asyncio.get_running_loop()
        self.request = request
        self.pause = pause
        self.stamp = stamp
        self.stop_after = stop_after
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.head_done = False
        self.chunked = False
        self.tail = b""
        self.events = 0
        self.first_ns = self.last_ns = 0
        self.latencies: list[int] = []
        self.run_id = ""
        self.first_id = ""
        self.status = 0

    @classmethod
    async def open(cls, port: int, request: bytes, **kw: Any) -> Sse:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(lambda: cls(request, **kw), "127.0.0.1", port)
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.time_ns()
        buf = self.buf
        buf += data
        if not self.head_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).decode("latin-1").lower()
            self.status = int(head.split(None, 2)[1])
            self.chunked = "transfer-encoding: chunked" in head
            del buf[: end + 4]
            self.head_done = True
        if self.chunked:
            pos = 0
            n = len(buf)
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
                if size == 0:
                    self._finish()
                    pos = n
                    break
                if eol + 2 + size + 2 > n:
                    break
                self._body(bytes(buf[eol + 2 : eol + 2 + size]), now)
                pos = eol + 2 + size + 2
            del buf[:pos]
        else:
            self._body(bytes(buf), now)
            buf.clear()
        if self.pause and self.transport is not None and not self.done.done():
            self.transport.pause_reading()
            self.loop.call_later(self.pause, self._resume)

    def _resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _body(self, chunk: bytes, now: int) -> None:
        text = self.tail + chunk
        count = text.count(_CUSTOM)
        self.tail = text[-(len(_CUSTOM) - 1):]
        if not self.run_id:
            m = _RUN_ID.search(text)
            if m:
                self.run_id = m.group(1).decode()
        if count:
            if not self.first_ns:
                self.first_ns = now
            self.last_ns = now
            self.events += count
            if not self.first_id:
                m = _ID.search(text)
                if m:
                    self.first_id = m.group(1).decode()
            if self.stamp:
                self.latencies.extend(now - int(t) for t in _STAMP.findall(chunk))
            if self.stop_after and self.events >= self.stop_after and self.first_id:
                self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        if self.transport is not None:
            self.transport.close()


def http(method: str, path: str, port: int, body: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             "Accept: text/event-stream", "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


# -- LangGraph workloads ----------------------------------------------------------------


def _run_body(count: int, pace_ms: float = 0.0, **extra: Any) -> dict[str, Any]:
    return {"assistant_id": "stream", "input": {"count": count, "pace_ms": pace_ms},
            "stream_mode": ["custom"], **extra}


async def lg_stream(server: LangGraphServer, clients: int, count: int) -> dict[str, Any]:
    thread = (await asyncio.to_thread(server.post, "/threads", {}))["thread_id"]
    with CpuWindow(server.pid) as window:
        sent = time.time_ns()
        if clients == 1:
            subs = [await Sse.open(server.port, http(
                "POST", f"/threads/{thread}/runs/stream", server.port, _run_body(count)),
                pause=READ_PAUSE_S)]
        else:
            run = await asyncio.to_thread(
                server.post, f"/threads/{thread}/runs", _run_body(count, stream_resumable=True))
            path = f"/threads/{thread}/runs/{run['run_id']}/stream"
            subs = await asyncio.gather(*(
                Sse.open(server.port, http("GET", path, server.port,
                                           headers={"Last-Event-ID": "-1"}),
                         pause=READ_PAUSE_S) for _ in range(clients)))
        await asyncio.wait_for(asyncio.gather(*(s.done for s in subs)), 600)
        ended = time.time_ns()
    return _stream_result(subs, count * clients, sent, ended, window)


def _stream_result(subs: list[Any], expected: int, sent: int, ended: int,
                   window: CpuWindow) -> dict[str, Any]:
    events = sum(s.events for s in subs)
    if events != expected:
        print(f"warning: {events:,} events delivered, {expected:,} expected", file=sys.stderr)
    first = min(s.first_ns for s in subs)
    last = max(s.last_ns for s in subs)
    stream_s = max(1e-9, (last - first) / 1e9)
    whole_s = max(1e-9, (ended - sent) / 1e9)
    return {"events": events, "stream_eps": events / stream_s, "whole_eps": events / whole_s,
            "whole_s": whole_s, "cpu_us_per_event": window.server / max(1, events) * 1e6,
            **window.as_dict()}


async def lg_paced(server: LangGraphServer) -> dict[str, Any]:
    thread = (await asyncio.to_thread(server.post, "/threads", {}))["thread_id"]
    with CpuWindow(server.pid) as window:
        sub = await Sse.open(server.port, http("POST", f"/threads/{thread}/runs/stream",
                                               server.port, _run_body(PACED_EVENTS, PACE_MS)),
                             stamp=True)
        await asyncio.wait_for(sub.done, 120)
    return _latency_result(sub.latencies, window)


def _latency_result(latencies_ns: list[int], window: CpuWindow) -> dict[str, Any]:
    lat = sorted(latencies_ns)
    return {"p50_ms": percentile(lat, 50) / 1e6, "p99_ms": percentile(lat, 99) / 1e6,
            "samples": len(lat), **window.as_dict()}


async def lg_resume(server: LangGraphServer) -> dict[str, Any]:
    thread = (await asyncio.to_thread(server.post, "/threads", {}))["thread_id"]
    body = _run_body(MISSED + 1, stream_resumable=True, on_disconnect="continue")
    away = await Sse.open(server.port, http("POST", f"/threads/{thread}/runs/stream",
                                            server.port, body), stop_after=1)
    await asyncio.wait_for(away.done, 60)
    run_id, cursor = away.run_id, away.first_id
    if not run_id or not cursor:
        raise RuntimeError("no run id or event id in LangGraph's stream")
    deadline = time.monotonic() + 300
    while True:  # the run goes on without the client; wait for its end
        status = (await asyncio.to_thread(server.get, f"/threads/{thread}/runs/{run_id}"))["status"]
        if status not in ("pending", "running"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the LangGraph run did not end")
        await asyncio.sleep(0.2)
    with CpuWindow(server.pid) as window:
        sent = time.time_ns()
        back = await Sse.open(server.port, http(
            "GET", f"/threads/{thread}/runs/{run_id}/stream", server.port,
            headers={"Last-Event-ID": cursor}))
        await asyncio.wait_for(back.done, 120)
        arrived = back.last_ns or time.time_ns()
    return {"seconds": (arrived - sent) / 1e9, "events": back.events, "status": status,
            **window.as_dict()}


# -- halfpi workloads -------------------------------------------------------------------


async def hp_stream(mind: MindServer, clients: int, count: int) -> dict[str, Any]:
    side = await fanout.connect_mind(mind, clients, 1 if clients == 1 else 2, READ_PAUSE_S)
    try:
        r = await fanout.chat_round(side, count)
    finally:
        await side.close()
    return {"events": r["events"], "stream_eps": r["stream_eps"], "whole_eps": r["chat_eps"],
            "whole_s": r["chat_s"],
            "cpu_us_per_event": r["server_cpu_s"] / max(1, r["events"]) * 1e6,
            **{k: r[k] for k in ("wall_s", "server_cpu_s", "server_util", "load_util",
                                 "load_max", "load_procs", "others_util", "saturated")}}


async def hp_paced(mind: MindServer) -> dict[str, Any]:
    side = await fanout.connect_mind(mind, 1, 1, 0.0)
    try:
        r = await fanout.chat_round(side, PACED_EVENTS, stamp=True)
    finally:
        await side.close()
    return {"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "samples": r["samples"],
            **{k: r[k] for k in ("wall_s", "server_cpu_s", "server_util", "load_util",
                                 "load_max", "load_procs", "others_util", "saturated")}}


# -- the comparison ---------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    exe = ensure_venv(Path(args.venv))
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with workdir("halfpi-peer-") as tmp:
        lg = LangGraphServer(exe, tmp / "langgraph.log")
        fast = MindServer(tmp / "mind-fast", delta_ms=0).start()
        paced = MindServer(tmp / "mind-paced", delta_ms=PACE_MS).start()
        try:
            await asyncio.to_thread(lg.start)
            prep = await resume.prepare(fast)
            # warm-up: load the graph and the actors
            await lg_stream(lg, 1, 500)
            await hp_stream(fast, 1, 500)
            for index in range(args.rounds):
                for who in ("langgraph", "halfpi") if index % 2 == 0 else ("halfpi", "langgraph"):
                    for clients in (1, 10):
                        r = (await lg_stream(lg, clients, args.events) if who == "langgraph"
                             else await hp_stream(fast, clients, args.events))
                        runs.setdefault((who, f"stream{clients}"), []).append(r)
                    r = await lg_paced(lg) if who == "langgraph" else await hp_paced(paced)
                    runs.setdefault((who, "paced"), []).append(r)
                    if who == "langgraph":
                        r = await lg_resume(lg)
                    else:
                        r = await resume.resume_lean(fast, prep, decode=False)
                    runs.setdefault((who, "resume"), []).append(r)
                    print(f"round {index + 1} {who} done", file=sys.stderr, flush=True)
        finally:
            await asyncio.to_thread(lg.stop)
            await stop_all(fast, paced)
    return report(runs, args)


def report(runs: dict[tuple[str, str], list[dict[str, Any]]],
           args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for (who, what), rs in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for i, r in enumerate(rs):
            main = {"stream1": "stream_eps", "stream10": "stream_eps", "paced": "p99_ms",
                    "resume": "seconds"}[what]
            rows.append([f"{what} {who} #{i + 1}", r[main], r.get("events", r.get("samples")),
                         f"{r['server_util']:.0%}", f"{r['load_util']:.0%}", r["saturated"],
                         f"{r['others_util']:.0%}"])
    print(table(["round", "figure", "events", "server CPU", "load CPU", "saturated", "rest"],
                rows, "Rounds (figure: events/s for streams, p99 ms for paced, s for resume)"))
    summary = []
    hp, lg = "halfpi", "langgraph"
    for clients in (1, 10):
        key = f"stream{clients}"
        summary.append(figure("peer", f"{args.events:,} events to {clients} client"
                              f"{'s' if clients > 1 else ''}, stream", "events/s",
                              runs[(hp, key)], runs[(lg, key)], "stream_eps",
                              note="first event's arrival to the last one's"))
        summary.append(figure("peer", f"{args.events:,} events to {clients} client"
                              f"{'s' if clients > 1 else ''}, whole run", "events/s",
                              runs[(hp, key)], runs[(lg, key)], "whole_eps",
                              note="request sent to the stream's end"))
        summary.append(figure("peer", f"server CPU per delivered event, {clients} client"
                              f"{'s' if clients > 1 else ''}", "µs", runs[(hp, key)],
                              runs[(lg, key)], "cpu_us_per_event", lower_is_better=True,
                              refuse_when_load_bound=False))
    summary.append(figure("peer", f"paced p99 ({PACED_EVENTS} events at ~200/s, 1 client)", "ms",
                          runs[(hp, "paced")], runs[(lg, "paced")], "p99_ms",
                          lower_is_better=True))
    lg_events = sorted({r["events"] for r in runs[(lg, "resume")]})
    summary.append(figure("peer", f"resume of {MISSED:,} missed events", "s",
                          runs[(hp, "resume")], runs[(lg, "resume")], "seconds",
                          lower_is_better=True,
                          note=f"LangGraph replayed {lg_events} events after Last-Event-ID"))
    print()
    print(summary_table(summary, "halfpi against LangGraph's dev server (baseline column = "
                                 "LangGraph; ratio = halfpi / LangGraph, per round)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--venv", default=str(DEFAULT_VENV))
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "peer-langgraph", "pins": list(PINS)})


if __name__ == "__main__":
    main()
