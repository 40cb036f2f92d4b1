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
from halfpi.errors import CloseCode, InvalidRequest, RateLimited
from halfpi.gateway.session import Transport, WebSocketFraming
from halfpi.mind import hand_api
from halfpi.mind.hands import HandInUse

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

log = logging.getLogger("halfpi.gateway.hand")

# How long a ping may go unanswered before the link has failed its liveness
# check (a live peer's WebSocket library answers at once).
PONG_WAIT_S = 5.0


class HandSession:
    def __init__(self, mind: Mind, transport: Transport) -> None:
        self.mind = mind
        self.transport = transport
        # When a claim by another link pinged this one; None once anything came back.
        self.asked_at: float | None = None
        self.hand_id: str | None = None
        self.invalid = 0
        self._released = False
        # Its life (liveness, the cap, revocation, closing once) is the
        # connection's; Hand messages are few and small: written at once.
        self.conn = mind.connect(None, HandFraming(transport, self), mind.liveness("hand"))

    @property
    def closed(self) -> bool:
        return self.conn.closed

    @property
    def principal_id(self) -> str | None:
        return self.conn.principal_id

    @property
    def state(self) -> str:
        return self.conn.state

    @property
    def bound(self) -> bool:
        return self.conn.bound

    # transport callbacks -------------------------------------------------------

    def on_frame(self, data: bytes) -> None:
        if self.closed:
            return
        self.conn.heard(self.mind.now())
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
            self.conn.checking(self.mind.now())
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
        if not self.conn.welcome(credential):
            self.close(CloseCode.RATE_LIMITED, "too many connections for this credential")
            return
        self.hand_id = hello.hand_id
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
        self.conn.heard(self.mind.now())
        self.asked_at = None

    def pause_writing(self) -> None:
        """Hand traffic is a few small orders; the transport buffer suffices,
        but a Hand that stops reading for ``dead_after_s`` is closed (tick)."""
        self.conn.pause(self.mind.now())

    def resume_writing(self) -> None:
        self.conn.resume()

    def on_closed(self) -> None:
        self.conn.gone()
        self.released()

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
        self.asked_at = self.conn.last_wire_ping = now
        self.transport.ping()
        return True

    def send(self, message: MindMessage) -> None:
        if not self.closed:
            self.transport.write_frames([encode_to_hand(message)])

    def close(self, code: int, reason: str) -> None:
        self.conn.close(code, reason)

    def released(self) -> None:
        """The link is closed: its Hand is disconnected (once)."""
        if not self._released:
            self._released = True
            if self.hand_id:
                self.mind.hands.disconnect(self)

    def tick(self, now: float) -> float | None:
        """The connection's liveness rule (``Liveness`` of ``hand``)."""
        return self.conn.tick(now)


class HandFraming(WebSocketFraming):
    """A Hand link's frames; closing it disconnects the Hand."""

    __slots__ = ("session",)

    def __init__(self, transport: Transport, session: HandSession) -> None:
        super().__init__(transport, "hand")
        self.session = session

    def close(self, code: int, reason: str) -> None:
        super().close(code, reason)
        self.session.released()
