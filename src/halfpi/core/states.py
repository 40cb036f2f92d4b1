"""Every state machine of halfpi, each as one transition table (STYLE §2).

An illegal transition raises :class:`IllegalTransition`; a transition out of
a terminal state is refused by :meth:`Machine.first_terminal_wins`, which is
how I10 ("first valid decision wins") is enforced everywhere. The diagrams
in ``docs/states.md`` are generated from these tables
(``python -m halfpi.core.states``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from halfpi.errors import IllegalTransition


@dataclass(frozen=True)
class Machine:
    name: str
    initial: str
    transitions: Mapping[str, frozenset[str]]

    @property
    def states(self) -> frozenset[str]:
        found = set(self.transitions)
        for targets in self.transitions.values():
            found |= targets
        return frozenset(found)

    def is_terminal(self, state: str) -> bool:
        return not self.transitions.get(state)

    def check(self, current: str, target: str) -> str:
        """Return ``target`` if the table allows ``current → target``; else raise."""
        if target not in self.transitions.get(current, frozenset()):
            raise IllegalTransition(f"{self.name}: {current} → {target} is not allowed")
        return target

    def first_terminal_wins(self, current: str, target: str) -> bool:
        """True if ``target`` applies; False if ``current`` is already terminal (I10).

        A second terminal transition is not an error: the caller converges on
        the state that stands. A non-terminal illegal move still raises.
        """
        if self.is_terminal(current):
            return False
        self.check(current, target)
        return True

    def mermaid(self) -> str:
        lines = ["stateDiagram-v2", f"    [*] --> {self.initial}"]
        for source in sorted(self.transitions):
            for target in sorted(self.transitions[source]):
                lines.append(f"    {source} --> {target}")
        for state in sorted(self.states):
            if self.is_terminal(state):
                lines.append(f"    {state} --> [*]")
        return "\n".join(lines)


def _table(spec: Mapping[str, set[str]]) -> dict[str, frozenset[str]]:
    return {state: frozenset(targets) for state, targets in spec.items()}


CHAT_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "interrupted"})

# A chat run (DESIGN §5). ``cancel_requested`` is what a Face shows until the
# terminal state arrives; the agent may still finish first (first terminal wins).
CHAT = Machine(
    "chat",
    "running",
    _table(
        {
            "running": {"cancel_requested", *CHAT_TERMINAL},
            "cancel_requested": set(CHAT_TERMINAL),
        }
    ),
)

REQUEST_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "interrupted"})

# A request record in the registry (DESIGN §5, I5): admitted as ``accepted``,
# then exactly one outcome (``RequestRecord.finish`` in memory; the Store's
# ``FinishedRequest``, which it applies only to a record not yet finished).
# An instant command (a create, a decision) goes through both in one write.
REQUEST = Machine("request", "accepted", _table({"accepted": set(REQUEST_TERMINAL)}))

# A connection, Face or Hand, as its session sees it. ``closing``: this side
# asked the transport to close; ``closed``: the transport is gone — which may
# come at any moment, without a ``closing`` (the peer left, the network died).
CONNECTION = Machine(
    "connection",
    "awaiting_hello",
    _table(
        {
            "awaiting_hello": {"open", "closing", "closed"},
            "open": {"closing", "closed"},
            "closing": {"closed"},
        }
    ),
)

RUN_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost"})

# A tool run on a Hand (DESIGN §8). ``lost``: the Hand went away beyond its
# grace period or restarted, so the outcome is unknown — never re-run (I11).
RUN = Machine(
    "run",
    "queued",
    _table(
        {
            "queued": {"running", *RUN_TERMINAL},
            "running": set(RUN_TERMINAL),
        }
    ),
)

TASK_TERMINAL = RUN_TERMINAL

# A background task on a Hand (DESIGN §8): a run's states and moves. The
# Hand is its authority; a Hand that restarts marks its unfinished tasks
# ``lost`` (never re-run).
TASK = Machine("task", RUN.initial, RUN.transitions)

APPROVAL_TERMINAL = frozenset({"allowed", "denied", "expired", "cancelled"})

# An approval (DESIGN §7): the first valid decision wins (I10).
APPROVAL = Machine("approval", "pending", _table({"pending": set(APPROVAL_TERMINAL)}))

OUTBOX_TERMINAL = TASK_TERMINAL | {"dead"}

# The Mind's record of a background task, its outbox row (DESIGN §8): the
# Hand's states as the Hand last reported them, plus ``dead``: the outbox
# gave up delivering a task no Hand ever acknowledged (its attempts were all
# spent). Once a Hand has the task it is the authority, and no task it runs
# is ever declared dead.
OUTBOX = Machine(
    "outbox",
    TASK.initial,
    _table(
        {
            "queued": {"running", "dead", *TASK_TERMINAL},
            "running": set(TASK_TERMINAL),
        }
    ),
)

# The event a chat's terminal status publishes to every subscriber.
CHAT_EVENT_FOR_STATUS: Mapping[str, str] = {
    "succeeded": "chat.completed",
    "failed": "chat.failed",
    "cancelled": "chat.cancelled",
    "timed_out": "chat.failed",
    "interrupted": "chat.interrupted",
}

MACHINES = (CHAT, REQUEST, CONNECTION, RUN, TASK, APPROVAL, OUTBOX)


def render_docs() -> str:
    parts = [
        "# State machines",
        "",
        "Generated by `python -m halfpi.core.states` from the tables in "
        "`src/halfpi/core/states.py`; do not edit by hand.",
    ]
    for machine in MACHINES:
        parts += ["", f"## {machine.name}", "", "```mermaid", machine.mermaid(), "```"]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(render_docs(), end="")
