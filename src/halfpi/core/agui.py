"""AG-UI translation rules (DESIGN §9, docs/protocol.md §19): the Mind's
frames of one conversation as the AG-UI events of one run.

An AG-UI run is one halfpi chat seen by one stream: ``runId`` is the chat's
``request_id`` (a resumed run — one that answers interrupts — follows the
chat that waited on them). :class:`RunTranslator` is fed the frames the
stream's subscription receives, in order, and answers the AG-UI events they
mean, each with the :class:`Mark` a reader stands at once it has seen it:

- a delta of the chat → ``TEXT_MESSAGE_START`` (first) + ``…_CONTENT``;
- ``chat.message`` (the user's) → a user text message;
- ``chat.tool_called`` → ``TOOL_CALL_START/ARGS/END`` (args as projected for
  the stream's detail mode, I9), ``chat.tool_completed`` → ``TOOL_CALL_RESULT``;
- ``approval.requested`` → ``RUN_FINISHED`` with an *interrupt* outcome (AG-UI
  1.0): the chat waits on, and the next run answers it with ``resume``;
- the chat's end → ``RUN_FINISHED`` (success or cancelled) or ``RUN_ERROR``;
- a ``face.snapshot`` / ``face.reset`` → ``MESSAGES_SNAPSHOT`` of the thread,
  then whatever the snapshot says of the chat (still replying, waiting on an
  approval, ended).

Message ids are derived, never stored: the user's message of chat ``R`` is
``R:user``, its reply ``R:reply``, a tool's result ``<tool_call_id>:result``;
:func:`messages_of` builds the same messages from a snapshot, so what a
client assembled from the events equals the Mind's ``MESSAGES_SNAPSHOT``.

Marks. Several AG-UI events can come from one frame, and a stream can be cut
between them: a mark is ``(cursor, skip, open)`` — the cursor of the last
frame whose events were all seen, how many events of the next frame were seen,
and whether the reply's text message was open at the cursor. A stream resumed
from a mark re-derives that frame, drops what was seen and first re-sends the
``RUN_STARTED`` and the ``…_START`` of what is still open (AG-UI's verifier
rejects content without its start), so the reader gets no duplicate and no gap.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from ag_ui.core import (
    PROTOCOL_VERSION,
    AssistantMessage,
    BaseEvent,
    FunctionCall,
    Interrupt,
    MessagesSnapshotEvent,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from ag_ui.core import (
    Message as AguiMessage,
)

# What an approval interrupt expects back in ``resume[].payload``.
APPROVAL_REASON = "tool_approval"
DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "decision": {"enum": ["allow_once", "deny_once"]},
        "reason": {"type": "string", "maxLength": 1024},
    },
    "required": ["decision"],
}
ENDED_OK = frozenset({"completed", "succeeded"})


def user_id(request_id: str) -> str:
    return f"{request_id}:user"


def reply_id(request_id: str) -> str:
    return f"{request_id}:reply"


def result_id(tool_call_id: str) -> str:
    return f"{tool_call_id}:result"


# -- marks -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mark:
    """Where a reader of one run's stream stands (see the module docstring)."""

    cursor: str | None = None
    skip: int = 0
    open: bool = False

    def slot(self) -> str:
        """The mark's skip and open flag, cursor-shaped (``o.2``, ``c.0``), so
        the stream's resume token seals it beside the cursor."""
        return f"{'o' if self.open else 'c'}.{self.skip}"

    @classmethod
    def of(cls, cursor: str | None, slot: str | None) -> Mark:
        """A mark from a token's cursor and slot; a malformed slot is no skip."""
        flag, _, skip = (slot or "").partition(".")
        if flag not in ("o", "c") or not skip.isdigit() or len(skip) > 4:
            return cls(cursor)
        return cls(cursor, int(skip), flag == "o")


# -- projections shared by the live events and the snapshot -----------------------------


