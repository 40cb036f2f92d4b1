"""Model streaming: what a subscribed Face receives through halfpi, against
the same stream read directly with the ``openai`` SDK.

A fake OpenAI-compatible model server (``tests/support/fake_openai.py``,
real HTTP, its own process) answers ``/stamp N [MS]``: N chunks, each
carrying its send time in ns as its text, MS ms apart (none: as fast as it
writes). Two sides, alternating round by round in the same run:

- **halfpi**: ``halfpi mind --agent openai`` (HOME/agent.toml) pointed at the
  fake server; a driver Face sends ``face.chat``; another Face, subscribed
  to the conversation, receives the deltas (``_client.WsClient``).
- **direct**: this process reads the same request with the ``openai`` SDK
  (``AsyncOpenAI``, ``stream=True``, its typed chunks), as a program
  talking to the model itself would.
- **lean**: this process reads it as the Mind's provider does — the SDK's
  raw event stream (``with_streaming_response``) decoded by
  ``halfpi.agents.completions`` — so halfpi against it is the cost of the
  Mind's hop alone (the actor, the journal, the Face's connection).

Figures:

- **tokens/s**, 20,000 chunks sent as fast as the server writes them:
  tokens over the time from the first token's arrival to the last's, at the
  Face (halfpi) or in the reader (direct, lean). Target ≥ 0.8x direct.
- **added latency per token**: 400 chunks at 200/s; each token's arrival
  minus its send time, at both ends; the Mind's added latency is halfpi's
  percentile minus the reader's, per round. Target p99 < 2 ms.

    python benchmarks/model_stream.py [--quick] [--rounds N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import openai
from _bench import (
    PYTHON,
    CpuWindow,
    MindServer,
    Server,
    figure,
    median,
    percentile,
    stop_all,
    summary_table,
    table,
    workdir,
    write_json,
)
from _client import WsClient, create_conversation, face, is_reply, rid, subscribe

from halfpi.agents.completions import DONE, EventStream, decode_chunk

MODEL = "fake-model"
FAST_CHUNKS = 20_000
PACED_CHUNKS = 400
PACE_MS = 5.0
THROUGHPUT_TARGET = 0.8
CHAT_ENDS = ("chat.completed", "chat.failed", "chat.cancelled", "chat.interrupted")
ADDED_P99_TARGET_MS = 2.0
AGENT_TOML = """\
agent = "openai"
[openai]
model = "{model}"
base_url = "{base_url}"
system_prompt = ""
tools = []
retries = 0
"""


class FakeModelServer(Server):
    """``python -m tests.support.fake_openai`` (it prints ``{"port", "url"}``)."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        super().__init__([PYTHON, "-m", "tests.support.fake_openai"], env, workdir / "fake.log")


class Halfpi:
    """The Mind, a driver Face, and a subscribed Face that counts."""

    name = "halfpi"

    def __init__(self, mind: MindServer, driver: WsClient, watcher: WsClient, cid: str) -> None:
        self.mind, self.driver, self.watcher, self.cid = mind, driver, watcher, cid

    @classmethod
    async def start(cls, tmp: Path, base_url: str) -> Halfpi:
        home = tmp / "mind"
        home.mkdir(parents=True)
        (home / "agent.toml").write_text(AGENT_TOML.format(model=MODEL, base_url=base_url))
        mind = MindServer(home, delta_ms=0).start()
        driver = await face(mind.url, mind.token)
        cid = await create_conversation(driver, "model-stream")
        watcher = await face(mind.url, mind.token)
        await subscribe(watcher, cid)
        return cls(mind, driver, watcher, cid)

    async def round(self, content: str, latency: bool, fake_pid: int) -> dict[str, Any]:
        watcher = self.watcher
        watcher.reset_counters()
        watcher.latencies = [] if latency else None
        request_id = rid("chat")
        with CpuWindow(self.mind.pid, [fake_pid]) as window:
            self.driver.send("face.chat", {"request_id": request_id,
                                           "conversation_id": self.cid, "content": content})
            result = await self.driver.expect(is_reply(request_id, "face.result", "face.error"),
                                              300)
            await watcher.expect(lambda m: m["type"] == "face.event"
                                 and m["payload"]["type"] in CHAT_ENDS
                                 and m["payload"]["data"].get("request_id") == request_id, 60)
        if result["type"] != "face.result" or result["payload"]["status"] != "succeeded":
            raise RuntimeError(f"halfpi: the chat failed: {result}")
        stream_s = max(1e-9, (watcher.last_ns - watcher.first_ns) / 1e9)
        return {"tokens": watcher.events, "tokens_s": watcher.events / stream_s,
                "latencies": sorted(watcher.latencies or []), **window.as_dict()}

    async def close(self) -> None:
        self.driver.close()
        self.watcher.close()
        await stop_all(self.mind)


class Direct:
    """This process reading the stream with the openai SDK."""

    name = "direct"

    def __init__(self, base_url: str) -> None:
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)

    async def round(self, content: str, latency: bool, fake_pid: int) -> dict[str, Any]:
        latencies: list[int] = []
        tokens = first = last = 0
        with CpuWindow(fake_pid) as window:
            stream = await self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if not chunk.choices or not chunk.choices[0].delta.content:
                    continue
                now = time.time_ns()
                text = chunk.choices[0].delta.content
                tokens += 1
                first = first or now
                last = now
                if latency:
                    latencies.append(now - int(text))
        stream_s = max(1e-9, (last - first) / 1e9)
        return {"tokens": tokens, "tokens_s": tokens / stream_s, "latencies": sorted(latencies),
                **window.as_dict()}

    async def close(self) -> None:
        await self.client.close()


