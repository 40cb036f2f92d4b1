"""One Hand connection on ``/v1/hand``: authenticate, then relay run messages.

A Hand's credential is its own type: a Face token is refused here (4001),
as a Hand token is refused on ``/v1/face``. Revocation closes the
connection (4003) like for Faces. Hand handshakes share the Faces'
per-address throttle and per-principal cap (4029), and their liveness rule
(WebSocket pings when idle; blocked writes for ``dead_after_s``: 4008).
The welcome names the Mind's home, which the Hand then protects like its
own (DESIGN §8: no tool ever reaches it).

A second link for a Hand whose link is connected and answers is refused
(4029, retry later) and audited with both addresses: a stolen token does
not silently take a live Hand's tool calls (docs/hands.md). The claim
pings the first link; once that ping goes unanswered for ``PONG_WAIT_S``
the first has failed its liveness check, and the next try takes its place.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from halfpi.core.hand_wire import (
    HAND_PROTOCOL,
    HandHello,
    MindMessage,
    decode_hand_message,
    encode_to_hand,
)
from halfpi.core.states import CONNECTION
from halfpi.errors import CloseCode, InvalidRequest, RateLimited
from halfpi.mind import hand_api
from halfpi.mind.hands import HandInUse

if TYPE_CHECKING:
    from halfpi.gateway.session import Transport
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway.hand")

# How long a ping may go unanswered before the link has failed its liveness
# check (a live peer's WebSocket library answers at once).
PONG_WAIT_S = 5.0


class HandSession:
    def __init__(self, mind: Mind, transport: Transport) -> None:
        self.mind = mind
        self.transport = transport
        now = mind.now()
        self.connected_at = now
        self.last_inbound = now
        self.last_wire_ping = now
        # When a claim by another link pinged this one; None once anything came back.
        self.asked_at: float | None = None
        self.paused = False
        self.paused_at = now
        self.principal_id: str | None = None
        self.hand_id: str | None = None
        self.state = CONNECTION.initial
        self.closed = False
        self.bound = False  # counted against the principal's connection cap
        self.invalid = 0
        mind.add_session(self)

    # transport callbacks -------------------------------------------------------

    def on_frame(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_inbound = self.mind.now()
        self.asked_at = None
        try:
            _, message = decode_hand_message(data)
        except InvalidRequest as exc:
            self.invalid += 1
            log.warning("invalid frame from Hand %s: %s", self.hand_id, exc.message)
            if self.invalid >= self.mind.config.invalid_frames_before_close:
                self.close(CloseCode.PROTOCOL_VIOLATION, "too many invalid frames")
            return
        self.invalid = 0
        if self.hand_id is None:
            if not isinstance(message, HandHello):
                self.close(CloseCode.UNAUTHORIZED, "hand.hello required")
                return
            self.hand_id = ""  # hello received; authentication in progress
            self.mind.spawn(self._hello(message), name="hand hello")
        else:
            hand_api.handle(self.mind, self, message)

    async def _hello(self, hello: HandHello) -> None:
        if hello.protocol != HAND_PROTOCOL:
            self.close(CloseCode.PROTOCOL_VIOLATION, f"hand protocol {HAND_PROTOCOL} only")
            return
        try:
            credential = await self.mind.authenticate(
                hello.token, "hand", self.transport.address, label=hello.hand_id
            )
        except RateLimited:
            self.close(CloseCode.RATE_LIMITED, "too many failed handshakes: retry later")
            return
        if self.closed:
            return
        if credential is None:
            self.hand_id = None
            self.close(CloseCode.UNAUTHORIZED, "unauthorized")
            return
        if not self.mind.bind(credential.principal_id):
            self.close(CloseCode.RATE_LIMITED, "too many connections for this credential")
            return
        self.bound = True
        self.principal_id = credential.principal_id
        self.hand_id = hello.hand_id
        self.state = CONNECTION.check(self.state, "open")
        try:
            welcome = hand_api.welcome(self.mind, self, hello, credential.principal_id)
        except HandInUse as exc:  # audited by the registry
            self.hand_id = None  # never bound: its close must not unbind the first
            self.close(CloseCode.RATE_LIMITED, exc.message)
            return
        self.send(welcome)
        log.info("Hand %s connected (generation %s)", hello.hand_id, welcome.generation)

    def on_binary(self) -> None:
        self.on_frame(b"\x00")

    def on_traffic(self) -> None:
        self.last_inbound = self.mind.now()
        self.asked_at = None

    def pause_writing(self) -> None:
        """Hand traffic is a few small orders; the transport buffer suffices,
        but a Hand that stops reading for ``dead_after_s`` is closed (tick)."""
        if not self.paused:
            self.paused = True
            self.paused_at = self.mind.now()

    def resume_writing(self) -> None:
        self.paused = False

    def on_closed(self) -> None:
        if not self.closed:
            self.closed = True
        if self.state != "closed":
            self.state = CONNECTION.check(self.state, "closed")
        self._cleanup()

    # session API ------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.transport.address

    def alive(self) -> bool:
        """Asked when another link claims this Hand: False once a ping went
        unanswered for ``PONG_WAIT_S``; else a ping is sent now (unless one
        is out), so the claimant's next try knows."""
        if self.closed:
            return False
        now = self.mind.now()
        if self.asked_at is not None:  # its ping is out: any traffic since would have cleared it
            return now - self.asked_at < PONG_WAIT_S
        self.asked_at = self.last_wire_ping = now
        self.transport.ping()
        return True

    def send(self, message: MindMessage) -> None:
        if not self.closed:
            self.transport.write_frames([encode_to_hand(message)])

    def close(self, code: int, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.state = CONNECTION.check(self.state, "closing")
        self.transport.close(code, reason)
        self._cleanup()

    def _cleanup(self) -> None:
        self.mind.remove_session(self)
        if self.bound and self.principal_id is not None:
            self.bound = False
            self.mind.unbind(self.principal_id)
        if self.hand_id:
            self.mind.hands.disconnect(self)

    def tick(self, now: float) -> float | None:
        """The Faces' liveness rule (``FaceSession.tick``); time is passed in.
        Returns the next deadline, None once closed."""
        if self.closed:
            return None
        config = self.mind.config
        blocked_at = self.paused_at + config.dead_after_s if self.paused else float("inf")
        hello_by = self.connected_at + config.hello_timeout_s
        dead_at = self.last_inbound + config.dead_after_s
        if now >= blocked_at:
            self.close(CloseCode.SLOW_CONSUMER, "slow consumer: it does not read")
            return None
        if self.hand_id is None and now >= hello_by:
            self.close(CloseCode.HELLO_TIMEOUT, "no hello in time")
            return None
        if now >= dead_at:
            self.close(CloseCode.GOING_AWAY, "no traffic: connection presumed dead")
            return None
        ping_at = max(self.last_inbound, self.last_wire_ping) + config.heartbeat_s
        if now >= ping_at:
            self.last_wire_ping = now
            self.transport.ping()
            ping_at = now + config.heartbeat_s
        nxt = min(dead_at, ping_at, blocked_at)
        return min(nxt, hello_by) if self.hand_id is None else nxt
