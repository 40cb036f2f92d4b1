"""Server CPU per delivered event: the SSE door against the WebSocket door.

Both doors on **the same Mind, the same workload, in one run**; the figure
is the Mind's CPU (every thread, from /proc) divided by the events its
readers received, and the headline is SSE / WebSocket, the median of the
per-round ratios with its min-max spread (targets: ≤ 1.3x at 1 and 10
readers, ≤ 1.5x for a resume).

- **Fan-out**: N readers (1 and 10) follow one conversation, either as
  WebSocket Faces (``face.subscribe``, ``_load.py``) or as SSE streams
  (``GET /v1/conversations/{id}/events`` with a bearer header,
  docs/protocol.md §17; ``sse_fanout.py``'s readers). Each door has its
  own conversation, so the other door's readers stay idle. A driver Face
  (this process) sends ``/repeat K x`` to a Mind whose scripted agent runs
  at full speed; the round ends when every reader saw ``chat.completed``
  and the driver its ``face.result``. The readers live in load processes,
  on raw sockets, counting bytes and markers, never decoding, and read at
  most every 2 ms (1 reader) or 10 ms (10), both doors alike (READ_PAUSE_S
  says why). Delivered
  events = the chat's events (its head cursor moved by K deltas + 3) x N.
  Each round is three chats, the order rotating round by round: one to the
  WS readers, one to the SSE readers, and one in a conversation nobody
  follows, whose CPU (the agent, the store, the driver's answers) is taken
  off the other two for a second figure: **the door's own** CPU per
  delivered event, where the ratio is not diluted by what both doors
  share (no target; the headline keeps the issue's definition). A ratio is
  refused when one load process saturated (``_bench.figure``; not when
  the readers together held a core, see ``Door.round``): the load is
  spread over more processes after a saturated warm-up. The Mind's CPU per
  event falls when it gets less CPU than it wants (more events per write):
  the ``rest`` column shows what the rest of the machine took. A delta merged
  into another (``first_seq``: the stream's queue fell behind, docs/
  protocol.md §10) still counts as delivered but makes a round cheaper
  (fewer frames): merges are shown per round (``merged``) and the ratio
  over the rounds where neither door merged is noted.
- **Resume**: a reader missed 10,000 events (``/repeat 9997 x`` in a new
  conversation after it left) and comes back: WebSocket: connect,
  ``face.hello``, ``face.subscribe{since: cursor}``; SSE: connect, ``GET``
  with ``Last-Event-ID`` = the stream's token. Figures, from the connect
  to the last replayed event: the Mind's CPU, and the wall time. The
  reader is this process; when it saturates, the wall time says more
  about it than about the Mind and its ratio is refused, while the Mind's
  CPU is not bent (every event is checked delivered).
- ``--servers native asgi``: the same on ``halfpi mind`` and on
  ``halfpi mind --server asgi``, one Mind after the other.
- ``--src SRC``: the Minds import halfpi from another tree's ``src``
  (before/after: ``git archive OLD src | tar -x -C /tmp/before``, then
  run once with ``--src /tmp/before/src`` and once without).

    python benchmarks/door_cpu.py [--quick] [--rounds N] [--readers 1 10]
                                  [--servers native asgi] [--parts fanout resume]
                                  [--src SRC] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sse_fanout
from _bench import (
    PYTHON,
    ROOT,
    SATURATED,
    CpuWindow,
    MindServer,
    figure,
    median,
    python_of,
    raise_nofile,
    saturation,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import (
    WsClient,
    close_all,
    create_conversation,
    face,
    is_chat_end,
    is_reply,
    rid,
    subscribe,
)
from _load import LoadPool
from sse_fanout import Catcher, Reader, http_base
from sse_fanout import Pool as SsePool

DELTAS = {1: 20_000, 10: 6_000}  # per round: about 0.5-1.5 s of streaming
PROCS = {1: 1, 10: 2}  # load processes to start with
# Every reader, of either door, reads its socket at most this often
# (fanout.py's pauses), so one recv() carries several frames. Unpaced, one
# WS reader nears a core; and on loopback the Mind's send() also pays for
# waking a reader blocked in epoll (about a fifth of the WS door's CPU
# here), which a reader on another machine never costs it. Both doors get
# the same pause, so neither gains from it.
READ_PAUSE_S = {1: 0.002, 10: 0.01}
MAX_PROCS = 8
FANOUT_TARGET = 1.3
RESUME_TARGET = 1.5
MISSED = 10_000  # events: chat.message, chat.started, 9,997 deltas, chat.completed
DOORS = ("ws", "sse")
SNAPSHOT_ID = re.compile(rb"event: face\.snapshot\ndata: [^\n]*\nid: ([^\n]+)\n")


def seq_of(cursor: str) -> int:
    return int(cursor.rpartition(".")[2])


def commit() -> str:
    """The commit the Minds run; with uncommitted changes under src/, ``+``
    and a hash of their diff, so that two runs of one dirty tree can be told
    apart (the files are printed on stderr)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()
    head = git("log", "-1", "--format=%h")
    dirty = git("status", "--porcelain", "--", "src")
    if not dirty:
        return head
    print(f"uncommitted under src/ (the Minds run them):\n{dirty}", file=sys.stderr)
    return f"{head}+{hashlib.sha1(git('diff', 'HEAD', '--', 'src').encode()).hexdigest()[:7]}"