def arguments_text(args: Any) -> str:
    """A tool call's arguments as AG-UI carries them (a JSON string); empty
    when the stream's detail mode shows none (summary, I9)."""
    if args is None or args is msgspec.UNSET:
        return ""
    return msgspec.json.encode(args).decode()


_RESULT_FIELDS = ("success", "error_category", "output_bytes", "digest", "truncated", "result")


def result_text(data: dict[str, Any]) -> str:
    """A tool's outcome as the content of its tool message: the summary fields
    always, the output itself only where the detail mode shows it."""
    shown = {k: data[k] for k in _RESULT_FIELDS if data.get(k) is not None}
    return msgspec.json.encode(shown, order="sorted").decode()


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, tz=datetime.UTC).isoformat()


def interrupt_of(approval: dict[str, Any]) -> Interrupt:
    return Interrupt(
        id=approval["approval_id"],
        reason=APPROVAL_REASON,
        message=approval.get("reason") or f"allow {approval.get('tool', '?')}?",
        tool_call_id=approval.get("tool_call_id"),
        response_schema=DECISION_SCHEMA,
        expires_at=iso(float(approval.get("expires_at") or 0)) if approval.get("expires_at")
        else None,
        metadata={"halfpi": {"tool": approval.get("tool", "?"),
                             "args_digest": approval.get("args_digest", "")}},
    )


def _tool_messages(records: list[dict[str, Any]]) -> list[AguiMessage]:
    return [
        ToolMessage(id=result_id(r["tool_call_id"]), content=result_text(r),
                    tool_call_id=r["tool_call_id"])
        for r in records
        if r.get("success") is not None
    ]


def _assistant(request_id: str, content: str, records: list[dict[str, Any]]) -> AguiMessage | None:
    calls = [
        ToolCall(id=r["tool_call_id"],
                 function=FunctionCall(name=r.get("tool", "?"),
                                       arguments=arguments_text(r.get("args"))))
        for r in records
    ]
    if not content and not calls:
        return None  # the chat showed nothing: a client built no message either
    return AssistantMessage(id=reply_id(request_id), content=content or None,
                            tool_calls=calls or None)


def messages_of(snapshot: dict[str, Any]) -> list[AguiMessage]:
    """A snapshot's messages as AG-UI messages: each chat's user message, its
    reply (text and tool calls) and its tool results, in the order a client
    that followed the events assembled them."""
    by_request: dict[str, list[dict[str, Any]]] = {}
    for record in snapshot.get("tool_history", []):
        by_request.setdefault(record.get("request_id") or "", []).append(record)
    for records in by_request.values():
        records.sort(key=lambda r: r.get("seq", 0))
    out: list[AguiMessage] = []
    for m in snapshot.get("messages", []):
        rid = m.get("request_id")
        if m["role"] == "user":
            out.append(UserMessage(id=user_id(rid) if rid else f"m{m['seq']}",
                                   content=m.get("content", "")))
        elif m["role"] == "assistant" and rid:
            records = by_request.get(rid, [])
            reply = _assistant(rid, m.get("content", ""), records)
            if reply is not None:
                out.append(reply)
                out.extend(_tool_messages(records))
    for pending in snapshot.get("pending_chats", []):
        rid = pending["request_id"]
        records = by_request.get(rid, [])
        reply = _assistant(rid, pending.get("text_so_far", ""), records)
        if reply is not None:
            out.append(reply)
            out.extend(_tool_messages(records))
    return out


def _entity(event: BaseEvent) -> str:
    """The message or tool call an event opens or closes."""
    return str(getattr(event, "message_id", None) or getattr(event, "tool_call_id", ""))


# -- the translator ---------------------------------------------------------------------


