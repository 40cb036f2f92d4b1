"""The terminal face: a full-screen Textual app over the SDK.

Left: the conversations, kept live by the SDK (created, titled and renamed
by any Face). Right: the open conversation — every message in log order
with its tool calls under it and every reply with its status and reason —
and the message box. Below: pending approvals across conversations, the
connection line (where, what, why, and a live countdown while it waits) and
a footer with the keys that apply now. Every key in the footer works
whatever has focus (app-level bindings with ``priority``); a key that does
not apply now is hidden and left to the focused widget (ctrl+a is "allow
once" only while an approval prompt shows, and "start of line" otherwise).
A decision binds to the approval its prompt shows, never to "the current
one" (:class:`~halfpi.face.terminal_prompts.Prompter`).

Nothing the person types is dropped: before a conversation is open the face
opens the newest one (or creates one) and sends it there; a message the
Mind refuses (a reply still streaming, say) goes back into the box; lines
sent while the face was starting are read and sent
(:func:`~halfpi.face.terminal_input.typed_ahead`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from halfpi.client.redial import Locate
from halfpi.core.events import ApprovalPending, present
from halfpi.face.client import FaceClient, Status
from halfpi.face.errors import CommandError, FaceError
from halfpi.face.render import escape_controls
from halfpi.face.terminal_input import Composer, typed_ahead
from halfpi.face.terminal_lines import (
    CONNECTED,
    NEWS,
    approvals_elsewhere,
    bar_lines,
    connection_line,
    conversation_rows,
)
from halfpi.face.terminal_prompts import Prompter
from halfpi.face.terminal_widgets import (
    UNTITLED,
    ApprovalScreen,
    ConversationList,
    ConversationLog,
    RenameScreen,
)
from halfpi.face.view import ConversationView

# Keys that need a place to act on: hidden (and left to the focused widget)
# while a prompt is open.
NEEDS_MAIN_SCREEN = frozenset({"new_conversation", "conversations", "rename", "goto_approval"})


class TerminalFace(App[int]):
    TITLE = "halfpi"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #main { height: 1fr; }
    #conversations { width: 32; height: 1fr; border: round $panel-lighten-2; }
    #conversations:focus { border: heavy $accent; }
    #chat { width: 1fr; }
    #title { height: 1; padding: 0 1; background: $boost; text-style: bold; }
    #log { height: 1fr; padding: 0 1; }
    #input { border: round $panel-lighten-2; }
    #input:focus { border: heavy $accent; }
    #approvals { height: auto; padding: 0 1; background: $warning 30%; display: none; }
    #approvals.shown { display: block; }
    #status { height: auto; max-height: 3; padding: 0 1; background: $boost; }
    """
    BINDINGS = [
        Binding("ctrl+n", "new_conversation", "New", priority=True),
        Binding("ctrl+o", "conversations", "Conversations", priority=True),
        Binding("f2", "rename", "Rename", priority=True),
        Binding("ctrl+x", "cancel_chat", "Cancel reply", priority=True),
        Binding("ctrl+a", "approve", "Allow once", priority=True),
        Binding("ctrl+d", "deny", "Deny once", priority=True),
        Binding("ctrl+g", "goto_approval", "Go to approval", priority=True),
        Binding("ctrl+r", "reconnect", "Retry now", priority=True),
        Binding("escape", "to_message", "Back to message"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        urls: list[str],
        token: str,
        conversation: str | None = None,
        *,
        typed: str = "",
        wall: Callable[[], float] = time.time,
        **client: Any,
    ) -> None:
        super().__init__()
        self.wall = wall  # the Mind's kind of time: approvals' expires_at
        self.client = FaceClient(
            urls,
            token,
            client_name="halfpi-terminal",
            on_status=self._sdk_status,
            on_update=self._sdk_update,
            **client,
        )
        self.initial = conversation
        self.typed = typed  # lines typed before the face took the terminal
        self.current: str | None = None
        self.prompter = Prompter(
            self, self.client, wall=wall, message_box=lambda: self.message_box,
            redraw=self._render,
        )
        self.opening: str | None = None  # the conversation being opened, for feedback
        self._news_at = 0.0  # when the connection last came back (resumed, resynced)
        self._sending: dict[str, tuple[str, str | None]] = {}  # key -> (text, request_id)
        self._send_ids = itertools.count(1)
        self._opening = asyncio.Lock()
        self._list_shown: list[tuple[str, str]] = []
        self.ready = False  # widgets found (on_mount)

    # -- layout ------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield ConversationList(id="conversations")
            with Vertical(id="chat"):
                yield Static(id="title")
                yield ConversationLog(id="log")
                yield Composer(
                    id="input", placeholder="Type a message; Enter sends, ctrl+j new line"
                )
        yield Static(id="approvals")
        yield Static(Text("connecting"), id="status")
        yield Footer()

    async def on_mount(self) -> None:
        self.conversations = self.query_one("#conversations", ConversationList)
        self.conversations.border_title = "Conversations"
        self.log_view = self.query_one("#log", ConversationLog)
        self.log_view.anchor()
        self.message_box = self.query_one("#input", Composer)
        self.title_line = self.query_one("#title", Static)
        self.approvals_line = self.query_one("#approvals", Static)
        self.status_line = self.query_one("#status", Static)
        self.message_box.focus()
        self.ready = True
        self._show_title()
        self.set_interval(0.2, self.tick)
        self._send_typed_ahead()
        self.run_worker(self._start(), group="connect")

    async def _start(self) -> None:
        try:
            await self.client.connect(timeout=None)
        except FaceError as exc:
            self._set_status_text(f"✗ refused: {exc}")
            return
        if self.initial:
            await self._open(self.initial)
        else:
            await self._ensure_conversation()

    # -- opening conversations ---------------------------------------------------------

    async def _ensure_conversation(self) -> str:
        """The open conversation; if none, the newest one, or a new one."""
        async with self._opening:
            if self.current is None:
                listing = await self.client.read_conversations(limit=1)
                if listing:
                    conversation_id = listing[0].id
                else:
                    conversation_id = await self.client.create_conversation()
                await self._open(conversation_id)
            assert self.current is not None
            return self.current

    async def _open(self, conversation_id: str) -> None:
        """Open a conversation. At once: the title names it and says
        "opening…", a prompt of the one left closes (deciding nothing; it
        opens again on return), and what the SDK already holds is drawn;
        the subscription (a snapshot, seconds under load) catches up. When
        another conversation was opened meanwhile, that one stays."""
        self.current = conversation_id
        self.opening = conversation_id
        await self.log_view.clear()
        self._render()
        try:
            await self.client.subscribe(conversation_id)
        except FaceError as exc:
            self.notify(f"Cannot open {conversation_id}: {exc}", severity="error")
        finally:
            if self.opening == conversation_id:
                self.opening = None
        if self.current == conversation_id:
            self._render()
            self.message_box.focus()

    async def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option_id is not None:
            await self._open(event.option_id)

    # -- sending -------------------------------------------------------------------------

    def on_composer_submitted(self, event: Composer.Submitted) -> None:
        if event.composer is self.message_box and self._submit(event.value):
            self.message_box.value = ""

    def _submit(self, text: str) -> bool:
        """Send ``text`` (True), or say why not and leave it where it is."""
        if not text.strip():
            return False
        view = self._view()
        if view is not None and view.streaming:
            # One reply at a time per conversation: say so, keep the text.
            self.notify(
                "A reply is still streaming here: wait for it or press ctrl+x to cancel it. "
                "Your message stays in the box.",
                severity="warning",
            )
            return False
        key = f"sending-{next(self._send_ids)}"
        self._sending[key] = (text, None)
        self._render()
        self.run_worker(self._send(key, text), group="send")
        return True

    def _send_typed_ahead(self) -> None:
        """Lines typed (and sent with Enter) before the face took the
        terminal are sent now; one that cannot be waits in the box."""
        for line in self.typed.splitlines():
            if not self._submit(line):
                self.message_box.insert_text_at_cursor(line)

    async def _send(self, key: str, text: str) -> None:
        try:
            conversation_id = self.current or await self._ensure_conversation()
            handle = await self.client.chat(conversation_id, text)
            self._sending[key] = (text, handle.request_id)
            await handle.accepted()
        except (CommandError, FaceError) as exc:
            if not self.message_box.value:
                self.message_box.value = text
            self.notify(f"Not sent: {exc}. Your message is back in the box.", severity="error")
        finally:
            self._sending.pop(key, None)
            self._render()

    # -- actions (every one works whatever has focus) ----------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        prompt_open = self._prompt_open()
        if action in NEEDS_MAIN_SCREEN and prompt_open:
            return False
        view = self._view()
        if action == "cancel_chat":
            # Not while the Mind is unreachable: nobody would hear it.
            return self.client.status.state in CONNECTED and view is not None and any(
                r.status != "cancel_requested" for r in view.streaming.values()
            )
        if action in ("approve", "deny"):
            # Only through a prompt on screen: a decision binds to the
            # approval it shows (elsewhere ctrl+a is "start of line").
            prompt = self._top()
            return isinstance(prompt, ApprovalScreen) and prompt.armed and not prompt.closed
        if action == "goto_approval":
            return bool(self._approvals_elsewhere())
        if action == "reconnect":
            return self.client.status.state == "reconnecting"
        if action == "rename":
            return self.current is not None
        if action == "to_message":
            return not prompt_open and self.focused is not self.message_box
        return True

    async def action_new_conversation(self) -> None:
        try:
            conversation_id = await self.client.create_conversation()
        except FaceError as exc:
            self.notify(str(exc), severity="error")
            return
        await self._open(conversation_id)

    def action_conversations(self) -> None:
        if self.focused is self.conversations:
            self.message_box.focus()
            return
        self._show_list()
        self.conversations.focus()

    def action_to_message(self) -> None:
        self.message_box.focus()

    def action_rename(self) -> None:
        conversation_id = self.current
        if conversation_id is None:
            return
        name = self._name_of(conversation_id) or ""

        def renamed(new_name: str | None) -> None:
            if new_name:
                self.run_worker(self._rename(conversation_id, new_name), group="rename")
            self._render()  # an approval that came meanwhile is prompted now

        self.push_screen(RenameScreen(name), renamed)

    async def _rename(self, conversation_id: str, name: str) -> None:
        try:
            await self.client.rename_conversation(conversation_id, name)
        except FaceError as exc:
            self.notify(f"Not renamed: {exc}", severity="error")

    async def action_cancel_chat(self) -> None:
        view = self._view()
        if view is None:
            return
        target = next((r for r in view.streaming.values() if r.status != "cancel_requested"), None)
        if target is None:
            return
        await self.client.cancel(view.conversation_id, target.request_id)
        self._render()

    def action_approve(self) -> None:
        self.prompter.decide_now("allow_once")

    def action_deny(self) -> None:
        self.prompter.decide_now("deny_once")

    async def action_goto_approval(self) -> None:
        elsewhere = self._approvals_elsewhere()
        if elsewhere:
            await self._open(elsewhere[0].conversation_id)

    def action_reconnect(self) -> None:
        self.client.reconnect_now()

    # -- what the SDK tells us -----------------------------------------------------------

    def _view(self) -> ConversationView | None:
        return self.client.views.get(self.current) if self.current else None

    def _top(self) -> Screen[Any] | None:
        """The screen on top; None while the app starts or ends (no stack)."""
        return self.screen_stack[-1] if self.screen_stack else None

    def _refresh_keys(self) -> None:
        if self.screen_stack:
            self.refresh_bindings()

    def _sdk_update(self, kind: str, conversation_id: str) -> None:
        if not self.ready:
            return
        if kind in ("conversations", "approvals"):
            self._show_list()
            self._show_approvals()
            self._show_title()
            self._refresh_keys()
            if kind == "approvals" and conversation_id == self.current:
                self._render()
        elif conversation_id == self.current:
            self._render()
        elif kind == "face.event":
            self._show_list()  # a reply elsewhere started or ended

    def _sdk_status(self, status: Status) -> None:
        if status.state in NEWS:
            self._news_at = self.client.clock()
        if not self.ready:
            return
        self._set_status_text(self._status_text(status))
        self._show_approvals()
        self._refresh_keys()

    def tick(self) -> None:
        """Countdowns move: the next reconnect attempt, approvals' expiry."""
        status = self.client.status
        if status.state == "reconnecting" or status.state in NEWS:
            self._set_status_text(self._status_text(status))
        if self.client.approvals:
            self._show_approvals()
        prompt = self._top()
        if isinstance(prompt, ApprovalScreen):
            prompt.tick()

    # -- drawing -----------------------------------------------------------------------

    def _render(self) -> None:
        if not self.ready:
            return
        self._sync_log()
        self._show_title()
        self._show_approvals()
        self._show_list()
        self._set_status_text(self._status_text(self.client.status))
        self._refresh_keys()
        self._prompt_if_needed()

    def _sync_log(self) -> None:
        self.log_view.show(self._view(), self._sending)

    def _show_title(self) -> None:
        if self.current is None:
            self.title_line.update(Text("no conversation open yet · typing opens one"))
            return
        name = self._name_of(self.current)
        view = self._view()
        name = name or (view.name if view is not None else None) or UNTITLED
        title = Text(escape_controls(name), style="bold")
        title.append(f"  · {self.current}", style="dim")
        if self.opening == self.current:
            title.append("  · opening…", style="italic")
        title.truncate(max(10, self.title_line.size.width - 2), overflow="ellipsis")
        self.title_line.update(title)

    def _show_list(self) -> None:
        if not self.ready:
            return
        rows = conversation_rows(
            self.client.conversations.values(), self.client.views, self.client.approvals,
            self.current,
        )
        shown = [(cid, label.plain) for cid, label in rows]
        if shown == self._list_shown:
            return
        self._list_shown = shown
        highlighted = self.conversations.highlighted_option
        keep = highlighted.id if highlighted is not None else self.current
        self.conversations.set_options(Option(label, id=cid) for cid, label in rows)
        ids = [cid for cid, _ in rows]
        if keep in ids:
            self.conversations.highlighted = ids.index(keep)

    def _show_approvals(self) -> None:
        lines = bar_lines(
            self._view(),
            self.prompter.deciding,
            self._approvals_elsewhere(),
            self.client.conversations,
            self.wall(),
            reachable=self.client.status.state not in ("reconnecting", "connecting"),
        )
        self.approvals_line.update(Text(escape_controls("\n".join(lines))))
        self.approvals_line.set_class(bool(lines), "shown")

    def _name_of(self, conversation_id: str | None) -> str | None:
        """The conversation's name as the live list knows it."""
        known = self.client.conversations.get(conversation_id or "")
        return None if known is None else present(known.name)

    def _approvals_elsewhere(self) -> list[ApprovalPending]:
        return approvals_elsewhere(self.client.approvals, self.current)

    def _status_text(self, status: Status) -> str:
        return connection_line(status, self.client.clock(), self._news_at, self._view())

    def _prompt_open(self) -> bool:
        return isinstance(self._top(), ApprovalScreen | RenameScreen)

    def _prompt_if_needed(self) -> None:
        view = self._view()
        where = self._name_of(self.current)
        self.prompter.update(
            view.pending_approvals if view is not None else {},
            where,
            busy=isinstance(self._top(), RenameScreen),
        )

    def _set_status_text(self, text: str) -> None:
        # Not mounted yet (or already gone): the next status change redraws.
        with contextlib.suppress(Exception):
            self.status_line.update(Text(escape_controls(text)))

    async def on_unmount(self) -> None:
        self.ready = False  # the widgets are going: the SDK's last words are not drawn
        await self.client.close()


def run_terminal(
    urls: list[str], token: str, conversation: str | None = None, locate: Locate | None = None
) -> int:
    typed = typed_ahead(sys.stdin.fileno()) if sys.stdin.isatty() else ""
    TerminalFace(urls, token, conversation, typed=typed, locate=locate).run()
    return 0
