"""Model streaming: what a subscribed Face receives through halfpi, against
a lean reader of the same stream.

A fake OpenAI-compatible model server (``tests/support/fake_openai.py``,
real HTTP, its own process) answers ``/stamp N [MS]``: N chunks, each
carrying its send time in ns as its text, MS ms apart (none: as fast as it
writes). Sides, alternating round by round in the same run:

- **halfpi**: ``halfpi mind --agent openai`` (HOME/agent.toml) pointed at the
  fake server; a driver Face sends ``face.chat``; another Face, subscribed
  to the conversation, receives the deltas (``_client.WsClient``) and counts
  the tokens in them (the stamps: a delta may carry several).
- **lean** (the baseline): this process reads the same request as cheaply as
  a program can: a streamed POST on the HTTP client the ``openai`` SDK runs
  on (``openai.DefaultAsyncHttpxClient``, an httpx ``AsyncClient``; none of
  the SDK's request or response layers), its raw body iterator, a split of
  the body on blank lines and a msgspec decode of ``choices[0].delta.
  content`` into a three-field struct. None of halfpi's code, so halfpi
  against it is the cost of the Mind's hop: its provider, the actor, the
  journal, the Face's connection.
- **direct** (for the record, no target): this process reads the stream with
  the ``openai`` SDK (``AsyncOpenAI``, ``stream=True``, its typed chunks),
  as a program talking to the model through the SDK would.

Figures:

- **tokens/s**, 20,000 chunks sent as fast as the server writes them:
  tokens over the time from the first token's send (its stamp) to the
  last token's arrival, at the Face (halfpi) or in the reader (lean,
  direct). Target ≥ 0.8x lean, as the median of per-round ratios.
- **CPU per token**: the Mind's CPU (every thread) per token, against the
  lean reader's (this process) per token.
- **added latency per token**: 400 chunks at 200/s; each token's arrival
  minus its send time, at both ends; the Mind's added latency is halfpi's
  percentile minus the lean reader's, per round. Target p99 < 2 ms.

``--quick``: 3 rounds, each round's work as in the full run (so the
figures are the full run's, with a wider spread). A third of the stream
per round measured something else: 0.42x quick against 0.31x full.

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

import msgspec
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

    async def round(self, content: str, fake_pid: int) -> dict[str, Any]:
        watcher = self.watcher
        watcher.reset_counters()
        # The watcher reads every stamp of every delta: a delta of the Mind
        # carries the chunks of one network read, so tokens are counted by
        # their stamps, not by frames (the frames are counted apart).
        arrivals: list[int] = []
        watcher.latencies = arrivals
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
        tokens = len(arrivals)
        first_sent = watcher.first_ns - arrivals[0]  # the first stamp of the first delta
        return _result(tokens, first_sent, watcher.last_ns, arrivals, window,
                       window.server, frames=watcher.frames)

    async def close(self) -> None:
        self.driver.close()
        self.watcher.close()
        await stop_all(self.mind)


def _result(tokens: int, first_sent: int, last: int, latencies: list[int], window: CpuWindow,
            cpu_s: float, **extra: Any) -> dict[str, Any]:
    stream_s = max(1e-9, (last - first_sent) / 1e9)
    return {"tokens": tokens, "tokens_s": tokens / stream_s, "latencies": sorted(latencies),
            "cpu_us_per_token": cpu_s / max(1, tokens) * 1e6, **window.as_dict(), **extra}


class LeanDelta(msgspec.Struct):
    content: str | None = None


class LeanChoice(msgspec.Struct):
    delta: LeanDelta | None = None


class LeanChunk(msgspec.Struct):
    choices: list[LeanChoice] = []


_lean_chunk = msgspec.json.Decoder(LeanChunk).decode


class Lean:
    """This process reading the raw stream as cheaply as it can."""

    name = "lean"

    def __init__(self, base_url: str) -> None:
        self.client = openai.DefaultAsyncHttpxClient(base_url=base_url + "/",
                                                     headers={"authorization": "Bearer bench"})

    async def round(self, content: str, fake_pid: int) -> dict[str, Any]:
        arrivals: list[int] = []
        tokens = first_sent = last = 0
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
                "stream": True, "stream_options": {"include_usage": True}}
        decode = _lean_chunk
        with CpuWindow(fake_pid) as window:
            async with self.client.stream("POST", "chat/completions", json=body) as response:
                response.raise_for_status()
                rest = b""
                async for data in response.aiter_raw():  # not compressed: no decoder
                    *events, rest = (rest + data).split(b"\n\n")
                    for event in events:
                        if not event.startswith(b"data: {"):
                            continue  # [DONE], comments
                        choices = decode(event[6:]).choices
                        if not choices or choices[0].delta is None:
                            continue
                        text = choices[0].delta.content
                        if not text:
                            continue
                        last = time.time_ns()
                        stamp = int(text)
                        first_sent = first_sent or stamp
                        tokens += 1
                        arrivals.append(last - stamp)
        return _result(tokens, first_sent, last, arrivals, window, window.loads[-1])

    async def close(self) -> None:
        await self.client.aclose()


class Direct(Lean):
    """This process reading the stream with the openai SDK's typed chunks."""

    name = "direct"

    def __init__(self, base_url: str) -> None:
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)

    async def round(self, content: str, fake_pid: int) -> dict[str, Any]:
        arrivals: list[int] = []
        tokens = first_sent = last = 0
        with CpuWindow(fake_pid) as window:
            stream = await self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if not chunk.choices or not chunk.choices[0].delta.content:
                    continue
                last = time.time_ns()
                stamp = int(chunk.choices[0].delta.content)
                first_sent = first_sent or stamp
                tokens += 1
                arrivals.append(last - stamp)
        return _result(tokens, first_sent, last, arrivals, window, window.loads[-1])

    async def close(self) -> None:
        await self.client.close()


