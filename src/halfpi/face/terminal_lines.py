"""The terminal face's lines around the conversation, as words.

The conversation list's rows, the bar (approvals here and elsewhere,
background tasks) and the connection line say what is true now; these
plain functions (no Textual) turn the SDK's state into those words, so
they are tested directly and the app only draws them. Times are
arguments: ``wall`` for an approval's ``expires_at`` (the Mind's wall
clock), ``now`` for the SDK's monotonic status times.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from rich.text import Text

from halfpi.core.events import ApprovalPending, ApprovalRequested, ConversationInfo, present
from halfpi.face.results import Status
from halfpi.face.terminal_widgets import UNTITLED, clock, conversation_label
from halfpi.face.view import ConversationView

# Connected, with a Mind to hear commands.
CONNECTED = frozenset({"live", "resuming", "resumed", "resynced"})
# How the connection came back: said for NEWS_S seconds, then "live".
NEWS = frozenset({"resumed", "resynced"})
NEWS_S = 3.0
TASK_LINES = 5  # background tasks shown in the bar, the newest


def connection_line(
    status: Status, now: float, news_at: float, view: ConversationView | None
) -> str:
    """The connection line: where, what, why, and a countdown while it waits.
    "resumed…"/"resynced…" is news: after ``NEWS_S`` it says "live" again."""
    if status.state == "reconnecting":
        text = f"○ {status.describe(now)}"
    elif status.state in ("connecting", "closed"):
        text = f"○ {status.state} · {status.url}"
    elif status.state == "refused":
        text = f"✗ {status.describe()}"
    elif status.state in NEWS and now - news_at >= NEWS_S:
        text = f"● live · {status.url}"
    else:
        text = f"● {status.describe()} · {status.url}"
    if view is not None and any(r.status == "cancel_requested" for r in view.streaming.values()):
        text += " · cancel requested"
    return text


def left(expires_at: float, wall: float) -> str:
    """Time left before ``expires_at`` as m:ss ("" when it has no expiry)."""
    return clock(expires_at - wall) if expires_at else ""


def waiting_here(pending: Mapping[str, ApprovalRequested], deciding: Collection[str],
                 wall: float) -> str:
    """The open conversation's approval: what, how long it has left, and
    what to press — or that the decision made here is on its way."""
    undecided = [a for a in pending.values() if a.approval_id not in deciding]
    if not undecided:
        tool = next(iter(pending.values())).tool
        return f"⏳ your decision on {tool} is on its way to the Mind"
    first = undecided[0]
    time_left = left(first.expires_at, wall)
    return (
        f"⚠ approval waiting here: {first.tool}"
        + (f" ({time_left} left)" if time_left else "")
        + " — ctrl+a allow once · ctrl+d deny once"
    )


def approvals_elsewhere(approvals: Mapping[str, ApprovalPending],
                        current: str | None) -> list[ApprovalPending]:
    """Approvals waiting in other conversations, the first to expire first."""
    return sorted(
        (a for a in approvals.values() if a.conversation_id != current),
        key=lambda a: a.expires_at,
    )


def bar_lines(
    view: ConversationView | None,
    deciding: Collection[str],
    elsewhere: list[ApprovalPending],
    conversations: Mapping[str, ConversationInfo],
    wall: float,
    reachable: bool,
) -> list[str]:
    """The bar above the connection line: approvals here and elsewhere, tasks."""
    lines = []
    if view is not None and view.pending_approvals:
        lines.append(waiting_here(view.pending_approvals, deciding, wall))
    if elsewhere:
        first = elsewhere[0]
        known = conversations.get(first.conversation_id)
        where = (present(known.name) if known is not None else None) or UNTITLED
        count = len(elsewhere)
        noun = "approval" if count == 1 else "approvals"
        lines.append(
            f"⚠ {count} {noun} waiting in other conversations: {first.tool} "
            f"in “{where}” ({clock(first.expires_at - wall)} left)"
            " — ctrl+g go there"
        )
    if view is not None and view.tasks:
        # Background tasks (DESIGN §8): a line each, the newest few.
        lines.extend(f"⚙ {line}" for line in view.task_lines()[-TASK_LINES:])
    if lines and not reachable:
        lines.append("(as last known: the Mind is unreachable; it re-reads them when back)")
    return lines


def conversation_rows(
    conversations: Iterable[ConversationInfo],
    views: Mapping[str, ConversationView],
    approvals: Mapping[str, ApprovalPending],
    current: str | None,
) -> list[tuple[str, Text]]:
    """The list's rows, ``(conversation_id, label)``: the open one marked,
    with how many approvals wait there and whether a reply streams."""
    waiting: dict[str, int] = {}
    for a in approvals.values():
        waiting[a.conversation_id] = waiting.get(a.conversation_id, 0) + 1
    rows = []
    for c in conversations:
        cid = c.id
        view = views.get(cid)
        label = conversation_label(
            c,
            current=cid == current,
            approvals=waiting.get(cid, 0),
            streaming=bool(view is not None and view.streaming),
        )
        rows.append((cid, label))
    return rows