class Lean(Direct):
    """This process reading the raw stream as the Mind's provider does."""

    name = "lean"

    async def round(self, content: str, latency: bool, fake_pid: int) -> dict[str, Any]:
        latencies: list[int] = []
        tokens = first = last = 0
        create = self.client.chat.completions.with_streaming_response.create
        with CpuWindow(fake_pid) as window:
            async with create(model=MODEL, messages=[{"role": "user", "content": content}],
                              stream=True, stream_options={"include_usage": True}) as response:
                events = EventStream()
                async for data in response.iter_bytes():
                    for event in events.feed(data):
                        if event == DONE:
                            continue
                        chunk = decode_chunk(event)
                        if not chunk.choices or chunk.choices[0].delta is None:
                            continue
                        text = chunk.choices[0].delta.content
                        if not text:
                            continue
                        now = time.time_ns()
                        tokens += 1
                        first = first or now
                        last = now
                        if latency:
                            latencies.append(now - int(text))
        stream_s = max(1e-9, (last - first) / 1e9)
        return {"tokens": tokens, "tokens_s": tokens / stream_s, "latencies": sorted(latencies),
                **window.as_dict()}


def _latency_figures(run: dict[str, Any]) -> None:
    lat = run["latencies"]
    run["p50_ms"] = percentile(lat, 50) / 1e6
    run["p99_ms"] = percentile(lat, 99) / 1e6


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    fast = max(1000, int(FAST_CHUNKS * args.scale))
    paced = max(100, int(PACED_CHUNKS * args.scale))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        kind: {"halfpi": [], "direct": [], "lean": []} for kind in ("fast", "paced")}
    with workdir("halfpi-model-") as tmp:
        fake = FakeModelServer(tmp / "fake").start()
        base_url = str(fake.ready["url"])
        ours = await Halfpi.start(tmp, base_url)
        direct = Direct(base_url)
        lean = Lean(base_url)
        sides: list[Halfpi | Direct] = [ours, direct, lean]
        try:
            for side in sides:  # warm-up: connections, caches
                await side.round(f"/stamp {fast // 4}", False, fake.pid)
            for kind, content, latency in (("fast", f"/stamp {fast}", False),
                                           ("paced", f"/stamp {paced} {PACE_MS}", True)):
                for index in range(args.rounds):
                    # Each side goes first in turn: drift hits all of them.
                    order = sides[index % 3:] + sides[:index % 3]
                    for side in order:
                        result = await side.round(content, latency, fake.pid)
                        if latency:
                            _latency_figures(result)
                        runs[kind][side.name].append(result)
        finally:
            await ours.close()
            await direct.close()
            await lean.close()
            await stop_all(fake)
    return report(runs, fast, paced, args.rounds)


def report(runs: dict[str, dict[str, list[dict[str, Any]]]], fast: int, paced: int,
           rounds: int) -> list[dict[str, Any]]:
    rows = []
    for kind, sides in runs.items():
        for name, results in sides.items():
            for i, r in enumerate(results):
                rows.append([f"{kind} {name} #{i + 1}", r["tokens"], r["tokens_s"],
                             r.get("p50_ms"), r.get("p99_ms"), f"{r['server_util']:.0%}",
                             f"{r['load_util']:.0%}", f"{r['others_util']:.0%}"])
    print(table(["round", "tokens", "tokens/s", "p50 ms", "p99 ms", "server CPU",
                 "load CPU", "rest"], rows,
                f"Model streaming rounds ({rounds} per side; server CPU: the Mind for halfpi, "
                "the fake model server for the readers; load: the rest, this process included)"))
    summary = []
    for reader, what in (("direct", "the openai SDK's typed stream"),
                         ("lean", "the raw stream, decoded as the Mind does")):
        summary.append(figure(
            "model_stream", f"tokens/s a Face receives, vs {reader}", "tokens/s",
            runs["fast"]["halfpi"], runs["fast"][reader], "tokens_s",
            target=f"≥ {THROUGHPUT_TARGET}x" if reader == "direct" else "",
            judge=(lambda _m, r: None if r is None else r >= THROUGHPUT_TARGET)
            if reader == "direct" else None,
            note=f"{fast:,} chunks per round; {reader} = this process reading {what}",
            refuse_when_load_bound=False,
        ))
    for reader in ("direct", "lean"):
        for q in (50, 99):
            added = [h[f"p{q}_ms"] - d[f"p{q}_ms"] for h, d in
                     zip(runs["paced"]["halfpi"], runs["paced"][reader], strict=True)]
            summary.append(figure(
                "model_stream", f"added latency per token p{q}, vs {reader}", "ms",
                [{"added": a} for a in added], None, "added", lower_is_better=True,
                target=f"< {ADDED_P99_TARGET_MS:g} ms" if q == 99 else "",
                judge=(lambda m, _r: m < ADDED_P99_TARGET_MS) if q == 99 else None,
                note=f"{paced} chunks at {1000 / PACE_MS:.0f}/s; halfpi p{q} "
                     f"{median([r[f'p{q}_ms'] for r in runs['paced']['halfpi']]):.2f} ms, "
                     f"{reader} p{q} "
                     f"{median([r[f'p{q}_ms'] for r in runs['paced'][reader]]):.2f} ms",
            ))
    print()
    print(summary_table(summary, "Model streaming summary (medians; ratio = median of "
                                 "per-round ratios, halfpi / direct)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per side")
    parser.add_argument("--quick", action="store_true", help="a third of the work, 3 rounds")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    args.scale = 1 / 3 if args.quick else 1.0
    if args.quick:
        args.rounds = min(args.rounds, 3)
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "model_stream"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
