"""Face and Hand sessions move by the ``CONNECTION`` table (core/states.py):
every state a session takes is in it, and every move is one it allows.
No sockets: real sessions over recording wires, on a fake clock."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from halfpi.core.states import CONNECTION
from halfpi.errors import CloseCode
from halfpi.gateway.hand_session import HandSession
from halfpi.gateway.session import FaceSession
from tests.support.rig import Rig, Wire, fake_time_mind


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with fake_time_mind(tmp_path / "home") as r:
        yield r


def assert_moves_by_the_table(states: list[str]) -> None:
    assert states[0] == CONNECTION.initial
    for before, after in itertools.pairwise(states):
        if before != after:
            CONNECTION.check(before, after)  # raises if the table does not allow it


async def test_a_face_session_that_closes_itself_moves_by_the_table(rig: Rig) -> None:
    face = await rig.face()
    session = face.session
    states = [CONNECTION.initial, session.state]
    session.close(CloseCode.GOING_AWAY, "bye")
    states.append(session.state)
    session.on_closed()  # the transport finished the close handshake
    states.append(session.state)
    assert states == ["awaiting_hello", "open", "closing", "closed"]
    assert_moves_by_the_table(states)
    assert CONNECTION.is_terminal(session.state)


async def test_a_face_session_closed_before_its_hello_moves_by_the_table(rig: Rig) -> None:
    session = FaceSession(rig.mind, Wire())
    session.close(CloseCode.HELLO_TIMEOUT, "no hello in time")
    assert session.state == "closing"
    session.on_closed()
    assert_moves_by_the_table(["awaiting_hello", "closing", session.state])


@pytest.mark.parametrize("when", ["awaiting_hello", "open"])
async def test_a_face_session_whose_peer_vanishes_moves_by_the_table(
    rig: Rig, when: str
) -> None:
    session = (await rig.face()).session if when == "open" else FaceSession(rig.mind, Wire())
    assert session.state == when
    session.on_closed()  # the connection died under it
    assert session.state == "closed"
    assert_moves_by_the_table([CONNECTION.initial, when, session.state])
    session.on_closed()  # told twice: still closed
    assert session.state == "closed"


async def test_a_hand_session_moves_by_the_table(rig: Rig) -> None:
    waiting = HandSession(rig.mind, Wire())
    assert waiting.state == CONNECTION.initial
    hand = await rig.hand("dev")
    session = hand.session
    assert isinstance(session, HandSession)
    assert session.state == "open"
    session.close(CloseCode.GOING_AWAY, "bye")
    assert session.state == "closing"
    session.on_closed()
    assert session.state == "closed"
    assert_moves_by_the_table([CONNECTION.initial, "open", "closing", "closed"])
    waiting.on_closed()
    assert waiting.state == "closed"