Side = Halfpi | Lean


def _latency_figures(run: dict[str, Any]) -> None:
    lat = run["latencies"]
    run["p50_ms"] = percentile(lat, 50) / 1e6
    run["p99_ms"] = percentile(lat, 99) / 1e6


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    fast, paced = FAST_CHUNKS, PACED_CHUNKS
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        "fast": {"halfpi": [], "lean": [], "direct": []}, "paced": {"halfpi": [], "lean": []}}
    with workdir("halfpi-model-") as tmp:
        fake = FakeModelServer(tmp / "fake").start()
        base_url = str(fake.ready["url"])
        ours = await Halfpi.start(tmp, base_url)
        lean = Lean(base_url)
        direct = Direct(base_url)
        try:
            for side in (ours, lean, direct):  # warm-up: connections, caches
                await side.round(f"/stamp {fast // 4}", fake.pid)
            kinds: list[tuple[str, str, list[Side]]] = [
                ("fast", f"/stamp {fast}", [ours, lean, direct]),
                ("paced", f"/stamp {paced} {PACE_MS}", [ours, lean]),
            ]
            for kind, content, sides in kinds:
                for index in range(args.rounds):
                    # Each side goes first in turn: drift hits all of them.
                    order = sides[index % len(sides):] + sides[:index % len(sides)]
                    for side in order:
                        result = await side.round(content, fake.pid)
                        if kind == "paced":
                            _latency_figures(result)
                        runs[kind][side.name].append(result)
        finally:
            await ours.close()
            await lean.close()
            await direct.close()
            await stop_all(fake)
    return report(runs, FAST_CHUNKS, PACED_CHUNKS, args.rounds)


def report(runs: dict[str, dict[str, list[dict[str, Any]]]], fast: int, paced: int,
           rounds: int) -> list[dict[str, Any]]:
    rows = []
    for kind, sides in runs.items():
        for name, results in sides.items():
            for i, r in enumerate(results):
                rows.append([f"{kind} {name} #{i + 1}", r["tokens"], r.get("frames"),
                             r["tokens_s"], r["cpu_us_per_token"], r.get("p50_ms"),
                             r.get("p99_ms"), f"{r['server_util']:.0%}",
                             f"{r['load_util']:.0%}", f"{r['others_util']:.0%}"])
    print(table(["round", "tokens", "frames", "tokens/s", "CPU µs/token", "p50 ms", "p99 ms",
                 "server CPU", "load CPU", "rest"], rows,
                f"Model streaming rounds ({rounds} per side; server CPU: the Mind for halfpi, "
                "the fake model server for the readers; load: the rest, this process included; "
                "CPU µs/token: the Mind's, or this reader's)"))
    fast_h = runs["fast"]["halfpi"]
    summary = [figure(
        "model_stream", "tokens/s a Face receives, vs lean", "tokens/s",
        fast_h, runs["fast"]["lean"], "tokens_s",
        target=f"≥ {THROUGHPUT_TARGET}x",
        judge=lambda _m, r: None if r is None else r >= THROUGHPUT_TARGET,
        note=f"{fast:,} chunks per round; lean = this process reading the raw stream "
             f"(httpx, a split on blank lines, msgspec); halfpi frames per round "
             f"{median([r['frames'] for r in fast_h]):,.0f}",
        # The lean reader is its own bottleneck by design (it is the load side).
        refuse_when_load_bound=False,
    ), figure(
        "model_stream", "CPU per token, the Mind vs the lean reader", "µs",
        fast_h, runs["fast"]["lean"], "cpu_us_per_token", lower_is_better=True,
        note="the Mind's CPU (every thread) over the tokens its Face received, against "
             "this process's CPU per token in the lean rounds",
        refuse_when_load_bound=False,
    ), figure(
        "model_stream", "tokens/s a Face receives, vs direct (openai SDK)", "tokens/s",
        fast_h, runs["fast"]["direct"], "tokens_s",
        note="for the record: direct = this process reading the openai SDK's typed stream",
        refuse_when_load_bound=False,
    )]
    for q in (50, 99):
        added = [h[f"p{q}_ms"] - d[f"p{q}_ms"] for h, d in
                 zip(runs["paced"]["halfpi"], runs["paced"]["lean"], strict=True)]
        summary.append(figure(
            "model_stream", f"added latency per token p{q}, vs lean", "ms",
            [{"added": a} for a in added], None, "added", lower_is_better=True,
            target=f"< {ADDED_P99_TARGET_MS:g} ms" if q == 99 else "",
            judge=(lambda m, _r: m < ADDED_P99_TARGET_MS) if q == 99 else None,
            note=f"{paced} chunks at {1000 / PACE_MS:.0f}/s; halfpi p{q} "
                 f"{median([r[f'p{q}_ms'] for r in runs['paced']['halfpi']]):.2f} ms, "
                 f"lean p{q} {median([r[f'p{q}_ms'] for r in runs['paced']['lean']]):.2f} ms",
        ))
    print()
    print(summary_table(summary, "Model streaming summary (medians; ratio = median of "
                                 "per-round ratios, halfpi / reader)"))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per side")
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds; each round's work as in the full run")
    parser.add_argument("--json", help="write the summary rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 3)
    rows = asyncio.run(main_async(args))
    write_json(args.json, rows, {"bench": "model_stream"})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