# -- paced SSE readers -------------------------------------------------------------------


class PacedReader(Reader):
    """``sse_fanout.py``'s reader, pausing after each read like a WS reader
    with ``read_pause`` (``_client.WsClient``)."""

    pause = 0.0

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        transport = self.transport
        if self.pause and self.opened.done() and transport is not None:
            transport.pause_reading()
            asyncio.get_running_loop().call_later(self.pause, self._resume)

    def _resume(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()


class PacedSsePool(SsePool):
    """``sse_fanout.Pool`` whose load processes are this file's
    ``--sse-worker PAUSE``: ``sse_fanout.worker`` with paced readers."""

    def __init__(self, procs: int, pause: float) -> None:
        super().__init__(procs)
        self.pause = pause

    async def connect(self, base: str, target: str, headers: dict[str, str], n: int,
                      mark: str) -> PacedSsePool:
        host, port = base.removeprefix("http://").split(":")
        procs = max(1, min(self.procs, n))
        for i in range(procs):
            w = await asyncio.create_subprocess_exec(
                PYTHON, __file__, "--sse-worker", str(self.pause),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 20)
            self.workers.append(w)
            self._send(w, op="connect", host=host, port=int(port), target=target,
                       headers=headers, n=n // procs + (1 if i < n % procs else 0), mark=mark)
        for w in self.workers:
            await self._recv(w, 180)
        return self


def sse_worker(pause: float) -> None:
    PacedReader.pause = pause
    sse_fanout.Reader = PacedReader  # type: ignore[misc]  # open_reader builds sse_fanout.Reader
    asyncio.run(sse_fanout.worker())


# -- fan-out ------------------------------------------------------------------------------


class Door:
    """N readers of one conversation through one door, and the driver that
    makes the conversation's chats."""

    def __init__(self, name: str, mind: MindServer, driver: WsClient, conversation_id: str,
                 pool: LoadPool | SsePool | None, n: int) -> None:
        self.name = name
        self.mind = mind
        self.driver = driver
        self.conversation_id = conversation_id
        self.pool = pool
        self.n = n
        self.head = 0  # the conversation's last seq

    async def round(self, count: int) -> dict[str, Any]:
        request_id = rid("chat")
        if isinstance(self.pool, LoadPool):
            await self.pool.arm(request_id)
        elif self.pool is not None:
            await self.pool.arm()
        with CpuWindow(self.mind.pid, self.pool.pids if self.pool else ()) as window:
            sent = time.time_ns()
            self.driver.send("face.chat", {"request_id": request_id, "content":
                                           f"/repeat {count} x",
                                           "conversation_id": self.conversation_id})
            subs: dict[str, Any] = ({"frames": 0, "end_ns": 0} if self.pool is None
                                    else await self.pool.collect())
            result = await self.driver.expect(is_reply(request_id, "face.result", "face.error"),
                                              120)
        if result["type"] != "face.result" or result["payload"]["status"] != "succeeded":
            raise RuntimeError(f"{self.name}: chat failed: {result}")
        head = seq_of(result["payload"]["data"]["cursor"])
        events, self.head = head - self.head, head
        delivered = events * self.n
        # Delta frames the readers got: one per delta unless some were merged
        # (WS: "frames"; the SSE readers count each delta event's marker).
        frames = subs["frames"] if "frames" in subs else subs["events"]
        return {
            "delivered": delivered,
            "merged": count * self.n - frames,
            "us_per_event": window.server * 1e6 / delivered if delivered else 0.0,
            "chat_s": (max(subs["end_ns"], result["_at"]) - sent) / 1e9,
            **window.as_dict(),
            # Refused only when one load process saturated (a reader that
            # falls behind bends the figure); not when the readers together
            # held a core while the Mind had less, as throughput figures
            # are: that starves the Mind as much as the rest of the machine
            # does, and shows in the Mind CPU and rest columns.
            "saturated": saturation(window.server_util, window.load_max),
        }

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()


async def open_doors(mind: MindServer, driver: WsClient, n: int, procs: int) -> list[Door]:
    token = mind.token
    ws_cid = await create_conversation(driver, f"door-ws-{n}")
    ws_pool = await LoadPool(procs).connect("mind", mind.url, n, token=token,
                                            conversation_id=ws_cid,
                                            read_pause=READ_PAUSE_S.get(n, 0.01))
    sse_cid = await create_conversation(driver, f"door-sse-{n}")
    sse_pool = await PacedSsePool(procs, READ_PAUSE_S.get(n, 0.01)).connect(
        http_base(mind.url), f"/v1/conversations/{sse_cid}/events",
        {"Authorization": f"Bearer {token}"}, n, "face.snapshot")
    nobody = await create_conversation(driver, f"door-none-{n}")
    return [Door("ws", mind, driver, ws_cid, ws_pool, n),
            Door("sse", mind, driver, sse_cid, sse_pool, n),
            Door("none", mind, driver, nobody, None, n)]


async def fanout(mind: MindServer, driver: WsClient, n: int, count: int,
                 rounds: int) -> dict[str, Any]:
    procs = PROCS[n]
    doors = await open_doors(mind, driver, n, procs)
    try:
        while True:  # warm-up; spread the load further while a load process saturates
            busiest = max([(await door.round(max(200, count // 4)))["load_max"]
                           for door in doors])
            if busiest < SATURATED or procs >= min(MAX_PROCS, n):
                break
            print(f"{mind.server}, {n} readers: a load process at {busiest:.0%}; spreading "
                  f"over {procs * 2}", file=sys.stderr)
            for door in doors:
                await door.close()
            procs *= 2
            doors = await open_doors(mind, driver, n, procs)
        runs: dict[str, list[dict[str, Any]]] = {door.name: [] for door in doors}
        for index in range(rounds):
            shift = index % len(doors)
            for door in doors[shift:] + doors[:shift]:
                runs[door.name].append(await door.round(count))
    finally:
        for door in doors:
            await door.close()
    for name in DOORS:  # what the door adds to a chat nobody reads, same round
        for x, alone in zip(runs[name], runs["none"], strict=True):
            x["door_us"] = (x["server_cpu_s"] - alone["server_cpu_s"]) * 1e6 / x["delivered"]
    return {"n": n, "count": count, "procs": procs, **runs}


# -- resume -------------------------------------------------------------------------------


async def _missed_chat(driver: WsClient, conversation_id: str) -> str:
    request_id = rid("missed")
    driver.send("face.chat", {"request_id": request_id, "conversation_id": conversation_id,
                              "content": f"/repeat {MISSED - 3} x"})
    await driver.expect(is_reply(request_id, "face.result"), 120)
    return request_id


async def resume_ws(mind: MindServer, driver: WsClient) -> dict[str, Any]:
    cid = await create_conversation(driver, "resume-ws")
    away = await face(mind.url, mind.token)
    cursor = (await subscribe(away, cid))["payload"]["heads"][cid]
    await close_all([away])
    request_id = await _missed_chat(driver, cid)
    sub_id = rid("sub")
    with CpuWindow(mind.pid) as window:
        client = await face(mind.url, mind.token)
        client.send("face.subscribe", {"request_id": sub_id, "conversation_ids": [cid],
                                       "since": {cid: cursor}})
        await client.expect(is_chat_end(request_id), 60)
    accepted = await client.expect(is_reply(sub_id, "face.accepted"))
    deltas = client.events
    await close_all([client])
    return {"replay": accepted["payload"]["replay"], "deltas": deltas,
            "cpu_ms": window.server * 1e3, **window.as_dict()}


async def _sse_token(host: str, port: int, target: str, auth: dict[str, str]) -> str:
    """Open a stream, take the id of its snapshot, leave."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(_get(host, port, target, auth))
    seen = b""
    while not (match := SNAPSHOT_ID.search(seen)):
        chunk = await asyncio.wait_for(reader.read(65536), 30)
        if not chunk:
            raise RuntimeError(f"stream ended before its snapshot: {seen[:300]!r}")
        seen += chunk
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return match.group(1).decode()


def _get(host: str, port: int, target: str, headers: dict[str, str]) -> bytes:
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}:{port}",
             *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode()


async def resume_sse(mind: MindServer, driver: WsClient) -> dict[str, Any]:
    cid = await create_conversation(driver, "resume-sse")
    host, port = http_base(mind.url).removeprefix("http://").split(":")
    target = f"/v1/conversations/{cid}/events"
    auth = {"Authorization": f"Bearer {mind.token}"}
    token = await _sse_token(host, int(port), target, auth)
    await _missed_chat(driver, cid)
    loop = asyncio.get_running_loop()
    with CpuWindow(mind.pid) as window:
        transport, catcher = await loop.create_connection(Catcher, host, int(port))
        transport.write(_get(host, int(port), target, {**auth, "Last-Event-ID": token}))
        await asyncio.wait_for(catcher.done, 60)
    transport.close()
    return {"replay": "exact" if catcher.deltas == MISSED - 3 else "?", "deltas": catcher.deltas,
            "cpu_ms": window.server * 1e3, **window.as_dict()}


async def resume(mind: MindServer, driver: WsClient, rounds: int) -> dict[str, Any]:
    doors = {"ws": resume_ws, "sse": resume_sse}
    for run in doors.values():  # warm-up
        await run(mind, driver)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in doors}
    for index in range(rounds):
        for name in DOORS if index % 2 == 0 else DOORS[::-1]:
            result = await doors[name](mind, driver)
            if result["replay"] != "exact" or result["deltas"] != MISSED - 3:
                print(f"warning: {mind.server} {name} resume: replay={result['replay']}, "
                      f"{result['deltas']:,} of {MISSED - 3:,} deltas", file=sys.stderr)
            runs[name].append(result)
    return runs


# -- report -------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{x:.0%}"


def fanout_rows(kind: str, r: dict[str, Any], rev: str) -> tuple[list[list[Any]],
                                                                  list[dict[str, Any]]]:
    rows = []
    for i, (ws, sse) in enumerate(zip(r["ws"], r["sse"], strict=True)):
        rows.append([f"{kind}, {r['n']} readers #{i + 1}", ws["us_per_event"],
                     sse["us_per_event"], sse["us_per_event"] / ws["us_per_event"],
                     ws["door_us"], sse["door_us"], sse["door_us"] / ws["door_us"],
                     ws["chat_s"], sse["chat_s"],
                     f"{_pct(ws['server_util'])}/{_pct(sse['server_util'])}",
                     f"{_pct(ws['load_max'])}/{_pct(sse['load_max'])}",
                     f"{ws['saturated']}/{sse['saturated']}", f"{ws['merged']}/{sse['merged']}",
                     f"{_pct(ws['others_util'])}/{_pct(sse['others_util'])}"])
    label = "ASGI: " if kind == "asgi" else ""
    readers = f"{r['n']} reader{'s' if r['n'] > 1 else ''}"
    merged = sum(x["merged"] for x in (*r["ws"], *r["sse"]))
    clean = [s["us_per_event"] / w["us_per_event"] for w, s in zip(r["ws"], r["sse"],
                                                                     strict=True)
             if not w["merged"] and not s["merged"]]
    alone = median([x["server_cpu_s"] * 1e3 for x in r["none"]])
    row = figure(
        "door_cpu", f"{label}SSE / WebSocket: Mind CPU per delivered event, {readers}",
        "µs/event", r["sse"], r["ws"], "us_per_event", lower_is_better=True,
        target=f"≤ {FANOUT_TARGET:g}x WebSocket",
        judge=lambda _m, ratio: None if ratio is None else ratio <= FANOUT_TARGET,
        note=f"halfpi = SSE, baseline = WebSocket, same Mind ({rev}); {r['count']:,} deltas "
             f"per chat; {r['procs']} load process{'es' if r['procs'] > 1 else ''}"
             + (f"; {merged:,} deltas merged (cheaper rounds); rounds where neither door "
                f"merged: {len(clean)}, ratio median {median(clean):.2f}" if merged else ""),
    )
    own = figure(
        "door_cpu", f"{label}SSE / WebSocket: the door's own CPU per delivered event, {readers}",
        "µs/event", r["sse"], r["ws"], "door_us", lower_is_better=True,
        note=f"minus the same chat with no reader, same round (median {alone:.0f} ms); "
             f"halfpi = SSE, baseline = WebSocket ({rev})",
    )
    return rows, [{**row, "adapter": kind, "commit": rev}, {**own, "adapter": kind,
                                                            "commit": rev}]


def resume_rows(kind: str, runs: dict[str, list[dict[str, Any]]],
                rev: str) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    rows = []
    for i, (ws, sse) in enumerate(zip(runs["ws"], runs["sse"], strict=True)):
        rows.append([f"{kind} #{i + 1}", ws["cpu_ms"], sse["cpu_ms"], sse["cpu_ms"] / ws["cpu_ms"],
                     ws["wall_s"], sse["wall_s"], sse["wall_s"] / ws["wall_s"],
                     f"{_pct(ws['load_max'])}/{_pct(sse['load_max'])}",
                     f"{_pct(ws['others_util'])}/{_pct(sse['others_util'])}"])
    label = "ASGI: " if kind == "asgi" else ""
    note = f"halfpi = SSE, baseline = WebSocket, same Mind ({rev}); from the reconnect to the last"
    summary = [
        {**figure("door_cpu", f"{label}SSE / WebSocket: Mind CPU per resume of {MISSED:,} "
                  "events", "ms", runs["sse"], runs["ws"], "cpu_ms", lower_is_better=True,
                  target=f"≤ {RESUME_TARGET:g}x WebSocket",
                  judge=lambda _m, ratio: None if ratio is None else ratio <= RESUME_TARGET,
                  refuse_when_load_bound=False,
                  note=note + " event; not bent by the reader (this process) saturating"),
         "adapter": kind, "commit": rev},
        {**figure("door_cpu", f"{label}SSE / WebSocket: wall time of that resume", "s",
                  runs["sse"], runs["ws"], "wall_s", lower_is_better=True, note=note + " event"),
         "adapter": kind, "commit": rev},
    ]
    return rows, summary


def report(rows: list[list[Any]], resumed: list[list[Any]], summary: list[dict[str, Any]],
           rounds: int) -> None:
    if rows:
        print(table(["round", "WS µs/ev", "SSE µs/ev", "SSE/WS", "WS door µs", "SSE door µs",
                     "door SSE/WS", "WS chat s", "SSE chat s",
                     "Mind CPU WS/SSE", "busiest load", "saturated", "merged", "rest"], rows,
                    f"Fan-out: the Mind's CPU per delivered event ({rounds} rounds per door, "
                    "the order rotating; door µs: minus the chat nobody reads; CPU: share of "
                    "one core; rest = the rest of the machine)"))
    if resumed:
        print()
        print(table(["resume", "WS CPU ms", "SSE CPU ms", "SSE/WS", "WS wall s", "SSE wall s",
                     "SSE/WS wall", "reader CPU", "rest"], resumed,
                    f"Resume of {MISSED:,} missed events, from the reconnect to the last "
                    f"event ({rounds} rounds per door, alternating)"))
    print()
    print(summary_table(summary, "Doors: SSE against WebSocket on the same Mind (medians; "
                                 "ratio = median of per-round ratios, SSE / WebSocket)"))


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    raise_nofile(8192)
    python = python_of(args.src) if args.src else (PYTHON,)
    rows: list[list[Any]] = []
    resumed: list[list[Any]] = []
    summary: list[dict[str, Any]] = []
    with workdir("halfpi-doors-") as tmp:
        for kind in args.servers:
            rev = args.src or commit()
            mind = MindServer(tmp / f"mind-{kind}", delta_ms=0, server=kind, python=python)
            mind.start()
            print(f"{kind} Mind from {rev}", file=sys.stderr)
            try:
                driver = await face(mind.url, mind.token)
                for n in args.readers if "fanout" in args.parts else []:
                    count = DELTAS.get(n, 6_000)
                    got, fig = fanout_rows(kind, await fanout(mind, driver, n, count,
                                                              args.rounds), rev)
                    rows += got
                    summary += fig
                if "resume" in args.parts:
                    got, fig = resume_rows(kind, await resume(mind, driver, args.rounds), rev)
                    resumed += got
                    summary += fig
                await close_all([driver])
            finally:
                await stop_all(mind)
    report(rows, resumed, summary, args.rounds)
    return summary


def main() -> None:
    if sys.argv[1:2] == ["--sse-worker"]:
        sse_worker(float(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per door")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds; each round's work as in the full run")
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--servers", nargs="+", choices=("native", "asgi"),
                        default=["native", "asgi"])
    parser.add_argument("--parts", nargs="+", choices=("fanout", "resume"),
                        default=["fanout", "resume"])
    parser.add_argument("--src", help="run the Minds from this tree's src (before/after)")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    # --quick keeps each round's work: a chat a third as long is not the
    # same measurement (the socket buffers take a larger share of it). It
    # cuts the rounds only: 3, the fewest a median and a spread mean much.
    if args.quick:
        args.rounds = min(args.rounds, 3)
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "door_cpu"})


if __name__ == "__main__":
    main()
