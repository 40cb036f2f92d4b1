"""The Mind's view of its Hands and of the tool runs they execute (DESIGN §8).

A run is an RPC with a deadline, a cancel, bounded progress and exactly one
terminal state — the first one that arrives wins (I10). Each Hand connection
has a *generation*; a run is bound to the generation that started or adopted
it, and a message stamped with another generation is refused. A Hand that
stays away longer than the grace period, or comes back as a new process
(new ``instance_id``), loses its runs: they become ``lost`` and are never
re-run (I11).

The Mind does not trust a Hand (DESIGN §8): a Hand that breaks the progress
or result limits, or lies about its output's length or digest, is faulty —
the frame is refused, the Hand is closed with 4009 and every run it had
becomes ``lost``. Before a tool call the Mind asks the Hand for its policy
verdict (``hand.check``): only the Hand can resolve paths on its disk.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from halfpi.core.events import EventData, HandLinkRefused
from halfpi.core.hand_wire import (
    HandAck,
    HandCancel,
    HandCheck,
    HandChecked,
    HandHello,
    HandProgress,
    HandResult,
    HandRun,
    HandStarted,
    HandWelcome,
    MindMessage,
    ProgressBudget,
    result_violation,
)
from halfpi.core.policy import Decision, Verdict
from halfpi.core.states import RUN
from halfpi.core.throttle import worth_logging
from halfpi.core.timers import Timer
from halfpi.errors import CloseCode, RateLimited, Unavailable
from halfpi.mind.scheduler import Scheduler

log = logging.getLogger("halfpi.hands")

ENDED_KEPT = 4096
CHECK_TIMEOUT_S = 30.0
# The Mind's own deadline for a run comes this long after the Hand's, so the
# Hand's ``timed_out`` (with its output) normally wins; if the Hand is
# silent, the Mind's does.
DEADLINE_SLACK_S = 5.0


class HandUnavailable(Unavailable):
    """The Hand a tool call needs is gone, or did not answer in time."""


class HandInUse(RateLimited):
    """A link claims a Hand whose link is still connected and alive: refused,
    never a silent displacement (a stolen token must not take a live Hand's
    tool calls). ``holder``: the link that keeps the Hand."""

    def __init__(self, hand_id: str, holder: HandLink) -> None:
        # The close reason of the refused link: no id in it, so that it fits a
        # WebSocket close frame (123 bytes) whatever the Hand's name.
        super().__init__("this Hand is already connected and answering: retry later, "
                         "or revoke its token if that link is not yours")
        self.holder = holder


class HandLink(Protocol):
    hand_id: str | None

    @property
    def address(self) -> str:
        """Where it connects from (for the audit of a refused second link)."""
        ...

    def send(self, message: MindMessage) -> None: ...

    def close(self, code: int, reason: str) -> None: ...

    def alive(self) -> bool:
        """False once it failed its liveness check (a ping went unanswered);
        asked when another link claims its Hand."""
        ...


@dataclass
class HandState:
    hand_id: str
    principal_id: str
    instance_id: str
    info: dict[str, Any]
    tools: list[str]
    roots: list[str] = field(default_factory=list)
    rules: dict[str, str] = field(default_factory=dict)
    link: HandLink | None = None
    generation: int = 0
    connected_at: float = 0.0
    disconnected_at: float | None = None
    grace: Timer | None = None
    # Second links refused while this one held the Hand: how many, the
    # latest one's address and time (operators see it in face.hand.list).
    refused: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "hand_id": self.hand_id,
            "connected": self.link is not None,
            "info": self.info,
            "tools": sorted(self.tools),
            "roots": list(self.roots),
            "rules": dict(self.rules),
            "generation": self.generation,
            "connected_at": self.connected_at,
            "disconnected_at": self.disconnected_at,
            "refused": self.refused,
        }


@dataclass
class ToolRun:
    run_id: str
    hand_id: str
    tool: str
    args: dict[str, Any]
    timeout_s: float
    conversation_id: str
    tool_call_id: str
    on_progress: Callable[[str, str, bool], None] | None = None
    on_state: Callable[[str], None] | None = None
    approved: bool = False  # a human allowed it (the Hand re-checks its policy)
    generation: int = 0
    state: str = RUN.initial
    done: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    deadline: Timer | None = None
    progress: ProgressBudget = field(default_factory=ProgressBudget)


@dataclass
class PolicyCheck:
    hand_id: str
    done: asyncio.Future[Decision]
    timer: Timer | None = None


class HandRegistry:
    def __init__(
        self,
        scheduler: Scheduler,
        grace_s: float,
        *,
        check_timeout_s: float = CHECK_TIMEOUT_S,
        local_label: str = "local",
        wall: Callable[[], float] = time.time,
    ) -> None:
        # The embedded Hand's label: the default Hand while it is connected.
        self.local_label = local_label
        # Every timer here (grace, run deadline, check timeout) is on the
        # Mind's scheduler, so its monotonic clock is the one they count on;
        # ``wall`` only stamps what Faces are shown (connected_at, disconnected_at).
        self.scheduler = scheduler
        self.clock = wall
        self.grace_s = grace_s
        self.check_timeout_s = check_timeout_s
        self.hands: dict[str, HandState] = {}
        self.runs: dict[str, ToolRun] = {}
        self.checks: dict[str, PolicyCheck] = {}
        self._check_ids = itertools.count(1)
        # Terminal states of the latest runs, kept while their records commit:
        # a cancel that arrives just after the end learns the state that stands.
        self.ended: OrderedDict[str, str] = OrderedDict()
        self.finished: Counter[str] = Counter()  # runs ended, by state, for /metrics
        # Called with (hand_id, connected, conversation ids with runs on it).
        self.on_presence: Callable[[str, bool, set[str]], None] | None = None
        # Called with (hand_id, connected) at every connect and disconnect
        # (background tasks: shown stale while away, delivered once back).
        self.on_link: Callable[[str, bool], None] | None = None
        # Called with (conversation ids, event) to publish an audit event
        # (a refused second link) where a person waits on that Hand.
        self.on_audit: Callable[[set[str], EventData], None] | None = None

    def _presence(self, hand_id: str, connected: bool) -> None:
        if self.on_presence is not None:
            conversations = {r.conversation_id for r in self.runs.values() if r.hand_id == hand_id}
            if conversations:
                self.on_presence(hand_id, connected, conversations)

    # -- connections -------------------------------------------------------------

    def connect(self, link: HandLink, hello: HandHello, principal_id: str) -> HandWelcome:
        """A Hand said hello: (re)bind it, adopt or abandon its runs; the
        welcome's part about runs (``mind/hand_api.py`` adds the rest).
        :class:`HandInUse` while another link of the Hand is connected and
        alive; one that failed its liveness check is closed and replaced."""
        hand = self.hands.get(hello.hand_id)
        if hand is not None and hand.link is not None and hand.link is not link:
            if hand.link.alive():
                self._refuse(hand, link)
                raise HandInUse(hello.hand_id, hand.link)
            log.warning(
                "audit: Hand %r from %s took the place of its link from %s, which did not "
                "answer a ping in time (presumed dead). If the new link is not yours: "
                "halfpi hand revoke %s, then give the Hand a new token",
                hello.hand_id, link.address, hand.link.address, hello.hand_id,
            )
            hand.link.close(CloseCode.GOING_AWAY, "presumed dead: a new link of this Hand "
                            "took its place")
        if hand is not None and hand.instance_id != hello.instance_id:
            self._lose_runs(hand.hand_id, "the Hand restarted")
        generation = (hand.generation if hand is not None else 0) + 1
        if hand is not None and hand.grace is not None:
            hand.grace.cancel()
        hand = HandState(
            hello.hand_id,
            principal_id,
            hello.instance_id,
            {
                "hostname": hello.info.hostname,
                "os": hello.info.os,
                "arch": hello.info.arch,
                "version": hello.info.version,
            },
            [t.name for t in hello.tools],
            list(hello.policy.roots) if hello.policy else [],
            dict(hello.policy.rules) if hello.policy else {},
            link,
            generation,
            self.clock(),
        )
        self.hands[hand.hand_id] = hand
        reported = {r.run_id for r in hello.runs}
        adopted = [rid for rid in sorted(reported) if self._alive(rid, hand.hand_id)]
        for run_id in adopted:
            self.runs[run_id].generation = generation
        # Runs the Mind still waits for but the Hand does not have: it never
        # received them, or lost them. Either way: lost, never silently re-sent.
        for run in list(self.runs.values()):
            if (
                run.hand_id == hand.hand_id
                and not RUN.is_terminal(run.state)
                and run.run_id not in reported
            ):
                self.finish(
                    run,
                    "lost",
                    {"error_category": "lost", "error": "the Hand no longer has this run"},
                )
        self._presence(hand.hand_id, True)
        if self.on_link is not None:
            self.on_link(hand.hand_id, True)
        return HandWelcome(hand_id=hand.hand_id, generation=generation, adopted=adopted,
                           abandon=sorted(reported - set(adopted)))

    def _refuse(self, hand: HandState, link: HandLink) -> None:
        """The audit of a refused second link: a log line naming both
        addresses (never the token) and the Hand's ``refused`` record."""
        assert hand.link is not None
        count = (hand.refused["count"] if hand.refused else 0) + 1
        hand.refused = {"count": count, "address": link.address, "at": self.clock()}
        if not worth_logging(count):  # a claimant that keeps retrying: 1st, 2nd, 4th…
            return
        log.warning(
            "audit: refused a second link for Hand %r from %s: its link from %s is "
            "connected and answering (closed 4029; refusal %d while it holds the Hand). "
            "If that link is not yours: halfpi hand revoke %s, then give the Hand a new token",
            hand.hand_id, link.address, hand.link.address, count, hand.hand_id,
        )
        conversations = {r.conversation_id for r in self.runs.values()
                         if r.hand_id == hand.hand_id and not RUN.is_terminal(r.state)}
        if conversations and self.on_audit is not None:
            self.on_audit(conversations, HandLinkRefused(
                hand_id=hand.hand_id, address=link.address, count=count))

    def _alive(self, run_id: str, hand_id: str) -> bool:
        run = self.runs.get(run_id)
        return run is not None and run.hand_id == hand_id and not RUN.is_terminal(run.state)

    def disconnect(self, link: HandLink) -> None:
        hand = self.hands.get(link.hand_id or "")
        if hand is None or hand.link is not link:
            return
        hand.link = None
        hand.disconnected_at = self.clock()
        for check_id, check in list(self.checks.items()):
            if check.hand_id == hand.hand_id:
                self._end_check(check_id, HandUnavailable(f"Hand {hand.hand_id!r} went away"))
        self._presence(hand.hand_id, False)
        if self.on_link is not None:
            self.on_link(hand.hand_id, False)
        hand.grace = self.scheduler.call_later(
            self.grace_s, self._lose_runs, hand.hand_id, "the Hand stayed away too long"
        )

    def _lose_runs(self, hand_id: str, why: str) -> None:
        for run in list(self.runs.values()):
            if run.hand_id == hand_id and not RUN.is_terminal(run.state):
                self.finish(run, "lost", {"error_category": "lost", "error": why})

    def connected(self, hand_id: str) -> bool:
        hand = self.hands.get(hand_id)
        return hand is not None and hand.link is not None

    def default_hand(self) -> str | None:
        connected = sorted(h for h, s in self.hands.items() if s.link is not None)
        if self.local_label in connected:
            return self.local_label
        return connected[0] if connected else None

    def fault(self, link: HandLink, what: str) -> None:
        """A Hand broke the protocol's limits or lied (DESIGN §8): refuse the
        frame (the caller does not pass it on), close it, lose its runs."""
        hand_id = link.hand_id or "?"
        log.warning("Hand %s is faulty: it sent %s; closing it (4009)", hand_id, what)
        self._lose_runs(hand_id, f"the Hand broke the protocol: it sent {what}")
        link.close(CloseCode.PROTOCOL_VIOLATION, "hand limits broken")

    # -- policy checks -----------------------------------------------------------

    def check(self, hand_id: str, tool: str, args: dict[str, Any]) -> asyncio.Future[Decision]:
        """Ask the Hand for its policy verdict on a tool call (``hand.check``).
        Fails with :class:`HandUnavailable` if the Hand is gone or silent."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Decision] = loop.create_future()
        hand = self.hands.get(hand_id)
        if hand is None or hand.link is None:
            done.set_exception(HandUnavailable(f"Hand {hand_id!r} is not connected"))
            return done
        check_id = f"k{next(self._check_ids)}"
        check = PolicyCheck(hand_id, done)
        check.timer = self.scheduler.call_later(
            self.check_timeout_s,
            self._end_check,
            check_id,
            HandUnavailable(f"Hand {hand_id!r} did not answer the policy check in time"),
        )
        self.checks[check_id] = check
        hand.link.send(HandCheck(check_id=check_id, tool=tool, args=args))
        return done

    def on_checked(self, link: HandLink, msg: HandChecked) -> None:
        check = self.checks.get(msg.check_id)
        if check is None or check.hand_id != link.hand_id:
            log.warning("refused a verdict for unknown check %s", msg.check_id)
            return
        self._end_check(msg.check_id, Decision(Verdict(msg.verdict), msg.reason, msg.category))

    def _end_check(self, check_id: str, outcome: Decision | Exception) -> None:
        check = self.checks.pop(check_id, None)
        if check is None:
            return
        if check.timer is not None:
            check.timer.cancel()
        if check.done.done():  # the caller stopped waiting (its chat was cancelled)
            return
        if isinstance(outcome, Exception):
            check.done.set_exception(outcome)
        else:
            check.done.set_result(outcome)

    # -- runs ------------------------------------------------------------------------

    def start(self, run: ToolRun) -> None:
        self.runs[run.run_id] = run
        hand = self.hands.get(run.hand_id)
        if hand is None or hand.link is None:
            self.finish(
                run,
                "failed",
                {
                    "error_category": "hand_unavailable",
                    "error": f"Hand {run.hand_id!r} is not connected",
                },
            )
            return
        run.generation = hand.generation
        run.deadline = self.scheduler.call_later(
            run.timeout_s + DEADLINE_SLACK_S, self._expire, run
        )
        hand.link.send(HandRun(run_id=run.run_id, generation=run.generation, tool=run.tool,
                               args=run.args, timeout_s=run.timeout_s, approved=run.approved))

    def _expire(self, run: ToolRun) -> None:
        if not RUN.is_terminal(run.state):
            self.cancel(run)
            self.finish(
                run,
                "timed_out",
                {"error_category": "timeout", "error": "no result before the deadline"},
            )

    def cancel(self, run: ToolRun) -> None:
        """Propagate a cancel; the Hand's answer (or the first terminal) stands."""
        if RUN.is_terminal(run.state):
            return
        hand = self.hands.get(run.hand_id)
        if hand is not None and hand.link is not None:
            hand.link.send(HandCancel(run_id=run.run_id))
        else:
            # Unreachable: it is cancelled from here; if the Hand comes back
            # still running it, it is told to abandon it.
            self.finish(run, "cancelled", {"error_category": "cancelled"})

    def _run_of(self, link: HandLink, run_id: str, generation: int) -> ToolRun | None:
        run = self.runs.get(run_id)
        if run is None or run.hand_id != link.hand_id:
            log.warning("refused a message for unknown run %s", run_id)
            return None
        if generation != run.generation:
            log.warning(
                "refused a message of run %s from generation %s (current %s)",
                run_id,
                generation,
                run.generation,
            )
            return None
        return run

    def on_started(self, link: HandLink, msg: HandStarted) -> None:
        run = self._run_of(link, msg.run_id, msg.generation)
        if run is not None and run.state == "queued":
            run.state = RUN.check(run.state, "running")
            if run.on_state is not None:
                run.on_state("running")

    def on_progress(self, link: HandLink, msg: HandProgress) -> None:
        run = self._run_of(link, msg.run_id, msg.generation)
        if run is None or RUN.is_terminal(run.state):
            return
        broken = run.progress.take(msg.data)
        if broken is not None:
            self.fault(link, f"{broken} for run {run.run_id}")
            return
        if run.on_progress is not None:
            run.on_progress(msg.kind, msg.data, msg.gap)

    def on_result(self, link: HandLink, msg: HandResult) -> None:
        run = self.runs.get(msg.run_id)
        stale = (
            run is not None
            and not RUN.is_terminal(run.state)
            and (msg.generation != run.generation or run.hand_id != link.hand_id)
        )
        if stale:
            log.warning(
                "refused a result of run %s from generation %s (current %s)",
                msg.run_id,
                msg.generation,
                run.generation if run else None,
            )
            return  # not acked: the Hand re-sends it once the run is adopted
        broken = result_violation(msg)
        if broken is not None:
            self.fault(link, f"{broken} in the result of run {msg.run_id}")
            return
        if run is not None and run.hand_id == link.hand_id:
            result = {
                k: getattr(msg, k)
                for k in (
                    "exit_code",
                    "stdout",
                    "stderr",
                    "output_bytes",
                    "digest",
                    "truncated",
                    "error_category",
                    "error",
                    "size",
                    "confined",
                    "confinement",
                )
            }
            self.finish(run, msg.status, result)
        link.send(HandAck(run_ids=[msg.run_id]))

    def finish(self, run: ToolRun, status: str, result: dict[str, Any]) -> bool:
        """First terminal state wins (I10); True if this one applied."""
        if not RUN.first_terminal_wins(run.state, status):
            return False
        run.state = status
        self.finished[status] += 1
        if run.deadline is not None:
            run.deadline.cancel()
        if run.on_state is not None:
            run.on_state(status)
        if not run.done.done():
            run.done.set_result({"status": status, **result})
        self.runs.pop(run.run_id, None)
        self.ended[run.run_id] = status
        if len(self.ended) > ENDED_KEPT:
            self.ended.popitem(last=False)
        return True
