"""A LangGraph graph that streams N custom events: the peer's side of the
20,000-event workload (``benchmarks/peers/langgraph_peer.py``).

Input ``{"count": N, "pace_ms": P}``: one node writes N events to the
``custom`` stream, each ``{"i": i, "t": wall clock in ns}`` (the same size
as a halfpi delta's text field carries), sleeping P ms between events (0:
yield to the loop between events, as halfpi's scripted agent does).
"""

from __future__ import annotations

import asyncio
import time
from typing import TypedDict

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph


class State(TypedDict, total=False):
    count: int
    pace_ms: float
    done: int


async def emit(state: State) -> State:
    write = get_stream_writer()
    count = int(state.get("count", 0))
    pause = float(state.get("pace_ms", 0.0)) / 1000.0
    for index in range(count):
        write({"i": index, "t": time.time_ns()})
        await asyncio.sleep(pause)
    return {"done": count}


builder = StateGraph(State)
builder.add_node("emit", emit)
builder.add_edge(START, "emit")
builder.add_edge("emit", END)
graph = builder.compile()
