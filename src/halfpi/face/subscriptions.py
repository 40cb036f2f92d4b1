"""The subscription and resume tracker: which conversations a Face follows,
and how far each one's resume has come on the current connection.

Plain state, no I/O, time passed in (DESIGN §4.2, I4):

- ``wanted``: the conversations followed; every (re)connect subscribes each
  from its view's cursor (exact replay), or asks for a snapshot when the
  view holds nothing yet;
- ``event_seq`` counts this connection's messages; a jump means something
  was lost inside the connection: every followed conversation is
  resubscribed from the last good cursor, and nothing of it is folded until
  the Mind accepts (``held``) — the replay brings it again, in order. At
  most one resubscribe per conversation is in flight: a second jump while
  one is on its way is covered by it;
- a resubscribe the Mind refuses with a retryable error (busy,
  rate_limited, unavailable…) is tried again after a jittered pause
  (``retry_at``), so a view never silently stops updating;
- the resume is over ("resumed: k events replayed") once every conversation
  that was resumed has been accepted and has caught up with the head the
  Mind announced in its subscribe reply.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from halfpi.core import wire
from halfpi.core.cursor import parse_cursor
from halfpi.core.events import Accepted, present
from halfpi.face.view import ConversationView

# After a refused resubscribe: wait RETRY_S + uniform [0, RETRY_JITTER_S).
RETRY_S = 0.5
RETRY_JITTER_S = 1.0


class Subscriptions:
    def __init__(self) -> None:
        self.wanted: set[str] = set()
        # -- this connection's -------------------------------------------------
        self.expected_event_seq = 1
        self.awaiting_snapshot: dict[str, str] = {}  # subscribe request_id -> cid
        self.catching_up: dict[str, int] = {}  # cid -> the head seq to reach
        self.resume_pending: set[str] = set()  # resumed, not accepted yet
        self.resubscribing: dict[str, str] = {}  # cid -> its resubscribe after a gap
        self.retry_at: dict[str, float] = {}  # cid -> when to subscribe again
        self.replayed = 0

    def connection_made(self, views: dict[str, ConversationView], event_seq: int) -> None:
        """A new connection whose welcome carried ``event_seq``."""
        self.expected_event_seq = event_seq + 1
        self.awaiting_snapshot.clear()
        self.catching_up.clear()
        self.resubscribing.clear()
        self.retry_at.clear()
        self.replayed = 0
        self.resume_pending = {cid for cid in self.wanted if views[cid].ready}

    def subscribe(self, view: ConversationView, request_id: str) -> wire.Subscribe:
        """A subscribe of ``view``'s conversation: from its cursor, or with a
        snapshot when it holds nothing yet."""
        cid = view.conversation_id
        if view.ready and view.cursor is not None:
            return wire.Subscribe(
                request_id=request_id, conversation_ids=[cid], since={cid: view.cursor}
            )
        self.awaiting_snapshot[request_id] = cid
        return wire.Subscribe(request_id=request_id, conversation_ids=[cid], snapshot=True)

    # -- loss inside the connection --------------------------------------------------

    def jumped(self, event_seq: int) -> bool:
        """Count one message; True if messages before it were lost."""
        jumped = event_seq != self.expected_event_seq
        self.expected_event_seq = event_seq + 1
        return jumped

    def to_resubscribe(self, new_id: Callable[[str], str]) -> list[tuple[str, str]]:
        """After a loss: (cid, request_id) of the resubscribes to send — none
        for a conversation whose resubscribe is already on its way."""
        planned: list[tuple[str, str]] = []
        for cid in sorted(self.wanted):
            if cid not in self.resubscribing:
                request_id = new_id("sub")
                self.resubscribing[cid] = request_id
                planned.append((cid, request_id))
        return planned

    def held(self, cid: str) -> bool:
        """Nothing of ``cid`` is folded while its resubscribe is unanswered."""
        return cid in self.resubscribing

    def snapshot_requested(self, cid: str) -> bool:
        return cid in self.awaiting_snapshot.values()

    # -- the Mind's answers --------------------------------------------------------------

    def accepted(self, accepted: Accepted, views: dict[str, ConversationView]) -> None:
        """``face.accepted{operation: subscribe}``: per conversation, ``exact``
        replay up to ``heads``, ``live``, or ``reset`` (a snapshot follows)."""
        request_id = accepted.request_id
        heads = present(accepted.heads) or {}
        for cid, mode in (present(accepted.conversations) or {}).items():
            if self.resubscribing.get(cid) == request_id:
                del self.resubscribing[cid]
            if mode != "reset":  # a reset ends in 'resynced', never in 'resumed'
                self.resume_pending.discard(cid)
            view = views.get(cid)
            if view is not None and mode == "exact" and cid in heads:
                head = parse_cursor(str(heads[cid]), field="heads").seq
                if head > view.seq:
                    self.catching_up[cid] = head

    def refused(
        self, request_id: str, cids: list[str], retryable: bool, now: float, rng: random.Random
    ) -> None:
        """A subscribe was refused; a retryable refusal is tried again later."""
        for cid in cids:
            self.resume_pending.discard(cid)
            if self.resubscribing.get(cid) == request_id:
                del self.resubscribing[cid]
            if retryable and cid in self.wanted:
                self.retry_at[cid] = now + RETRY_S + RETRY_JITTER_S * rng.random()

    def applied(self, cid: str, view: ConversationView) -> None:
        """One event of ``cid`` was folded: count it if it was replayed."""
        head = self.catching_up.get(cid)
        if head is not None:
            self.replayed += 1
            if view.seq >= head:
                del self.catching_up[cid]

    def rebuilt(self, cid: str) -> None:
        """``cid``'s view was rebuilt from a snapshot: no catching up left."""
        for request_id in [r for r, c in self.awaiting_snapshot.items() if c == cid]:
            del self.awaiting_snapshot[request_id]
        self.catching_up.pop(cid, None)
        self.resume_pending.discard(cid)

    @property
    def caught_up(self) -> bool:
        return not self.resume_pending and not self.catching_up

    # -- timers ----------------------------------------------------------------------------

    def next_retry(self) -> float | None:
        return min(self.retry_at.values(), default=None)

    def due(self, now: float) -> list[str]:
        """The conversations whose retry is due at ``now`` (taken off the list)."""
        ready = sorted(cid for cid, at in self.retry_at.items() if at <= now)
        for cid in ready:
            del self.retry_at[cid]
        return [cid for cid in ready if cid in self.wanted]
