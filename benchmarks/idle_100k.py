"""Idle at scale: one ``halfpi mind`` holding up to 100,000 idle Faces.

Questions (docs/performance.md, "100,000 idle Faces"): does one Mind
(native server, WebSocket Faces, default 15 s heartbeat) hold 100,000 idle
Faces within 1 GiB RSS and under 1 % of a core, and does a chat still reach
1,000 of them with p99 < 50 ms?

- The Mind is ``halfpi mind`` (``_bench.MindServer``, no overrides); it
  raises its soft ``RLIMIT_NOFILE`` to the hard limit itself
  (``gateway/guard.py``, ``raise_descriptor_limit``), and this process
  raises its own first (``raise_nofile``), which the Mind inherits.
- Faces live in ``--procs`` load processes (this file with ``--worker``),
  each raising its own ``RLIMIT_NOFILE``. Each Face is a minimal client:
  the WebSocket handshake, ``face.hello``, wait for ``face.welcome``; after
  that it answers WebSocket pings with pongs and ignores everything else
  (the ``face.ping`` of each heartbeat). Source addresses rotate over
  127.0.0.2-127.0.0.9 (``local_addr=(ip, 0)``) so that ephemeral ports do
  not run out (one range per source address).
- Faces are added in steps (``--steps``, top ``--faces``). After each step
  the Mind's RSS (``VmRSS``) and its CPU over one whole heartbeat period
  (15 s: one heartbeat per connection, counted by the clients) are read
  from ``/proc``; the same window with no idle Face first is the baseline.
  A step the Mind's descriptor limit cannot hold is cut to what it can
  (its soft limit, minus the files it has open, minus a margin): the
  report says which step was reached and why.
- Then ``--subscribers`` of the held Faces subscribe to one conversation,
  a driver Face (in this process) sends ``/stamp N`` (the scripted agent
  stamps each delta with the Mind's ``time.time_ns()``, ``--delta-ms``
  apart) and every subscriber's arrival time minus the stamp is the
  delivery latency: p50/p99 per round, ``--rounds`` rounds after a warm-up.

Every wait has a timeout, load processes exit on their own (end of input
or ``--deadline``), only 127.0.0.1-127.0.0.9 is used.

    python benchmarks/idle_100k.py [--faces 100000] [--steps 10000 25000 50000] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import os
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
from _bench import (
    PYTHON,
    CpuWindow,
    MindServer,
    median,
    percentile,
    raise_nofile,
    rss_kib,
    stop_all,
    table,
    workdir,
    write_json,
)
from _client import (
    DELTA_PREFIX,
    HELLO_CLIENT,
    WsClient,
    client_frame,
    close_all,
    create_conversation,
    face,
    is_reply,
    rid,
)
from _load import Worker

HEARTBEAT_S = 15.0  # the Mind's default (Config.heartbeat_s)
SOURCE_IPS = [f"127.0.0.{i}" for i in range(2, 10)]
FD_MARGIN = 64  # descriptors left to the Mind beyond its sockets (store, logs, a Hand)
RSS_TARGET_KIB = 1024 * 1024
CPU_TARGET = 0.01  # of one core
P99_TARGET_MS = 50.0
PER_WORKER_MAX = 15_000  # Faces per load process at most (its own descriptors, its loop)
_TEXT = b'"text":"'
_decode = msgspec.json.decode
_encode = msgspec.json.encode


# -- the load process ------------------------------------------------------------


class IdleFace(asyncio.Protocol):
    """One Face: handshake, hello, welcome; then pongs. Server frames are
    unmasked; text frames are ignored unless the Face is watched."""

    __slots__ = ("buf", "pool", "transport", "upgraded", "watched", "welcomed")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.upgraded = False
        self.watched = False
        self.welcomed: asyncio.Future[None] | None = pool.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.pool.request + base64.b64encode(os.urandom(16)) + b"\r\n\r\n")

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.welcomed is not None:
            if not self.welcomed.done():
                self.welcomed.set_exception(ConnectionError(f"closed before welcome: {exc}"))
            self.welcomed = None
        else:
            self.pool.lost += 1

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if b" 101 " not in buf[: buf.find(b"\r\n")]:
                self._refused(bytes(buf[:200]))
                return
            del buf[: end + 4]
            self.upgraded = True
            self.send(self.pool.hello)
        n, pos = len(buf), 0
        while n - pos >= 2:
            length, start = buf[pos + 1] & 0x7F, pos + 2
            if length == 126:
                if n - pos < 4:
                    break
                length, start = (buf[pos + 2] << 8) | buf[pos + 3], pos + 4
            elif length == 127:
                if n - pos < 10:
                    break
                length, start = int.from_bytes(buf[pos + 2 : pos + 10], "big"), pos + 10
            end = start + length
            if end > n:
                break
            opcode = buf[pos] & 0x0F
            if opcode == 0x9 and self.transport is not None:
                self.pool.pings += 1
                self.transport.write(client_frame(bytes(buf[start:end]), 0xA))
            elif opcode == 0x1:
                self.text(buf, start, end)
            elif opcode == 0x8 and self.transport is not None:
                self.transport.close()
            pos = end
        if pos:
            del buf[:pos]

    def text(self, buf: bytearray, start: int, end: int) -> None:
        welcomed = self.welcomed
        if welcomed is not None:
            message = _decode(bytes(buf[start:end]))
            if message["type"] == "face.welcome":
                self.welcomed = None
                if not welcomed.done():  # else: given up on (timed out)
                    welcomed.set_result(None)
            elif message["type"] == "face.error":
                self._refused(bytes(buf[start:end]))
        elif self.watched:
            self.pool.watched_text(buf, start, end)

    def _refused(self, what: bytes) -> None:
        if self.welcomed is not None and not self.welcomed.done():
            self.welcomed.set_exception(ConnectionError(f"refused: {what[:200]!r}"))
        if self.transport is not None:
            self.transport.abort()

    def send(self, payload: bytes) -> None:
        if self.transport is not None:
            self.transport.write(client_frame(payload))


class Pool:
    """One load process's Faces, and the subscribed ones' latencies."""

    def __init__(self, host: str, port: int, path: str, token: str) -> None:
        self.loop = asyncio.get_running_loop()
        self.host, self.port = host, port
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                        "Sec-WebSocket-Key: ").encode()
        self.hello = _encode({"type": "face.hello",
                              "payload": {"token": token, "client": HELLO_CLIENT, "protocol": 3}})
        self.faces: list[IdleFace] = []
        self.failed: Counter[str] = Counter()
        self.lost = self.pings = self.attempts = 0
        self.watch: list[IdleFace] = []
        self.replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.latencies: list[int] = []
        self.stamping = False
        self.request_id = ""
        self.ends = 0
        self.ended: asyncio.Future[None] | None = None

    async def open(self, target: int, inflight: int, timeout: float) -> None:
        """Open Faces until ``target`` are held, ``inflight`` at a time."""
        todo = target - len(self.faces)
        failed_before = sum(self.failed.values())

        async def one() -> None:
            ip = SOURCE_IPS[self.attempts % len(SOURCE_IPS)]
            self.attempts += 1
            transport = None
            try:
                transport, f = await asyncio.wait_for(self.loop.create_connection(
                    lambda: IdleFace(self), self.host, self.port, local_addr=(ip, 0)), timeout)
                if f.welcomed is not None:
                    await asyncio.wait_for(f.welcomed, timeout)
                self.faces.append(f)
            except (OSError, TimeoutError) as exc:
                self.failed[type(exc).__name__ + (f" {exc.errno}" if isinstance(exc, OSError)
                                                  and exc.errno else "")] += 1
                if transport is not None:
                    transport.abort()

        counter = iter(range(todo))

        async def runner() -> None:
            for _ in counter:
                if sum(self.failed.values()) - failed_before > max(50, todo // 100):
                    return  # too many failures: stop this step, report it
                await one()

        await asyncio.gather(*(runner() for _ in range(min(inflight, max(1, todo)))))

    def held(self) -> int:
        return sum(1 for f in self.faces if f.transport is not None)

    async def subscribe(self, conversation_id: str, k: int) -> int:
        self.watch = [f for f in self.faces if f.transport is not None][:k]
        waits = []
        for f in self.watch:
            f.watched = True
            request_id = rid("sub")
            fut: asyncio.Future[dict[str, Any]] = self.loop.create_future()
            self.replies[request_id] = fut
            f.send(_encode({"type": "face.subscribe", "payload": {
                "request_id": request_id, "conversation_ids": [conversation_id]}}))
            waits.append(fut)
        replies = await asyncio.wait_for(asyncio.gather(*waits), 60)
        return sum(1 for r in replies if r["type"] == "face.accepted")

    def watched_text(self, buf: bytearray, start: int, end: int) -> None:
        if buf.startswith(DELTA_PREFIX, start, end):
            if self.stamping:  # a coalesced delta carries several stamps
                now = time.time_ns()
                i = buf.find(_TEXT, start, end) + len(_TEXT)
                j = buf.find(b'"', i, end)
                self.latencies.extend(now - int(s) for s in bytes(buf[i:j]).split())
            return
        message = _decode(bytes(buf[start:end]))
        payload = message.get("payload") or {}
        kind = message["type"]
        if kind in ("face.accepted", "face.error"):
            fut = self.replies.pop(str(payload.get("request_id")), None)
            if fut is not None and not fut.done():
                fut.set_result(message)
        elif (kind == "face.event" and payload.get("type") == "chat.completed"
              and (payload.get("data") or {}).get("request_id") == self.request_id):
            self.ends += 1
            if self.ends >= len(self.watch) and self.ended is not None and not self.ended.done():
                self.ended.set_result(None)

    def close(self) -> None:
        for f in self.faces:
            if f.transport is not None:
                f.transport.abort()


async def worker_main(deadline_s: float) -> None:
    raise_nofile(1 << 20)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pool: Pool | None = None

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    def status() -> dict[str, Any]:
        if pool is None:
            return {"held": 0, "lost": 0, "pings": 0, "failed": {}, "rss_kib": rss_kib(os.getpid())}
        return {"held": pool.held(), "lost": pool.lost, "pings": pool.pings,
                "failed": dict(pool.failed), "rss_kib": rss_kib(os.getpid()),
                "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}

    async def serve() -> None:
        nonlocal pool
        while line := await reader.readline():
            cmd = json.loads(line)
            op = cmd["op"]
            try:
                if op == "open":
                    if pool is None:
                        pool = Pool(cmd["host"], cmd["port"], cmd["path"], cmd["token"])
                    await pool.open(cmd["n"], cmd["inflight"], cmd["timeout"])
                    reply(status())
                elif op == "status":
                    reply(status())
                elif op == "subscribe":
                    assert pool is not None
                    reply({"subscribed": await pool.subscribe(cmd["conversation_id"], cmd["k"])})
                elif op == "arm":
                    assert pool is not None
                    pool.latencies, pool.stamping = [], True
                    pool.request_id, pool.ends = cmd["request_id"], 0
                    pool.ended = loop.create_future()
                    reply({"armed": True})
                    if pool.watch:
                        await asyncio.wait_for(pool.ended, cmd["timeout"])
                    reply({"ends": pool.ends,
                           "latencies_us": [x // 1000 for x in pool.latencies]})
                elif op == "close":
                    if pool is not None:
                        pool.close()
                    reply({"closed": True})
                    return
            except Exception as exc:  # reported to the parent, which raises it
                reply({"error": f"{type(exc).__name__}: {exc}"})
                return

    try:
        await asyncio.wait_for(serve(), deadline_s)
    finally:
        if pool is not None:
            pool.close()


# -- the benchmark ---------------------------------------------------------------


def mind_nofile(pid: int) -> tuple[int, int]:
    """The Mind's (soft, hard) RLIMIT_NOFILE, from /proc."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise RuntimeError("no 'Max open files' line")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class Load:
    """The parent's handle on the load processes."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    async def ask(self, timeout: float, cmds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for worker, cmd in zip(self.workers, cmds, strict=True):
            worker.send(**cmd)
        return list(await asyncio.gather(*(w.recv(timeout) for w in self.workers)))

    async def status(self) -> dict[str, Any]:
        replies = await self.ask(30, [{"op": "status"}] * len(self.workers))
        failed: Counter[str] = Counter()
        for r in replies:
            failed.update(r["failed"])
        return {"held": sum(r["held"] for r in replies), "lost": sum(r["lost"] for r in replies),
                "pings": sum(r["pings"] for r in replies), "failed": dict(failed),
                "rss_kib": sum(r["rss_kib"] for r in replies)}

    async def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                worker.send(op="close")
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.proc.wait(), 30)
            except TimeoutError:
                worker.proc.kill()
                await worker.proc.wait()


def shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def window(mind: MindServer, load: Load, n: int, base_util: float,
                 seconds: float) -> dict[str, Any]:
    """One heartbeat period of the Mind's CPU, then its RSS."""
    before = await load.status()
    with CpuWindow(mind.pid, load.pids) as w:
        await asyncio.sleep(seconds)
    after = await load.status()
    row = {"faces": n, "held": after["held"], "lost": after["lost"], "failed": after["failed"],
           "pings": after["pings"] - before["pings"], "rss_kib": rss_kib(mind.pid),
           "fds": open_fds(mind.pid), "load_rss_kib": after["rss_kib"], **w.as_dict()}
    if n:
        row["us_per_beat"] = w.server / n * 1e6
        row["us_per_beat_net"] = (w.server - base_util * w.wall) / n * 1e6
    return row


