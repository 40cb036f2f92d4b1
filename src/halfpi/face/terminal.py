"""The terminal face: a full-screen Textual app over the SDK.

Left: the conversations, kept live by the SDK (created, titled and renamed
by any Face). Right: the open conversation — every message in log order
with its tool calls under it and every reply with its status and reason —
and the message box. Below: pending approvals across conversations, the
connection line (where, what, why, and a live countdown while it waits) and
a footer with the keys that apply now. Every key in the footer works
whatever has focus (app-level bindings with ``priority``); a key that does
not apply now is hidden and left to the focused widget (ctrl+a is "allow
once" only while an approval waits, and "start of line" otherwise).

Nothing the person types is dropped: before a conversation is open the face
opens the newest one (or creates one) and sends it there; a message the
Mind refuses (a reply still streaming, say) goes back into the box.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from halfpi.client.redial import Locate
from halfpi.face.client import FaceClient, Status
from halfpi.face.errors import CommandError, FaceError
from halfpi.face.render import escape_controls
from halfpi.face.terminal_widgets import (
    UNTITLED,
    ApprovalScreen,
    ConversationList,
    ConversationLog,
    RenameScreen,
    clock,
    conversation_label,
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
        self, urls: list[str], token: str, conversation: str | None = None, **client: Any
    ) -> None:
        super().__init__()
        self.client = FaceClient(
            urls,
            token,
            client_name="halfpi-terminal",
            on_status=self._sdk_status,
            on_update=self._sdk_update,
            **client,
        )
        self.initial = conversation
        self.current: str | None = None
        self.prompted: set[str] = set()
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
                yield Input(placeholder="Type a message; Enter sends", id="input")
        yield Static(id="approvals")
        yield Static(Text("connecting"), id="status")
        yield Footer()

    async def on_mount(self) -> None:
        self.conversations = self.query_one("#conversations", ConversationList)
        self.conversations.border_title = "Conversations"
        self.log_view = self.query_one("#log", ConversationLog)
        self.log_view.anchor()
        self.message_box = self.query_one("#input", Input)
        self.title_line = self.query_one("#title", Static)
        self.approvals_line = self.query_one("#approvals", Static)
        self.status_line = self.query_one("#status", Static)
        self.message_box.focus()
        self.ready = True
        self._show_title()
        self.set_interval(0.2, self._tick)
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
                listing = await self.client.list_conversations(limit=1)
                if listing:
                    conversation_id = str(listing[0]["id"])
                else:
                    conversation_id = await self.client.create_conversation()
                await self._open(conversation_id)
            assert self.current is not None
            return self.current

    async def _open(self, conversation_id: str) -> None:
        self.current = conversation_id
        await self.log_view.clear()
        await self.client.subscribe(conversation_id)
        self._render()
        self.message_box.focus()

    async def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option_id is not None:
            await self._open(event.option_id)

    # -- sending -------------------------------------------------------------------------

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input is not self.message_box:
            return
        text = event.value
        if not text.strip():
            return
        view = self._view()
        if view is not None and view.streaming:
            # One reply at a time per conversation: say so, keep the text.
            self.notify(
                "A reply is still streaming here: wait for it or press ctrl+x to cancel it. "
                "Your message stays in the box.",
                severity="warning",
            )
            return
        event.input.value = ""
        key = f"sending-{next(self._send_ids)}"
        self._sending[key] = (text, None)
        self._render()
        self.run_worker(self._send(key, text), group="send")

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
            return view is not None and any(
                r.status != "cancel_requested" for r in view.streaming.values()
            )
        if action in ("approve", "deny"):
            return view is not None and bool(view.pending_approvals)
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
        name = (self.client.conversations.get(conversation_id) or {}).get("name") or ""

        def renamed(new_name: str | None) -> None:
            if new_name:
                self.run_worker(self._rename(conversation_id, new_name), group="rename")

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
        self._decide_now("allow_once")

    def action_deny(self) -> None:
        self._decide_now("deny_once")

    def _decide_now(self, decision: str) -> None:
        screen = self.screen
        if isinstance(screen, ApprovalScreen):
            screen.dismiss(decision)  # its callback sends the decision
            return
        view = self._view()
        if view is not None and view.pending_approvals:
            approval_id = next(iter(view.pending_approvals))
            self.prompted.add(approval_id)
            self.run_worker(self._decide(decision, approval_id), group="decide")

    async def _decide(self, decision: str, approval_id: str) -> None:
        try:
            await self.client.resolve_approval(approval_id, decision)
        except FaceError as exc:
            self.notify(str(exc), severity="error")

    async def action_goto_approval(self) -> None:
        elsewhere = self._approvals_elsewhere()
        if elsewhere:
            await self._open(str(elsewhere[0]["conversation_id"]))

    def action_reconnect(self) -> None:
        self.client.reconnect_now()

    # -- what the SDK tells us -----------------------------------------------------------

    def _view(self) -> ConversationView | None:
        return self.client.views.get(self.current) if self.current else None

    def _sdk_update(self, kind: str, conversation_id: str) -> None:
        if not self.ready:
            return
        if kind in ("conversations", "approvals"):
            self._show_list()
            self._show_approvals()
            self._show_title()
            self.refresh_bindings()
            if kind == "approvals" and conversation_id == self.current:
                self._render()
        elif conversation_id == self.current:
            self._render()
        elif kind == "face.event":
            self._show_list()  # a reply elsewhere started or ended

    def _sdk_status(self, status: Status) -> None:
        if not self.ready:
            return
        self._set_status_text(self._status_text(status))
        self._show_approvals()
        self.refresh_bindings()

    def _tick(self) -> None:
        """Countdowns move: the next reconnect attempt, approvals' expiry."""
        status = self.client.status
        if status.state == "reconnecting":
            self._set_status_text(self._status_text(status))
        if self.client.approvals:
            self._show_approvals()

    # -- drawing -----------------------------------------------------------------------

    def _render(self) -> None:
        if not self.ready:
            return
        self._sync_log()
        self._show_title()
        self._show_approvals()
        self._show_list()
        self._set_status_text(self._status_text(self.client.status))
        self.refresh_bindings()
        self._prompt_if_needed()

    def _sync_log(self) -> None:
        self.log_view.show(self._view(), self._sending)

    def _show_title(self) -> None:
        if self.current is None:
            self.title_line.update(Text("no conversation open yet · typing opens one"))
            return
        name = (self.client.conversations.get(self.current) or {}).get("name")
        view = self._view()
        name = name or (view.name if view is not None else None) or UNTITLED
        title = Text(escape_controls(name), style="bold")
        title.append(f"  · {self.current}", style="dim")
        title.truncate(max(10, self.title_line.size.width - 2), overflow="ellipsis")
        self.title_line.update(title)

    def _show_list(self) -> None:
        if not self.ready:
            return
        waiting: dict[str, int] = {}
        for a in self.client.approvals.values():
            cid = str(a.get("conversation_id"))
            waiting[cid] = waiting.get(cid, 0) + 1
        rows = []
        for c in self.client.conversation_list():
            cid = str(c["id"])
            view = self.client.views.get(cid)
            label = conversation_label(
                c,
                current=cid == self.current,
                approvals=waiting.get(cid, 0),
                streaming=bool(view is not None and view.streaming),
            )
            rows.append((cid, label))
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

    def _approvals_elsewhere(self) -> list[dict[str, Any]]:
        return sorted(
            (a for a in self.client.approvals.values() if a.get("conversation_id") != self.current),
            key=lambda a: float(a.get("expires_at") or 0.0),
        )

    def _show_approvals(self) -> None:
        view = self._view()
        lines = []
        if view is not None and view.pending_approvals:
            tool = next(iter(view.pending_approvals.values())).get("tool", "?")
            lines.append(f"⚠ approval waiting here: {tool} — ctrl+a allow once · ctrl+d deny once")
        elsewhere = self._approvals_elsewhere()
        if elsewhere:
            first = elsewhere[0]
            where = (self.client.conversations.get(str(first["conversation_id"])) or {}).get(
                "name"
            ) or UNTITLED
            left = clock(float(first.get("expires_at") or 0.0) - time.time())
            count = len(elsewhere)
            noun = "approval" if count == 1 else "approvals"
            lines.append(
                f"⚠ {count} {noun} waiting in other conversations: {first.get('tool', '?')} "
                f"in “{where}” ({left} left) — ctrl+g go there"
            )
        if view is not None and view.tasks:
            # Background tasks (DESIGN §8): a line each, the newest few.
            lines.extend(f"⚙ {line}" for line in view.task_lines()[-TASK_LINES:])
        if lines and self.client.status.state in ("reconnecting", "connecting"):
            lines.append("(as last known: the Mind is unreachable; it re-reads them when back)")
        self.approvals_line.update(Text(escape_controls("\n".join(lines))))
        self.approvals_line.set_class(bool(lines), "shown")

    def _prompt_open(self) -> bool:
        return isinstance(self.screen, ApprovalScreen | RenameScreen)

    def _prompt_if_needed(self) -> None:
        """One prompt per approval of the open conversation; a prompt whose
        approval was settled elsewhere closes by itself (deciding nothing)."""
        view = self._view()
        pending = view.pending_approvals if view is not None else {}
        screen = self.screen
        if isinstance(screen, ApprovalScreen) and screen.approval_id not in pending:
            screen.dismiss(None)
            return
        if self._prompt_open():
            return
        for approval_id, approval in pending.items():
            if approval_id in self.prompted:
                continue
            self.prompted.add(approval_id)

            def decided(decision: str | None, approval_id: str = approval_id) -> None:
                if decision is not None:
                    self.run_worker(self._decide(decision, approval_id), group="decide")

            name = (self.client.conversations.get(self.current or "") or {}).get("name")
            self.push_screen(ApprovalScreen(approval, name or UNTITLED), decided)
            return

    def _status_text(self, status: Status) -> str:
        now = time.monotonic()
        if status.state == "reconnecting":
            text = f"○ {status.describe(now)}"
        elif status.state in ("connecting", "closed"):
            text = f"○ {status.state} · {status.url}"
        elif status.state == "refused":
            text = f"✗ {status.describe()}"
        else:
            text = f"● {status.describe()} · {status.url}"
        view = self._view()
        if view is not None and any(
            r.status == "cancel_requested" for r in view.streaming.values()
        ):
            text += " · cancel requested"
        return text

    def _set_status_text(self, text: str) -> None:
        # Not mounted yet (or already gone): the next status change redraws.
        with contextlib.suppress(Exception):
            self.status_line.update(Text(escape_controls(text)))

    async def on_unmount(self) -> None:
        self.ready = False  # the widgets are going: the SDK's last words are not drawn
        await self.client.close()


TASK_LINES = 5  # background tasks shown above the prompt


def run_terminal(
    urls: list[str], token: str, conversation: str | None = None, locate: Locate | None = None
) -> int:
    TerminalFace(urls, token, conversation, locate=locate).run()
    return 0
