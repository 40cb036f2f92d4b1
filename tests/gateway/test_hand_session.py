"""The Hand link's registration (docs/hands.md, "One live link per Hand"),
without sockets, on a fake clock: a second link for a Hand whose link
answers is refused (4029); the claim pings the first link, and only a ping
left unanswered for ``PONG_WAIT_S`` lets the next claim take its place."""

from __future__ import annotations

from pathlib import Path

from websockets.protocol import State
from websockets.server import ServerProtocol

from halfpi.gateway.hand_session import PONG_WAIT_S, HandSession
from tests.support.hand import hello_payload
from tests.support.rig import Peer, Rig, Wire, fake_time_mind
from tests.support.wait import until


async def claim(rig: Rig, instance: str) -> Wire:
    """Another process says hello as Hand ``dev`` with its token: its wire,
    once the Mind welcomed or closed it."""
    wire = Wire(address="198.51.100.9")
    peer = Peer(HandSession(rig.mind, wire), wire)
    peer.send("hand.hello", hello_payload(rig.hand_tokens["dev"], "dev", f"dev-{instance}"))
    await until(lambda: wire.closed_with is not None or bool(wire.of_type("hand.welcome")))
    return wire


async def test_a_claim_takes_the_hands_place_only_once_a_ping_went_unanswered(
    tmp_path: Path,
) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        first = await rig.hand("dev", "1")
        pings = first.wire.pings

        assert (await claim(rig, "2")).closed_with == 4029
        assert first.wire.closed_with is None
        assert first.wire.pings == pings + 1  # the claim asked the first link to answer

        rig.advance(PONG_WAIT_S - 0.5)  # not answered yet, but not for long enough
        assert (await claim(rig, "3")).closed_with == 4029
        assert first.wire.pings == pings + 1  # one ping out at a time

        first.session.on_traffic()  # its pong
        rig.advance(PONG_WAIT_S)
        assert (await claim(rig, "4")).closed_with == 4029  # it answered: alive
        assert first.wire.pings == pings + 2

        rig.advance(PONG_WAIT_S)  # this ping goes unanswered: liveness failed
        taken = await claim(rig, "5")
        assert taken.closed_with is None and taken.of_type("hand.welcome")
        assert first.wire.closed_with == 1001
        hand = rig.mind.hands.hands["dev"]
        assert hand.generation == 2 and hand.link is not None
        assert hand.link.address == "198.51.100.9"


async def test_refused_claims_are_counted_with_the_latest_address(tmp_path: Path) -> None:
    async with fake_time_mind(tmp_path / "home") as rig:
        await rig.hand("dev", "1")
        for n in range(3):
            assert (await claim(rig, f"x{n}")).closed_with == 4029
        refused = rig.mind.hands.hands["dev"].to_wire()["refused"]
        assert refused["count"] == 3 and refused["address"] == "198.51.100.9"
        assert rig.mind.hands.connected("dev")


class WebSocketWire(Wire):
    """A wire that closes as the native server does, through websockets'
    own protocol: a close reason longer than a control frame allows (123
    bytes) raises there instead of closing."""

    def close(self, code: int, reason: str) -> None:
        protocol = ServerProtocol()
        protocol.state = State.OPEN
        protocol.send_close(code, reason)
        super().close(code, reason)


async def test_a_refused_claim_is_closed_whatever_the_length_of_the_hands_name(
    tmp_path: Path,
) -> None:
    """A Hand id may be 128 characters; the refusal's close reason must
    still fit a WebSocket close frame, or the impostor is never closed."""
    long_id = "a-hand-with-a-long-name-" + "x" * 76  # 100: "ID-1" stays an Id
    async with fake_time_mind(tmp_path / "home") as rig:
        await rig.hand(long_id, "1")
        wire = WebSocketWire(address="198.51.100.9")
        peer = Peer(HandSession(rig.mind, wire), wire)
        peer.send("hand.hello", hello_payload(rig.hand_tokens[long_id], long_id, "x-2"))
        await until(lambda: wire.closed_with is not None or bool(wire.of_type("hand.welcome")))
        assert wire.closed_with == 4029
        assert rig.mind.hands.hands[long_id].to_wire()["refused"]["count"] == 1