async def chat_round(mind: MindServer, load: Load, driver: WsClient, conversation_id: str,
                     count: int, timeout: float) -> dict[str, Any]:
    request_id = rid("chat")
    await load.ask(30, [{"op": "arm", "request_id": request_id, "timeout": timeout}]
                   * len(load.workers))
    with CpuWindow(mind.pid, load.pids) as w:
        sent = time.perf_counter()
        driver.send("face.chat", {"request_id": request_id, "conversation_id": conversation_id,
                                  "content": f"/stamp {count}"})
        reports = await asyncio.gather(*(wk.recv(timeout + 10) for wk in load.workers))
        result = await driver.expect(is_reply(request_id, "face.result", "face.error"), 60)
        chat_s = time.perf_counter() - sent
    if result["type"] != "face.result" or result["payload"].get("status") != "succeeded":
        raise RuntimeError(f"chat failed: {result}")
    lat = sorted(x for r in reports for x in r["latencies_us"])
    return {"count": count, "ends": sum(r["ends"] for r in reports), "samples": len(lat),
            "p50_ms": percentile(lat, 50) / 1e3, "p99_ms": percentile(lat, 99) / 1e3,
            "max_ms": lat[-1] / 1e3 if lat else float("nan"), "chat_s": chat_s,
            "deltas_per_s": count / chat_s, **w.as_dict()}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ports = [int(x) for x in f.read().split()]
    raise_nofile(1 << 20)
    facts: dict[str, Any] = {
        "nofile_before": [soft, hard], "nofile_now": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "port_range": ports, "ports_per_source": ports[1] - ports[0] + 1,
        "source_ips": len(SOURCE_IPS), "cpus": os.cpu_count()}
    print(f"RLIMIT_NOFILE here: soft {soft:,}, hard {hard:,} (raised to "
          f"{facts['nofile_now']:,}); ephemeral ports {ports[0]}-{ports[1]} "
          f"({facts['ports_per_source']:,} per source address, {len(SOURCE_IPS)} addresses)",
          flush=True)
    out: dict[str, Any] = {"facts": facts, "steps": [], "rounds": []}
    with workdir("halfpi-idle100k-") as tmp:
        mind = MindServer(tmp / "mind", delta_ms=args.delta_ms).start()
        load = Load([])
        clients: list[WsClient] = []
        try:
            url = mind.url
            host_port, _, path = url.split("://", 1)[1].partition("/")
            host, _, port = host_port.rpartition(":")
            token = mind.token
            driver = await face(url, token)
            clients.append(driver)
            conversation_id = await create_conversation(driver, "idle-100k")
            m_soft, m_hard = mind_nofile(mind.pid)
            ceiling = (m_soft - open_fds(mind.pid) - FD_MARGIN) // 100 * 100
            facts.update(mind_nofile=[m_soft, m_hard], mind_fds_at_start=open_fds(mind.pid),
                         ceiling=ceiling)
            steps = sorted({s for s in args.steps if s < args.faces} | {args.faces})
            why = ""
            if args.faces > ceiling:
                why = (f"the Mind's RLIMIT_NOFILE is {m_soft:,} (hard {m_hard:,}; not raisable "
                       f"here) and it holds {open_fds(mind.pid)} files already: at most "
                       f"{ceiling:,} Faces (a margin of {FD_MARGIN} kept)")
                steps = [s for s in steps if s < ceiling] + [ceiling]
            facts["cut"] = why
            print(f"Mind pid {mind.pid}: RLIMIT_NOFILE {m_soft:,} (hard {m_hard:,}); steps "
                  f"{', '.join(f'{s:,}' for s in steps)}" + (f"\n  cut: {why}" if why else ""),
                  flush=True)
            procs = max(args.procs, math.ceil(max(steps) / PER_WORKER_MAX))
            remaining = args.budget - (time.monotonic() - started)
            for _ in range(procs):
                proc = await asyncio.create_subprocess_exec(
                    PYTHON, __file__, "--worker", "--deadline", f"{remaining:.0f}",
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    limit=64 * 1024 * 1024)
                load.workers.append(Worker(proc))
            await asyncio.sleep(1.0)
            base = await window(mind, load, 0, 0.0, args.window)
            base_util = base["server_util"]
            out["baseline"] = base
            print(f"0 idle Faces: Mind {base_util:.2%} of a core, RSS {base['rss_kib'] / 1024:.1f} "
                  f"MiB (rest of the machine {base['others_util']:.0%})", flush=True)
            for n in steps:
                left = args.budget - (time.monotonic() - started) - 90  # the chat and the close
                if left < args.window + 30:
                    facts["cut"] += f"; stopped before {n:,}: out of time"
                    break
                t0 = time.perf_counter()
                cmds = [{"op": "open", "host": host, "port": int(port), "path": "/" + path,
                         "token": token, "n": k, "inflight": args.inflight, "timeout": 20.0}
                        for k in shares(n, procs)]
                await load.ask(left - args.window, cmds)
                connect_s = time.perf_counter() - t0
                await asyncio.sleep(1.0)
                row = await window(mind, load, n, base_util, args.window)
                row["connect_s"] = connect_s
                out["steps"].append(row)
                print(f"{row['held']:,} Faces held (target {n:,}) in {connect_s:.1f} s: Mind "
                      f"{row['server_util']:.2%} of a core, RSS {row['rss_kib'] / 1024:.1f} MiB, "
                      f"{row['fds']:,} files, {row['pings'] / max(1, row['held']):.2f} pings/Face "
                      f"in {row['wall_s']:.1f} s, load {row['load_util']:.0%}, rest "
                      f"{row['others_util']:.0%}, lost {row['lost']}, failed {row['failed']}",
                      flush=True)
                if row["held"] < n:
                    facts["cut"] += f"; {n:,} not reached: {row['held']:,} held"
                    break
            k_total = min(args.subscribers, out["steps"][-1]["held"]) if out["steps"] else 0
            subs = await load.ask(60, [{"op": "subscribe", "conversation_id": conversation_id,
                                        "k": k} for k in shares(k_total, procs)])
            out["subscribed"] = sum(r["subscribed"] for r in subs)
            timeout = 30 + args.count * args.delta_ms / 1000 * 3
            await chat_round(mind, load, driver, conversation_id, 20, timeout)  # warm-up
            for _ in range(args.rounds):
                r = await chat_round(mind, load, driver, conversation_id, args.count, timeout)
                out["rounds"].append(r)
                print(f"/stamp {args.count} to {out['subscribed']:,} of "
                      f"{out['steps'][-1]['held']:,}: p50 {r['p50_ms']:.2f} ms, p99 "
                      f"{r['p99_ms']:.2f} ms, max {r['max_ms']:.1f} ms, {r['samples']:,} samples, "
                      f"{r['deltas_per_s']:.0f} deltas/s, Mind {r['server_util']:.0%}",
                      flush=True)
        finally:
            await load.close()
            await close_all(clients)
            await stop_all(mind)
    out["elapsed_s"] = time.monotonic() - started
    return out


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    base = out["baseline"]
    rows = [["0", "—", f"{base['rss_kib'] / 1024:.1f}", "—", "—", f"{base['server_util']:.2%}",
             "—", "—", "—", f"{base['others_util']:.0%}"]]
    for s in out["steps"]:
        n = s["held"]
        rows.append([f"{n:,}", f"{s['connect_s']:.0f}", f"{s['rss_kib'] / 1024:.1f}",
                     f"{(s['rss_kib'] - base['rss_kib']) / n:.2f}",
                     f"{s['pings'] / n:.2f}", f"{s['server_util']:.2%}",
                     f"{s['us_per_beat']:.1f}", f"{s['us_per_beat_net']:.1f}",
                     f"{s['load_util']:.0%}", f"{s['others_util']:.0%}"])
    print()
    print(table(["idle Faces", "connect s", "Mind RSS MiB", "KiB/Face", "pings/Face",
                 "Mind CPU", "µs/beat", "µs/beat net", "load CPU", "rest"], rows,
                f"The Mind holding idle Faces: RSS, and CPU over {args.window:g} s"))
    print("  KiB/Face: (RSS - RSS with 0 Faces) / Faces; µs/beat: the window's Mind CPU / Faces "
          "(one heartbeat each); net: minus the 0-Face window's rate")
    rounds = out["rounds"]
    if rounds:
        pooled = [r["p99_ms"] for r in rounds]
        print()
        print(table(["round", "p50 ms", "p99 ms", "max ms", "samples", "deltas/s",
                     "deliveries/s", "Mind CPU", "rest"],
                    [[str(i + 1), f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['max_ms']:.1f}",
                      f"{r['samples']:,}", f"{r['deltas_per_s']:.0f}",
                      f"{r['deltas_per_s'] * out['subscribed']:,.0f}", f"{r['server_util']:.0%}",
                      f"{r['others_util']:.0%}"] for i, r in enumerate(rounds)],
                    f"/stamp {args.count} to {out['subscribed']:,} subscribed of "
                    f"{out['steps'][-1]['held']:,} held Faces, --delta-ms {args.delta_ms:g}"))
        print(f"  p99 median of rounds {median(pooled):.2f} ms (spread {min(pooled):.2f}.."
              f"{max(pooled):.2f}); target < {P99_TARGET_MS:g} ms: "
              f"{'met' if median(pooled) < P99_TARGET_MS else 'MISSED'}")
    if not out["steps"]:
        return
    top = out["steps"][-1]
    n = top["held"]
    kib = (top["rss_kib"] - base["rss_kib"]) / n
    beat = top["us_per_beat"]
    net = top["us_per_beat_net"]
    print()
    print(f"Largest step reached: {n:,} Faces" + (f" ({out['facts']['cut'].lstrip('; ')})"
                                                   if out["facts"].get("cut") else ""))
    print(f"  at {n:,}: RSS {top['rss_kib'] / 1024:.0f} MiB (target ≤ 1 GiB at {args.faces:,}), "
          f"CPU {top['server_util']:.2%} of a core (target < {CPU_TARGET:.0%})")
    at = args.faces
    rss_at = base["rss_kib"] + kib * at
    cpu_at = base["server_util"] + net * 1e-6 * at / HEARTBEAT_S
    print(f"  extrapolated to {at:,} (linear in Faces): RSS ≈ {rss_at / 1024:.0f} MiB "
          f"({'within' if rss_at <= RSS_TARGET_KIB else 'over'} 1 GiB), CPU ≈ {cpu_at:.1%} "
          f"of a core ({'under' if cpu_at < CPU_TARGET else 'over'} 1 %)")
    print(f"  idle Faces one core holds at the {HEARTBEAT_S:g} s heartbeat: "
          f"{HEARTBEAT_S / (net * 1e-6):,.0f} at 100 % of it (net {net:.1f} µs per beat), "
          f"{(CPU_TARGET - base['server_util']) * HEARTBEAT_S / (net * 1e-6):,.0f} within 1 % "
          f"(after the {base['server_util']:.2%} baseline); 1 GiB of RSS holds "
          f"{RSS_TARGET_KIB / kib:,.0f} at {kib:.2f} KiB each; total {beat:.1f} µs per beat")
    print("  for scale: 1,000,000 connections on ~40 CPUs is 25,000 per CPU (a published "
          "figure of another server, under its own load and hardware; not an idle measurement)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faces", type=int, default=100_000, help="the top step")
    parser.add_argument("--steps", type=int, nargs="+", default=[10_000, 25_000, 50_000])
    parser.add_argument("--procs", type=int, default=4, help="load processes (at least)")
    parser.add_argument("--inflight", type=int, default=64,
                        help="connections opening at once per load process (the Mind displaces "
                        "the oldest unauthenticated beyond 256 per source address)")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--count", type=int, default=200, help="deltas per chat (/stamp N)")
    parser.add_argument("--delta-ms", type=float, default=20.0,
                        help="the scripted agent's sleep between deltas")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=660.0, help="seconds, all included")
    parser.add_argument("--window", type=float, default=HEARTBEAT_S,
                        help="seconds of each CPU window (one heartbeat period)")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=900.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        with contextlib.suppress(TimeoutError, KeyboardInterrupt):
            asyncio.run(worker_main(args.deadline))
        return
    out = asyncio.run(run(args))
    report(out, args)
    print(f"\n({out['elapsed_s']:.0f} s in all)")
    write_json(args.json, [], {"bench": "idle_100k", **out})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
