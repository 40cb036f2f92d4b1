"""The terminal face's widgets and the words they show.

Everything here draws text that came from the Mind, a model or a tool; all
of it passes :func:`escape_controls` first, so nothing can move the cursor,
repaint the screen or set the window title. The functions that turn view
state into words are plain (no Textual), so the words are tested directly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from typing import Any

from msgspec import UNSET
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, ScrollableContainer, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, Footer, Input, Markdown, OptionList, Static

from halfpi.core.events import ApprovalRequested, ConversationInfo, present
from halfpi.face.render import escape_controls, preformatted
from halfpi.face.terminal_input import Composer
from halfpi.face.view import ConversationView, StreamingReply, ToolCard, ViewMessage

ARGS_PREVIEW = 90
UNSAVED_PREVIEW = 60  # characters of an interrupted reply's unsaved end shown
OUTPUT_LINES = 12  # lines of a tool's output a card shows before it scrolls
LIST_WIDTH = 28  # characters a conversation's line may take in the list
UNTITLED = "untitled"


# -- words -------------------------------------------------------------------------


def reply_header(message: ViewMessage) -> str:
    """``you``, ``agent``, or ``agent · failed (agent_bad_input)``."""
    if message.role == "user":
        return "you"
    if message.status in (None, "succeeded"):
        return "agent"
    code = f" ({message.error_code})" if message.error_code else ""
    return f"agent · {message.status}{code}"


def unsaved_note(unsaved: str) -> str:
    """Says that the end of an interrupted reply was shown but not saved
    (the Mind keeps a reply by checkpoints), and which words."""
    words = " ".join(unsaved.split())
    if len(words) > UNSAVED_PREVIEW:
        words = "…" + words[-(UNSAVED_PREVIEW - 1):]
    return escape_controls(f"… (the last words shown were not saved: “{words}”)")


def args_preview(args: Any) -> str:
    if args is None:
        return ""
    text = json.dumps(args, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= ARGS_PREVIEW else text[: ARGS_PREVIEW - 1] + "…"


def tool_line(view: ConversationView, card: ToolCard) -> str:
    """One tool call, saying what is true of it now."""
    phase = view.tool_phase(card)
    parts = [f"  ⚙ {card.tool}"]
    preview = args_preview(card.args)
    if preview:
        parts.append(f" {preview}")
    parts.append(f" · {phase}")
    if card.output_bytes is not None and card.status != "running" and card.output_bytes:
        parts.append(f" · {card.output_bytes} bytes")
    if phase == "awaiting approval":
        parts.append(" — ctrl+a allow once · ctrl+d deny once")
    return escape_controls("".join(parts))


def card_output(card: ToolCard) -> str:
    """What a tool printed, ready for the terminal ("" when nothing to show)."""
    text = preformatted(card.output or "")
    if card.truncated and card.output:
        text += f"\n… (cut: {card.output_bytes} bytes in all)"
    return text


def streaming_header(reply: StreamingReply) -> str:
    if reply.status == "cancel_requested":
        return "agent · cancel requested…"
    return "agent · streaming… (ctrl+x cancels)"


def conversation_label(
    conversation: ConversationInfo, *, current: bool, approvals: int, streaming: bool
) -> Text:
    name = escape_controls(present(conversation.name) or UNTITLED)
    marks = (f" ⚠{approvals if approvals > 1 else ''}" if approvals else "") + (
        " …" if streaming else ""
    )
    room = LIST_WIDTH - 2 - len(marks)
    if len(name) > room:
        name = name[: room - 1] + "…"
    label = Text("▸ " if current else "  ", style="bold" if current else "")
    label.append(name, style="bold" if current else "")
    label.append(marks, style="bold yellow" if approvals else "dim")
    return label


def clock(seconds: float) -> str:
    seconds = max(0, math.ceil(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


# -- the conversation log -----------------------------------------------------------


class MessageBox(Vertical):
    """One finished message: who, what happened to it (for a reply that did
    not succeed: its status and reason), and its text."""

    DEFAULT_CSS = """
    MessageBox { height: auto; margin: 0 0 1 0; }
    MessageBox > .role { text-style: bold; }
    MessageBox > .reason { color: $error; }
    MessageBox > .empty { color: $text-muted; }
    MessageBox > Markdown { margin: 0; padding: 0; }
    MessageBox > Markdown > * { margin: 0; }
    """

    def __init__(self, message: ViewMessage) -> None:
        self.message = message
        super().__init__(classes=f"message {message.role}")

    def compose(self) -> ComposeResult:
        m = self.message
        yield Static(Text(reply_header(m)), classes="role")
        if m.role == "assistant" and m.status not in (None, "succeeded"):
            yield Static(Text(f"✗ {escape_controls(m.reason or m.status or '')}"), classes="reason")
        if m.role == "user":
            yield Static(Text(escape_controls(m.content)))
        elif m.content:
            yield Markdown(escape_controls(m.content))
        else:
            yield Static(Text("(no text)"), classes="empty")
        if m.unsaved:
            yield Static(Text(unsaved_note(m.unsaved)), classes="empty")


class TypeThrough(ScrollableContainer):
    """A scrollable part of the log: ↑/↓/←/→ scroll it once focused; typing
    goes to the message box instead of being lost."""

    def on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character:
            event.stop()
            event.prevent_default()
            message_box = self.app.query_one("#input", Composer)
            message_box.focus()
            message_box.insert_text_at_cursor(event.character)


class ToolBox(Vertical):
    """One tool call: a line saying what is true of it and, under it, what it
    printed — preformatted (line breaks and columns kept, never wrapped), at
    most ``OUTPUT_LINES`` high and scrollable both ways, as the web face
    shows it. Its control characters are escaped (:func:`preformatted`)."""

    DEFAULT_CSS = f"""
    ToolBox {{ height: auto; margin: 0 0 1 0; }}
    ToolBox > .line {{ color: $text-muted; }}
    ToolBox > .output {{ height: auto; max-height: {OUTPUT_LINES}; overflow: auto auto;
                        border-left: thick $panel-lighten-2; padding: 0 1; display: none; }}
    ToolBox > .output.shown {{ display: block; }}
    ToolBox > .output > Static {{ width: auto; }}
    """

    def __init__(self) -> None:
        super().__init__()
        self.line = Static(classes="line")
        self.output = TypeThrough(classes="output")
        self.text = Static()
        self._shown: str | None = None

    def compose(self) -> ComposeResult:
        yield self.line
        with self.output:
            yield self.text

    def show(self, state: tuple[str, str]) -> None:
        line, output = state
        self.line.update(Text(line))
        if output != self._shown:
            self._shown = output
            self.text.update(Text(output, no_wrap=True, overflow="ignore"))
            self.output.set_class(bool(output), "shown")


class StreamingBox(Vertical):
    """A reply as it streams: plain text, updated in place."""

    DEFAULT_CSS = """
    StreamingBox { height: auto; margin: 0 0 1 0; }
    StreamingBox > .role { text-style: bold; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.header = Static(classes="role")
        self.body = Static()

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.body

    def show(self, reply: StreamingReply) -> None:
        self.header.update(Text(streaming_header(reply)))
        self.body.update(Text(escape_controls(reply.text) + "▌"))


class SendingBox(Static):
    """A message the person sent that the Mind has not accepted yet: it is
    shown (never silently dropped) until it is accepted or refused."""

    DEFAULT_CSS = "SendingBox { height: auto; color: $text-muted; margin: 0 0 1 0; }"

    def __init__(self, text: str) -> None:
        super().__init__(Text(f"you · sending…\n{escape_controls(text)}"))


class ConversationLog(VerticalScroll):
    """The open conversation: messages and tool calls in log order (a call
    sits under its message, before its reply), then the replies still
    streaming, then what is being sent. Widgets are keyed, so a change
    updates one line instead of redrawing the conversation."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entries: dict[str, Widget] = {}

    async def clear(self) -> None:
        self.entries = {}
        await self.remove_children()

    def show(
        self, view: ConversationView | None, sending: dict[str, tuple[str, str | None]]
    ) -> None:
        """``sending``: key -> (text, request_id once known) of messages the
        Mind has not accepted yet; one leaves once its message is in the view."""
        entries: list[tuple[float, int, str, Callable[[], Widget], Any]] = []
        mine: set[str | None] = set()
        if view is not None:
            for m in view.messages:
                entries.append((m.seq, 0, f"m{m.seq}", partial(MessageBox, m), None))
            for card in view.tool_cards.values():
                state = (tool_line(view, card), card_output(card))
                entries.append((card.seq, 1, f"t{card.tool_call_id}", ToolBox, state))
            for i, reply in enumerate(view.streaming.values()):
                entries.append((math.inf, i, f"s{reply.request_id}", StreamingBox, reply))
            mine = {m.request_id for m in view.messages}
        for i, (key, (text, request_id)) in enumerate(sending.items()):
            if request_id is None or request_id not in mine:
                entries.append((math.inf, 1000 + i, key, partial(SendingBox, text), None))
        entries.sort(key=lambda e: (e[0], e[1]))
        wanted = {e[2] for e in entries}
        for key in [k for k in self.entries if k not in wanted]:
            self.entries.pop(key).remove()
        previous: Widget | None = None
        for _, _, key, make, state in entries:
            widget = self.entries.get(key)
            if widget is None:
                widget = self.entries[key] = make()
                first = next(iter(self.children), None)
                if previous is not None:
                    self.mount(widget, after=previous)
                elif first is not None:
                    self.mount(widget, before=first)
                else:
                    self.mount(widget)
            if isinstance(widget, ToolBox | StreamingBox):
                widget.show(state)
            previous = widget


# -- the conversation list -------------------------------------------------------------


class ConversationList(OptionList):
    """↑/↓ and Enter open a conversation. Typing a character here goes to the
    message box instead of being lost."""

    BINDINGS = [Binding("escape", "app.to_message", "Back to message")]

    def on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character:
            event.stop()
            event.prevent_default()
            message_box = self.app.query_one("#input", Composer)
            message_box.focus()
            message_box.insert_text_at_cursor(event.character)


# -- prompts -------------------------------------------------------------------------


class ApprovalScreen(ModalScreen[None]):
    """One approval prompt, bound to one approval for its whole life.

    Its decision goes to *its* approval (``decide(approval_id, decision)``),
    never to whichever is current when a key lands. It decides at most once,
    and closes at most once (:meth:`close`: deciding, or settled elsewhere,
    in any order — Textual's ``dismiss`` pops whatever screen is on top,
    so a second one would close the wrong screen or none).

    A key that reaches it before it was drawn (``armed``) was not meant for
    it: a person cannot answer a prompt they have not seen. Such a decision
    key decides nothing (the face says so). It decides only with its own
    keys — ctrl+a, ctrl+d, or a button reached with Tab (or the mouse) —
    never with Enter or Escape: a person typing a message hits those at any
    instant, and one landing as the prompt appears must not decide an
    approval they have not read. Printable keys and Enter go to the message
    box under it (``type_through``), so nothing typed is lost.
    """

    BINDINGS = [
        Binding("ctrl+a", "decide('allow_once')", "Allow once"),
        Binding("ctrl+d", "decide('deny_once')", "Deny once"),
        Binding("tab", "choose", "Choose a button"),
    ]
    AUTO_FOCUS = None  # no button is focused (Enter decides nothing) until Tab
    DEFAULT_CSS = """
    ApprovalScreen { align: center middle; }
    #prompt { width: 84%; height: auto; max-height: 80%; border: thick $warning;
              padding: 1 2; background: $panel; }
    #buttons { height: auto; margin-top: 1; }
    #buttons Button { margin-right: 2; }
    #countdown { color: $text-muted; }
    """

    def __init__(
        self,
        approval: ApprovalRequested,
        where: str,
        decide: Callable[[str, str], None],
        type_through: Callable[[events.Key], None],
        left: Callable[[], str] | None = None,
    ) -> None:
        super().__init__()
        self.approval = approval
        self.approval_id = approval.approval_id
        self.where = where
        self._decide = decide
        self._type_through = type_through
        self._left = left
        self.armed = False  # drawn: a key from now on was meant for it
        self.decision: str | None = None
        self.closed = False
        self.chosen: str | None = None  # the button Tab reached: "deny", "allow"

    def compose(self) -> ComposeResult:
        a = self.approval
        lines = [f"Approve tool {a.tool} in “{self.where}”?", a.reason]
        if a.args is not UNSET:
            lines.append(json.dumps(a.args, ensure_ascii=False, indent=1)[:2000])
        else:
            lines.append(f"arguments hidden (summary view); digest {a.args_digest}")
        lines.append("ctrl+a allow once · ctrl+d deny once · Tab then Enter chooses a button")
        lines.append("Typing (and Enter) goes on in your message box.")
        with Vertical(id="prompt"):
            yield Static(Text(escape_controls("\n".join(lines))))
            yield Static(self._countdown(), id="countdown")
            with Horizontal(id="buttons"):
                buttons = (Button("Deny once", id="deny", variant="error"),
                           Button("Allow once", id="allow", variant="success"))
                for button in buttons:
                    button.can_focus = False  # until Tab: Enter must not reach it
                    yield button
        yield Footer()

    def on_mount(self) -> None:
        self.tick()
        self.call_after_refresh(self._arm)

    def _arm(self) -> None:
        if self.closed or not self.is_attached:
            return
        self.armed = True
        self.app.refresh_bindings()

    def _countdown(self) -> Text:
        left = self._left() if self._left is not None else ""
        return Text(f"expires in {left}" if left else "")

    def tick(self) -> None:
        """The time left to decide moves (the app calls this on its tick)."""
        if not self.closed:
            for countdown in self.query("#countdown").results(Static):
                countdown.update(self._countdown())

    def action_choose(self) -> None:
        """Tab: "Deny once", then "Allow once", in turn, is chosen (and
        focused), and from then on Enter decides it — a choice the person
        made. Kept here, not read from the focus, which Textual moves a
        moment later: a Tab and an Enter read together still decide."""
        self.chosen = "allow" if self.chosen == "deny" else "deny"
        button = self.query_one(f"#{self.chosen}", Button)
        button.can_focus = True
        button.focus()

    def on_key(self, event: events.Key) -> None:
        # Tab here, not only by its binding: a binding runs after the keys
        # already read (a Tab and an Enter together would miss the choice).
        if event.key == "tab":
            event.stop()
            event.prevent_default()
            self.action_choose()
        elif event.key == "enter" and self.chosen is not None:
            event.stop()
            event.prevent_default()
            self.decide("allow_once" if self.chosen == "allow" else "deny_once")
        elif event.is_printable or event.key == "enter":
            event.stop()
            event.prevent_default()
            self._type_through(event)
        elif event.key == "escape":
            event.stop()  # not a decision (see the class): and not the app's either
            event.prevent_default()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.decide("allow_once" if event.button.id == "allow" else "deny_once")

    def action_decide(self, decision: str) -> None:
        self.decide(decision)

    def decide(self, decision: str) -> bool:
        """Decide this prompt's approval, once, if it was on screen; True if sent."""
        if self.closed or self.decision is not None:
            return False
        if not self.armed:
            self.app.notify(
                "That key came before the approval prompt was drawn: nothing was decided. "
                "Press it again to decide.",
                severity="warning",
            )
            return False
        self.decision = decision
        self._decide(self.approval_id, decision)
        self.close()
        return True

    def close(self) -> None:
        """Leave the screen stack, once, only from its top (decided, or
        settled elsewhere): a repeat, or a late button press, does nothing."""
        if self.closed:
            return
        self.closed = True
        if self.app.screen_stack and self.app.screen_stack[-1] is self:
            self.dismiss(None)


class RenameScreen(ModalScreen[str | None]):
    """Rename the open conversation: Enter saves, Escape keeps the old name."""

    BINDINGS = [Binding("escape", "cancel", "Keep the name")]
    DEFAULT_CSS = """
    RenameScreen { align: center middle; }
    #rename { width: 70%; height: auto; border: thick $accent; padding: 1 2;
              background: $panel; }
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.current_name = name

    def compose(self) -> ComposeResult:
        with Vertical(id="rename"):
            yield Static("Rename this conversation (Enter saves, Esc keeps the name)")
            yield Input(value=self.current_name, id="new-name")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#new-name", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value if event.value.strip() else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
