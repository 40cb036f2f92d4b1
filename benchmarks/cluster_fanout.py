"""Cluster fan-out: one conversation's chat, owned by node A, streamed to 100
Faces on other nodes, against raw Redis streams doing the same delivery.

Servers, all on this machine: a throw-away PostgreSQL with its default
durability (``fsync``, ``synchronous_commit`` on) and a throw-away
redis-server without persistence (the tests' helpers,
``tests/support/postgres.py`` and ``tests/support/redis.py``), and three
``halfpi mind`` nodes ``a``, ``b``, ``c`` (real processes, ``--store
postgresql://… --redis redis://… --node-id …``; the Face credential made
once with ``halfpi face add --store …``), the scripted agent at full speed
(``HALFPI_SCRIPTED_DELTA_MS=0``).

- **(a) baseline, raw Redis**: one client appends N entries to one stream
  with pipelined ``XADD … MAXLEN ~ 10000`` (256 per round trip, pre-encoded,
  each entry the size of the Mind's own journal entries; 10,000 entries per
  round, as the Mind's rounds last 10-50 times longer), while 100
  readers in load processes follow it with ``XREAD BLOCK 0`` (``_xread.py``:
  raw RESP, a reply known complete from its entry count, only the last id
  checked). Delivered entries/s = N x 100 / (first XADD sent → last entry read
  by the last reader).
- **(b) halfpi**: a driver Face on node A (the conversation's owner) sends
  ``face.chat`` with ``/repeat N x``; 100 subscribed Faces, half on B, half
  on C, count the deltas they receive (``_load.py``'s load processes).
  Delivered deltas/s over the whole chat: ``face.chat`` sent →
  ``face.result`` on A and ``chat.completed`` on every subscriber. Target
  ≥ 0.5x (a).
- **(c) scaling**: the same chat with the 100 subscribers on A alone (no
  hop between nodes), on B alone, on B and C (= (b)), on A, B and C.
- **single node**, for reference: the same chat to 100 Faces of one plain
  ``halfpi mind`` (SQLite, the in-process journal), what ``fanout.py``
  measures; and (b) against it: what cluster mode costs on one machine.

Each spread has its own conversation (created on A), every side stays
connected, and the order of the sides rotates round by round, 5 rounds
each. CPU is read per process from /proc: each node, Redis, every
PostgreSQL process, every load process and this one (the driver or the
publisher), as shares of one core. A round is refused when a load process
saturated (≥ 85 % of a core). On a machine of 2 cores three nodes, Redis,
PostgreSQL and the load share them: the figures say what one machine does,
not what a cluster of machines would.

(b) and (c) need the multi-node Mind (conversation leases, forwarding and
the fan-out between nodes over Redis; docs/cluster.md): with a halfpi whose
``halfpi mind`` lacks ``--lease-ms`` they are skipped (``--parts``).

    python benchmarks/cluster_fanout.py [--quick] [--rounds R] [--deltas N]
                                        [--parts baseline cluster] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _bench import (
    HOST,
    MindServer,
    cpu_seconds,
    figure,
    machine_busy_seconds,
    median,
    raise_nofile,
    saturation,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import WsClient, close_all, create_conversation, face, is_reply, rid
from _cluster import (
    ClusterNode,
    PgCpu,
    create_database,
    face_add,
    mind_flags,
    missing,
    start_postgres,
    start_redis,
    stop_cleanly_on_sigterm,
    stop_redis,
)
from _load import LoadPool
from _xread import SEQ_BASE, XreadPool, xadds

from halfpi.journal.redis import stream_key

FACES = 100
DELTAS = 3_000  # per round: ~300,000 deliveries to 100 Faces
# Raw Redis delivers far faster: more entries per round, for rounds of a
# measurable length (at most the stream's MAXLEN, so that no reader can lag
# past the trimmed end).
BASE_ENTRIES = 10_000
READ_PAUSE_S = 0.02  # as fanout.py at 100 Faces: one recv() carries many frames
PROCS = 4  # load processes for 100 subscribers, split over their nodes
XADD_BATCH = 256
MAXLEN = 10_000  # the Redis journal's retention (journal.events)
LEASE_MS = 2_000
TARGET = 0.5
CPU_TARGET = 1.1  # serving CPU per delivery, cluster against one plain Mind
DEFAULT_VALUE_BYTES = 150  # the journal entry of a delta when no Mind ran to measure it
# The subscribers' spreads: node names; "b+c" is (b).
SPREADS = {"a": ("a",), "b": ("b",), "b+c": ("b", "c"), "a+b+c": ("a", "b", "c"),
           "single": ("a",)}  # "single": one plain halfpi mind (SQLite), for reference
MAIN_SPREAD = "b+c"


class Window:
    """Wall time and CPU over one round: each server process (nodes, Redis),
    every PostgreSQL process, each load process and this one, and the rest
    of the machine."""

    def __init__(self, servers: dict[str, int], pg: PgCpu | None, load_pids: list[int]) -> None:
        self.servers = servers
        self.pg = pg
        self.load_pids = load_pids

    def __enter__(self) -> Window:
        self._servers = {k: cpu_seconds(p) for k, p in self.servers.items()}
        self._pg = self.pg.snapshot() if self.pg else {}
        self._loads = [cpu_seconds(p) for p in self.load_pids]
        self._self = time.process_time()
        self._machine = machine_busy_seconds()
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = self.wall = time.perf_counter() - self._wall
        self.server_cpu = {k: cpu_seconds(p) - self._servers[k] for k, p in self.servers.items()}
        self.pg_cpu = PgCpu.used(self._pg, self.pg.snapshot()) if self.pg else 0.0
        self.loads = [cpu_seconds(p) - c for p, c in zip(self.load_pids, self._loads, strict=True)]
        self.loads.append(time.process_time() - self._self)
        used = sum(self.server_cpu.values()) + self.pg_cpu + sum(self.loads)
        self.others = max(0.0, machine_busy_seconds() - self._machine - used)
        self.util = {k: v / wall for k, v in self.server_cpu.items()}

    def server_us(self, events: int, *, with_self: bool = False) -> float:
        """CPU of the serving side per delivered event, µs: the servers and
        PostgreSQL (and this process, when it is the raw publisher)."""
        cpu = sum(self.server_cpu.values()) + self.pg_cpu + (self.loads[-1] if with_self else 0)
        return cpu / max(1, events) * 1e6

    def as_dict(self) -> dict[str, Any]:
        wall = self.wall
        busiest = max(self.util.values())
        load_max = max(self.loads) / wall
        nodes = sum(v for k, v in self.util.items() if k != "redis")
        return {
            "wall_s": wall,
            "util": self.util,
            "server_util": busiest,  # the busiest server process (each is one loop)
            "nodes_util": nodes,
            "redis_util": self.util.get("redis", 0.0),
            "pg_util": self.pg_cpu / wall,
            "load_util": sum(self.loads) / wall,
            "load_max": load_max,
            "load_procs": len(self.loads),
            "others_util": self.others / wall,
            # Only a saturated load process refuses a round here: the servers
            # are several processes sharing two cores with the load.
            "saturated": saturation(busiest, load_max),
        }


# -- (a) raw Redis ---------------------------------------------------------------------


class RedisSide:
    name = "raw redis"

    def __init__(self, redis_port: int, redis_pid: int, faces: int, key: str) -> None:
        self.port = redis_port
        self.redis_pid = redis_pid
        self.faces = faces
        self.key = key
        self.last = SEQ_BASE
        self.pool = XreadPool(PROCS)
        self.publisher: Any = None

    async def connect(self) -> RedisSide:
        from _xread import Publisher

        loop = asyncio.get_running_loop()
        _, self.publisher = await loop.create_connection(Publisher, HOST, self.port)
        await self.pool.connect(HOST, self.port, self.key, self.faces)
        return self

    async def round(self, count: int, value_bytes: int) -> dict[str, Any]:
        pipelines = xadds(self.key.encode(), self.last + 1, count, b"x" * value_bytes, MAXLEN,
                          XADD_BATCH)
        await self.pool.arm(self.last, count, value_bytes)
        with Window({"redis": self.redis_pid}, None, self.pool.pids) as window:
            sent = time.time_ns()
            for commands, reply_bytes in pipelines:
                await self.publisher.send(commands, reply_bytes)
            subs = await self.pool.collect()
        self.last += count
        seconds = max(1e-9, (subs["last_ns"] - sent) / 1e9)
        return {"events": subs["events"], "expected": count * self.faces,
                "chat_eps": subs["events"] / seconds, "chat_s": seconds,
                "server_us": window.server_us(subs["events"], with_self=True),
                **window.as_dict()}

    async def close(self) -> None:
        await self.pool.close()
        if self.publisher is not None and self.publisher.transport is not None:
            self.publisher.transport.close()


# -- (b), (c) the cluster --------------------------------------------------------------


class ClusterSide:
    """A driver Face on node A and the subscribers of one spread."""

    def __init__(self, spread: str, nodes: dict[str, Any], redis_pid: int,
                 pg: PgCpu | None) -> None:
        self.name = f"halfpi {spread}"
        self.spread = spread
        self.nodes = nodes
        self.redis_pid = redis_pid
        self.pg = pg
        self.pools: list[LoadPool] = []
        self.driver: WsClient | None = None
        self.conversation_id = ""

    async def connect(self, faces: int) -> ClusterSide:
        a = self.nodes["a"]
        self.driver = await face(a.url, a.token)
        self.conversation_id = await create_conversation(self.driver, f"cluster-{self.spread}")
        # The driver follows the conversation first (reliable events only, no
        # deltas), so that A takes its lease and owns it, as (b) says: else
        # the first node a subscriber reached would own it.
        request_id = rid("sub")
        self.driver.send("face.subscribe", {"request_id": request_id,
                                            "conversation_ids": [self.conversation_id],
                                            "transient_types": []})
        reply = await self.driver.expect(is_reply(request_id, "face.accepted", "face.error"))
        if reply["type"] != "face.accepted":
            raise RuntimeError(f"{self.name}: the driver's subscribe failed: {reply}")
        names = SPREADS[self.spread]
        procs = max(1, PROCS // len(names))
        for i, name in enumerate(names):
            n = faces // len(names) + (1 if i < faces % len(names) else 0)
            node = self.nodes[name]
            pool = await LoadPool(procs).connect(
                "mind", node.url, n, token=node.token, conversation_id=self.conversation_id,
                read_pause=READ_PAUSE_S,
            )
            self.pools.append(pool)
        return self

    async def round(self, count: int, _value_bytes: int = 0) -> dict[str, Any]:
        assert self.driver is not None
        request_id = rid("chat")
        for pool in self.pools:
            await pool.arm(request_id)
        servers = {name: node.pid for name, node in self.nodes.items()}
        servers["redis"] = self.redis_pid
        load_pids = [pid for pool in self.pools for pid in pool.pids]
        with Window(servers, self.pg, load_pids) as window:
            sent = time.time_ns()
            self.driver.send("face.chat", {"request_id": request_id,
                                           "conversation_id": self.conversation_id,
                                           "content": f"/repeat {count} x"})
            reports = [await pool.collect() for pool in self.pools]
            result = await self.driver.expect(is_reply(request_id, "face.result", "face.error"),
                                              120)
        if result["type"] != "face.result" or result["payload"]["status"] != "succeeded":
            raise RuntimeError(f"{self.name}: chat failed: {result}")
        events = sum(r["events"] for r in reports)
        end = max(result["_at"], *(r["end_ns"] for r in reports))
        seconds = max(1e-9, (end - sent) / 1e9)
        stream_s = max(1e-9, (max(r["last_ns"] for r in reports)
                              - min(r["first_ns"] for r in reports)) / 1e9)
        n = sum(sum(pool.sizes) for pool in self.pools)
        return {"events": events, "expected": count * n, "chat_eps": events / seconds,
                "stream_eps": events / stream_s, "chat_s": seconds,
                "coalesced": sum(r["coalesced"] for r in reports),
                "server_us": window.server_us(events), **window.as_dict()}

    async def close(self) -> None:
        for pool in self.pools:
            await pool.close()
        if self.driver is not None:
            await close_all([self.driver])


async def journal_entry_bytes(redis_url: str, conversation_id: str) -> int:
    """The size of the Mind's journal entry for one delta (Redis stream
    ``halfpi:j:{C}``, field ``e``): the baseline appends entries of that size."""
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        entries = await client.xrevrange(stream_key(conversation_id), count=20)
    finally:
        await client.aclose()
    sizes = sorted(len(fields[b"e"]) for _, fields in entries if b"e" in fields)
    return sizes[len(sizes) // 2] if sizes else DEFAULT_VALUE_BYTES


async def start_cluster(tmp: Path, pg: Any, redis_url: str, lease_ms: int | None,
                        nodes: dict[str, ClusterNode]) -> None:
    """Nodes a, b, c into ``nodes`` as each one starts (the caller stops them)."""
    store_url = await create_database(pg, "halfpi_cluster")
    token = await asyncio.to_thread(face_add, store_url, "bench", tmp / "cli")
    for name in ("a", "b", "c"):  # one after the other: the first creates the schema
        node = ClusterNode(tmp / f"node-{name}", node_id=name, store_url=store_url,
                           redis_url=redis_url, token=token, delta_ms=0, lease_ms=lease_ms)
        nodes[name] = node
        await asyncio.to_thread(node.start)


def cluster_supported() -> bool:
    """The multi-node Mind is in this halfpi (its ``--lease-ms`` flag)."""
    return "--lease-ms" in mind_flags()


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    raise_nofile(8192)
    runs: dict[str, list[dict[str, Any]]] = {}
    value_bytes = DEFAULT_VALUE_BYTES
    with workdir("halfpi-cluster-fanout-") as tmp:
        pg = start_postgres(durable=True)
        redis = start_redis()
        nodes: dict[str, ClusterNode] = {}
        single: MindServer | None = None
        sides: list[Any] = []
        try:
            assert redis.proc is not None
            if "cluster" in args.parts:
                await start_cluster(tmp, pg, redis.url, LEASE_MS if args.lease_flag else None,
                                    nodes)
                for spread in args.spreads:
                    if spread == "single":  # the embedded Mind: SQLite, in-process journal
                        single = await asyncio.to_thread(
                            MindServer(tmp / "single", delta_ms=0).start)
                        side = ClusterSide(spread, {"a": single}, redis.proc.pid, None)
                    else:
                        side = ClusterSide(spread, nodes, redis.proc.pid, PgCpu(pg))
                    sides.append(await side.connect(args.faces))
                for side in sides:  # warm-up; the Mind's journal entry size
                    await side.round(max(200, args.deltas // 4))
                in_redis = [s for s in sides if s.spread != "single"]
                if in_redis:
                    value_bytes = await journal_entry_bytes(redis.url,
                                                            in_redis[0].conversation_id)
            if "baseline" in args.parts:
                port = urlsplit(redis.url).port
                assert port is not None
                base = await RedisSide(port, redis.proc.pid, args.faces, "bench:raw").connect()
                sides.insert(0, base)
                await base.round(max(200, args.base_entries // 4), value_bytes)
            for side in sides:
                runs[side.name] = []
            for index in range(args.rounds):
                shift = index % len(sides)
                for side in sides[shift:] + sides[:shift]:
                    count = args.base_entries if isinstance(side, RedisSide) else args.deltas
                    try:
                        result = await side.round(count, value_bytes)
                    except Exception as exc:
                        raise RuntimeError(f"{side.name}, round {index + 1}: {exc}") from exc
                    if result["events"] != result["expected"]:
                        print(f"warning: {side.name}: {result['events']:,} events delivered, "
                              f"{result['expected']:,} expected", file=sys.stderr)
                    runs[side.name].append(result)
        finally:
            for side in sides:
                await side.close()
            await stop_all(*nodes.values(), *([single] if single else []))
            stop_redis(redis)
            pg.stop()
    return report(runs, args, value_bytes)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace,
           value_bytes: int) -> list[dict[str, Any]]:
    rows = []
    for name, results in runs.items():
        for i, x in enumerate(results):
            per_node = " ".join(f"{k} {_pct(v)}" for k, v in x["util"].items())
            rows.append([f"{name} #{i + 1}", x["chat_eps"], x["chat_s"], x["server_us"], per_node,
                         _pct(x["pg_util"]), _pct(x["load_util"]), _pct(x["load_max"]),
                         x["saturated"], _pct(x["others_util"])])
    print(table(["round", "delivered ev/s", "s", "serving µs/ev", "CPU per server",
                 "CPU PostgreSQL", "CPU load", "busiest load", "saturated", "rest"], rows,
                f"Cluster fan-out rounds ({args.faces} subscribers; {args.deltas:,} deltas per "
                f"chat, raw Redis {args.base_entries:,} entries per round; CPU: share of one core; "
                f"load = load processes and this one; "
                f"rest = the rest of the machine)"))
    base = runs.get("raw redis")
    summary = []
    if base and not any(f"halfpi {s}" in runs for s in args.spreads):  # the baseline alone
        summary.append(figure(
            "cluster_fanout", f"raw Redis: pipelined XADD → {args.faces} XREAD BLOCK readers",
            "events/s", base, None, "chat_eps",
            note=f"{args.base_entries:,} entries of {value_bytes} B per round; {XADD_BATCH} XADD "
                 f"per round trip; {len(base[0]['util'])} server process (redis-server)",
        ))
    for spread in args.spreads:
        ours = runs.get(f"halfpi {spread}")
        if not ours:
            continue
        main = spread == MAIN_SPREAD
        names = "+".join(s.upper() for s in SPREADS[spread])
        metric = (f"cluster fan-out, owner A, {args.faces} Faces on {names}"
                  + ("" if main else " (scaling)"))
        if spread == "single":
            names = "single node"
            metric = f"single node (SQLite, in-process journal), {args.faces} Faces"
        nodes_cpu = median([r["nodes_util"] for r in ours])
        summary.append(figure(
            "cluster_fanout", metric, "events/s", ours, base, "chat_eps",
            target=f"≥ {TARGET:g}x raw Redis" if main and base else "",
            judge=(lambda _m, ratio: None if ratio is None else ratio >= TARGET)
            if main and base else None,
            note=f"whole chat; {args.deltas:,} deltas per round, raw Redis {args.base_entries:,} "
                 f"entries of {value_bytes} B; nodes' CPU together {nodes_cpu:.0%}, Redis "
                 f"{median([r['redis_util'] for r in ours]):.0%}, PostgreSQL "
                 f"{median([r['pg_util'] for r in ours]):.0%}; delta stream "
                 f"{median([r['stream_eps'] for r in ours]):,.0f} events/s"
                 + (f"; coalesced frames {sum(r['coalesced'] for r in ours)}"
                    if any(r["coalesced"] for r in ours) else ""),
        ))
        summary.append(figure(
            "cluster_fanout", f"serving CPU per delivered event, {names}", "µs", ours, base,
            "server_us", lower_is_better=True, refuse_when_load_bound=False,
            note=("halfpi: the Mind" if spread == "single"
                  else "halfpi: the three nodes, Redis and PostgreSQL")
            + "; raw: Redis and the publisher",
        ))
    alone, spread_out = runs.get("halfpi single"), runs.get(f"halfpi {MAIN_SPREAD}")
    if alone and spread_out:
        summary.append(figure(
            "cluster_fanout", f"cluster (Faces on B+C) / single node, {args.faces} Faces",
            "events/s", spread_out, alone, "chat_eps",
            note="what cluster mode costs on one machine: the same chat to the same Faces",
        ))
        summary.append(figure(
            "cluster_fanout",
            f"serving CPU per delivery, cluster (Faces on B+C) / single node, {args.faces} Faces",
            "µs", spread_out, alone, "server_us", lower_is_better=True,
            refuse_when_load_bound=False, target=f"≤ {CPU_TARGET:g}x single node",
            judge=lambda _m, ratio: None if ratio is None else ratio <= CPU_TARGET,
            note="paired round by round: the three nodes, Redis and PostgreSQL against the "
                 "plain Mind, the same chat to the same Faces",
        ))
    print()
    print(summary_table(summary, "Cluster fan-out summary (medians; ratio = median of per-round "
                                 "ratios against raw Redis, same run)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per side")
    parser.add_argument("--quick", action="store_true", help="a third of the work, 3 rounds")
    parser.add_argument("--faces", type=int, default=FACES)
    parser.add_argument("--deltas", type=int, default=DELTAS, help="events per round")
    parser.add_argument("--base-entries", type=int, default=BASE_ENTRIES,
                        help="raw Redis entries per round (at most 10,000, the MAXLEN)")
    parser.add_argument("--parts", nargs="+", choices=("baseline", "cluster"),
                        default=["baseline", "cluster"])
    parser.add_argument("--spreads", nargs="+", choices=tuple(SPREADS), default=list(SPREADS),
                        help="where the subscribers are: a (the owner), b, b+c, a+b+c")
    parser.add_argument("--force", action="store_true",
                        help="run the cluster part even if halfpi mind has no --lease-ms")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.deltas = max(200, args.deltas // 3)
        args.base_entries = max(200, args.base_entries // 3)
        args.rounds = min(args.rounds, 3)
    stop_cleanly_on_sigterm()
    why = missing()
    if why is not None:
        sys.exit(f"cluster_fanout: {why}")
    args.lease_flag = cluster_supported()
    if "cluster" in args.parts and not args.lease_flag and not args.force:
        print("cluster_fanout: this halfpi has no multi-node Mind (halfpi mind --lease-ms): "
              "measuring the baseline only", file=sys.stderr)
        args.parts = [p for p in args.parts if p != "cluster"]
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "cluster_fanout"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