@dataclass
class RunTranslator:
    """The AG-UI events of one run, from the frames of its stream.

    ``chat_id`` is the request_id of the chat the run follows (None: the
    thread has no chat to follow; the first snapshot ends the run).
    ``mark`` is where the reader stands (a resumed stream)."""

    thread_id: str
    run_id: str
    chat_id: str | None
    mark: Mark = field(default_factory=Mark)
    text_open: bool = False
    finished: bool = False
    started: bool = False
    _skip: int = 0

    def __post_init__(self) -> None:
        self.text_open = self.mark.open
        self._skip = self.mark.skip

    # -- what opens a stream ---------------------------------------------------------

    def opening(self) -> list[tuple[BaseEvent, Mark]]:
        """``RUN_STARTED`` (and the reply's ``TEXT_MESSAGE_START`` when the
        reader stands inside it); deferred while events of a cut frame are
        still to be dropped (they decide what is open)."""
        if self._skip:
            return []
        return self._preamble(self.text_open, [])

    def _preamble(self, text_open: bool, tools: Sequence[BaseEvent]
                  ) -> list[tuple[BaseEvent, Mark]]:
        self.started = True
        events: list[BaseEvent] = [RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id,
                                                   protocol_version=PROTOCOL_VERSION)]
        if text_open and self.chat_id is not None:
            events.append(TextMessageStartEvent(message_id=reply_id(self.chat_id),
                                                role="assistant"))
        events.extend(tools)
        return [(e, self.mark) for e in events]

    # -- frames ------------------------------------------------------------------------

    def frame(self, type_: str, payload: dict[str, Any], cursor: str | None
              ) -> list[tuple[BaseEvent, Mark]]:
        """The events of one frame (``cursor``: where it puts the reader,
        None for a frame that moves nothing)."""
        if self.finished:
            return []
        before = self.mark
        open_before = self.text_open
        if type_ in ("face.snapshot", "face.reset"):
            snapshot = payload if type_ == "face.snapshot" else payload["snapshot"]
            out: list[tuple[BaseEvent, Mark]] = []
            if self._skip:  # a reset instead of the replay: the snapshot rules
                self._skip = 0
                out = self._preamble(self.text_open, [])
            raw = self._snapshot(snapshot)
            cursor = snapshot.get("cursor")
            self.mark = Mark(cursor, 0, self.text_open)
            # Cut inside these: the same snapshot path again, from where it was.
            marks = [before] * (len(raw) - 1) + [self.mark] if raw else []
            return out + list(zip(raw, marks, strict=True))
        raw = self._events(type_, payload)
        if cursor is not None:
            self.mark = Mark(cursor, 0, self.text_open)
        if not raw:
            return []
        marks = [Mark(before.cursor, j, open_before) for j in range(1, len(raw))]
        marks.append(self.mark if cursor is not None else before)
        pairs = list(zip(raw, marks, strict=True))
        if self._skip:
            seen, pairs = pairs[: self._skip], pairs[self._skip :]
            self._skip = 0
            text_open, reopen = open_before, list[BaseEvent]()
            for event, _ in seen:  # what the reader saw start and not end
                if isinstance(event, (TextMessageStartEvent, ToolCallStartEvent)):
                    reopen.append(event)
                elif isinstance(event, (TextMessageEndEvent, ToolCallEndEvent)):
                    key = _entity(event)
                    if any(_entity(e) == key for e in reopen):
                        reopen = [e for e in reopen if _entity(e) != key]
                    elif self.chat_id is not None and key == reply_id(self.chat_id):
                        text_open = False
            self.mark = before  # the preamble is where the reader stood
            preamble = self._preamble(text_open, reopen)
            self.mark = marks[-1]
            pairs = preamble + pairs
        return pairs

    def _close_text(self) -> list[BaseEvent]:
        if self.text_open and self.chat_id is not None:
            self.text_open = False
            return [TextMessageEndEvent(message_id=reply_id(self.chat_id))]
        return []

    def _events(self, type_: str, p: dict[str, Any]) -> list[BaseEvent]:
        chat = self.chat_id
        if chat is None:
            return []
        if type_ == "face.chat.delta":
            if p.get("request_id") != chat or not p.get("text"):
                return []
            out: list[BaseEvent] = []
            if not self.text_open:
                self.text_open = True
                out.append(TextMessageStartEvent(message_id=reply_id(chat), role="assistant"))
            out.append(TextMessageContentEvent(message_id=reply_id(chat), delta=p["text"]))
            return out
        if type_ != "face.event":
            return []
        kind, data = p.get("type"), p.get("data") or {}
        if data.get("request_id") != chat:
            return []
        if kind == "chat.message" and data.get("role", "user") == "user":
            mid = user_id(chat)
            return [TextMessageStartEvent(message_id=mid, role="user"),
                    TextMessageContentEvent(message_id=mid, delta=data.get("content", "")),
                    TextMessageEndEvent(message_id=mid)]
        if kind == "chat.tool_called":
            call = data["tool_call_id"]
            out = self._close_text()
            out.append(ToolCallStartEvent(tool_call_id=call, tool_call_name=data.get("tool", "?"),
                                          parent_message_id=reply_id(chat)))
            args = arguments_text(data.get("args"))
            if args:
                out.append(ToolCallArgsEvent(tool_call_id=call, delta=args))
            out.append(ToolCallEndEvent(tool_call_id=call))
            return out
        if kind == "chat.tool_completed":
            call = data["tool_call_id"]
            return [ToolCallResultEvent(message_id=result_id(call), tool_call_id=call,
                                        content=result_text(data), role="tool")]
        if kind == "approval.requested":
            return self._interrupt([data])
        if kind in ("chat.completed", "chat.failed", "chat.cancelled", "chat.interrupted"):
            status = kind.removeprefix("chat.")
            return self._end(status, data.get("error_code"), data.get("reason"))
        return []

    def _interrupt(self, approvals: list[dict[str, Any]]) -> list[BaseEvent]:
        out = self._close_text()
        self.finished = True
        out.append(RunFinishedEvent(
            thread_id=self.thread_id, run_id=self.run_id,
            outcome=RunFinishedInterruptOutcome(interrupts=[interrupt_of(a) for a in approvals]),
        ))
        return out

    def _end(self, status: str, error_code: str | None, reason: str | None) -> list[BaseEvent]:
        out = self._close_text()
        self.finished = True
        if status in ENDED_OK:
            out.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id))
        elif status == "cancelled":
            out.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id,
                                        outcome=RunFinishedCancelledOutcome()))
        else:
            code = "interrupted" if status == "interrupted" else (error_code or status)
            message = reason or {
                "interrupted": "the Mind restarted during this run: the reply kept what was "
                               "shown and is not re-run (start a new run)",
            }.get(status, f"the run ended {status}")
            out.append(RunErrorEvent(message=message, code=code))
        return out

    def _snapshot(self, snapshot: dict[str, Any]) -> list[BaseEvent]:
        out: list[BaseEvent] = [MessagesSnapshotEvent(messages=messages_of(snapshot))]
        chat = self.chat_id
        if chat is None:
            self.finished = True
            out.append(RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id))
            return out
        waiting = [a for a in snapshot.get("pending_approvals", [])
                   if a.get("request_id") == chat]
        if waiting:
            return out + self._interrupt(waiting)
        for pending in snapshot.get("pending_chats", []):
            if pending["request_id"] == chat:
                if pending.get("text_so_far") and not self.text_open:
                    self.text_open = True  # the snapshot holds its text: content continues
                    out.append(TextMessageStartEvent(message_id=reply_id(chat), role="assistant"))
                return out
        for m in snapshot.get("messages", []):
            if m.get("request_id") == chat and m["role"] == "assistant":
                return out + self._end(m.get("status") or "completed", m.get("error_code"),
                                       m.get("reason"))
        return out  # not admitted yet: its events come live
