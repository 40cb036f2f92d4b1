"""Convergence under faults: whatever the network does, the Face ends up true.

A real Mind process sits behind a fault-injecting proxy. Hypothesis draws
schedules of chats, tool calls, cancels, cuts at random byte offsets, delays, a client
that stops reading, and Mind restarts (kill -9 or graceful). After the
schedule the network heals and everything settles; then:

- the SDK's ConversationView equals the Mind's snapshot (I4): messages,
  streaming replies and tool cards,
- each request_id was admitted at most once, and every chat that was
  accepted was admitted exactly once (I5),
- nothing the Mind did not declare replay-safe was ever re-sent (I6).

CI runs a bounded number of examples; ``HALFPI_CHAOS_EXAMPLES=300`` runs more.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from halfpi.core.backoff import backoff
from halfpi.core.events import Snapshot
from halfpi.face.client import ChatHandle, FaceClient
from halfpi.face.errors import CommandError
from halfpi.face.view import ConversationView
from tests.support.client import FaceClient as RawClient
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = int(os.environ.get("HALFPI_CHAOS_EXAMPLES", "12"))

chat = st.tuples(st.just("chat"), st.sampled_from(["echo", "repeat", "pace"]),
                 st.integers(1, 30))
tool = st.tuples(st.just("tool"), st.integers(1, 3))
step = st.one_of(
    chat,
    chat,
    tool,
    st.tuples(st.just("cancel")),
    st.tuples(st.just("cut")),
    st.tuples(st.just("cut_after"), st.integers(1, 6000)),
    st.tuples(st.just("delay"), st.integers(1, 20)),
    st.tuples(st.just("stall"), st.integers(20, 300)),
    st.tuples(st.just("restart"), st.booleans()),
    st.tuples(st.just("wait"), st.integers(0, 250)),
)
schedules = st.lists(step, min_size=2, max_size=9)


@pytest.fixture(scope="module")
def mind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MindProcess]:
    home: Path = tmp_path_factory.mktemp("chaos") / "home"
    home.mkdir()
    process = MindProcess(home, delta_ms=3).start()
    try:
        yield process
    finally:
        process.kill()


def _content(kind: str, n: int) -> str:
    if kind == "repeat":
        return f"/repeat {n * 10} r{n}"
    if kind == "pace":
        return f"/pace 15 {' '.join(f'p{i}' for i in range(n))}"
    return " ".join(f"e{i}" for i in range(n))


async def _restart(mind: MindProcess, kill: bool) -> None:
    if kill:
        await asyncio.to_thread(mind.kill)
    else:
        await asyncio.to_thread(mind.terminate)
    await asyncio.to_thread(mind.start)


async def run_schedule(mind: MindProcess, steps: list[tuple[Any, ...]]) -> None:
    proxy = await FaultProxy(mind.port).start()
    client = FaceClient(proxy.url, mind.token,
                        delays=lambda: backoff(initial=0.02, cap=0.3))
    handles: list[ChatHandle] = []
    try:
        await client.connect(timeout=30)
        cid = await asyncio.wait_for(client.create_conversation("chaos"), 30)
        await client.subscribe(cid)
        for action, *args in steps:
            event(action)
            proxy.delay_s = 0.0
            if action == "chat":
                handles.append(await client.chat(cid, _content(*args)))
            elif action == "tool":
                # A tool call on the Mind's local Hand (read_file inside its
                # root, the Mind's working directory, needs no approval): its
                # card must converge like the messages.
                notes = mind.home.parent / "notes.txt"
                notes.write_text("chaos\n")
                target = json.dumps({"path": str(notes), "max_bytes": 64})
                handles.append(await client.chat(cid, f"/tool read_file {target}"))
            elif action == "cancel" and handles:
                handles.append(await client.cancel(cid, handles[-1].request_id))
            elif action == "cut":
                proxy.cut_all()
            elif action == "cut_after":
                proxy.cut_to_client_after = args[0]
            elif action == "delay":
                proxy.delay_s = args[0] / 1000
            elif action == "stall":
                proxy.pause_to_client()
                await asyncio.sleep(args[0] / 1000)  # the schedule's own time, not a sync
                proxy.resume_to_client()
            elif action == "restart":
                await _restart(mind, kill=args[0])
            elif action == "wait":
                await asyncio.sleep(args[0] / 1000)
        # Quiescence: heal the network and let every command settle.
        proxy.delay_s, proxy.cut_to_client_after = 0.0, None
        proxy.resume_to_client()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(h.result() for h in handles), return_exceptions=True), 60
        )
        await _check(mind, client, cid, handles, outcomes)
    finally:
        await client.close()
        await proxy.stop()


async def _check(mind: MindProcess, client: FaceClient, cid: str, handles: list[ChatHandle],
                 outcomes: list[Any]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, CommandError) and outcome.code in (
                "busy", "run_not_found"), repr(outcome)
    truth_face = await RawClient.connect(mind.url, mind.token)
    try:
        request_id = await truth_face.command("face.conversation.snapshot",
                                              conversation_id=cid, messages_limit=500)
        snapshot = (await truth_face.reply(request_id))["payload"]
    finally:
        await truth_face.close()
    truth = ConversationView(cid)
    truth.apply_snapshot(msgspec.convert(snapshot, Snapshot))
    assert truth.streaming == {}, "everything settled, nothing may still be streaming"
    view = await client.wait_view(
        cid, lambda v: v.epoch == truth.epoch and v.seq >= truth.seq and not v.streaming, 30
    )
    # I4: the Face shows exactly what the Mind holds.
    assert view.summary() == truth.summary()
    # I5: admitted at most once; every accepted chat exactly once.
    user_ids = Counter(m.request_id for m in truth.messages if m.role == "user")
    assert all(count == 1 for count in user_ids.values()), user_ids
    for handle, outcome in zip(handles, outcomes, strict=True):
        accepted = not isinstance(outcome, BaseException)
        is_chat = handle.type == "face.chat"
        if is_chat:
            assert user_ids.get(handle.request_id, 0) == (1 if accepted else 0)
    # I6: only what the Mind declared replay-safe was ever sent twice.
    safe = set(client.welcome.replay_safe)
    sends = Counter((type_, rid) for _, type_, rid in client.sent_log)
    assert all(type_ in safe for (type_, _), n in sends.items() if n > 1)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=schedules)
def test_I4_I5_I6_face_converges_under_faults(mind: MindProcess,
                                              steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(asyncio.wait_for(run_schedule(mind, steps), 180))
