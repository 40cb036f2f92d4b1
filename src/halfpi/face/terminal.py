"""The terminal face: a full-screen Textual app over the SDK.

Left: conversations (``ctrl+n`` creates one). Right: the open conversation —
messages rendered as Markdown, the streaming reply updated in place as
plain text and re-rendered as Markdown when its terminal event arrives,
tool cards, and approval prompts (default: deny once). Bottom: a status
line that only says what the SDK knows (``live``, ``reconnecting (attempt
n, next in t s)``, ``resumed: k events replayed``, ``resynced from
snapshot``, ``cancel requested``). Every piece of text that came from the
model or a tool passes :func:`escape_controls` before it is drawn.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, ListItem, ListView, Markdown, Static

from halfpi.face.client import FaceClient, Status
from halfpi.face.errors import FaceError
from halfpi.face.render import escape_controls
from halfpi.face.view import ConversationView, ViewMessage


class ConversationItem(ListItem):
    def __init__(self, conversation_id: str, name: str | None) -> None:
        super().__init__(Label(Text(escape_controls(name or conversation_id))))
        self.conversation_id = conversation_id


class MessageBox(Vertical):
    """One finished message: a role line and its Markdown body."""

    def __init__(self, message: ViewMessage) -> None:
        self.message = message
        role = "you" if message.role == "user" else "agent"
        status = "" if message.status in (None, "succeeded") else f" [{message.status}]"
        super().__init__(
            Static(Text(f"{role}{status}", style="bold")),
            Markdown(escape_controls(message.content)),
            classes=f"message {message.role}",
        )


class ApprovalScreen(ModalScreen[str]):
    """One approval prompt. The focused default is *deny once*: pressing Enter
    or Escape never runs anything."""

    BINDINGS = [Binding("escape", "deny", "Deny once")]
    DEFAULT_CSS = """
    ApprovalScreen { align: center middle; }
    #prompt { width: 80%; height: auto; border: thick $warning; padding: 1 2;
              background: $panel; }
    #buttons { height: auto; margin-top: 1; }
    """

    def __init__(self, approval: dict[str, Any]) -> None:
        super().__init__()
        self.approval = approval

    def compose(self) -> ComposeResult:
        a = self.approval
        lines = [f"Approve tool {a.get('tool', '?')}?", str(a.get("reason", ""))]
        if "args" in a:
            lines.append(json.dumps(a["args"], ensure_ascii=False, indent=1)[:2000])
        else:
            lines.append(f"arguments hidden (summary view); digest {a.get('args_digest', '')}")
        with Vertical(id="prompt"):
            yield Static(Text(escape_controls("\n".join(lines))))
            with Horizontal(id="buttons"):
                yield Button("Deny once", id="deny", variant="error")
                yield Button("Allow once", id="allow", variant="success")

    def on_mount(self) -> None:
        self.query_one("#deny", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss("allow_once" if event.button.id == "allow" else "deny_once")

    def action_deny(self) -> None:
        self.dismiss("deny_once")


class TerminalFace(App[int]):
    CSS = """
    #conversations { width: 28; border-right: solid $accent; }
    #log { height: 1fr; }
    .message { height: auto; margin: 0 0 1 0; }
    #streaming { height: auto; color: $text-muted; }
    #cards { height: auto; }
    #status { height: 1; background: $boost; }
    """
    BINDINGS = [
        Binding("ctrl+n", "new_conversation", "New conversation"),
        Binding("ctrl+x", "cancel_chat", "Cancel reply"),
        Binding("ctrl+a", "approve", "Allow once", show=False),
        Binding("ctrl+d", "deny", "Deny once", show=False),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(self, urls: list[str], token: str, conversation: str | None = None) -> None:
        super().__init__()
        self.client = FaceClient(
            urls,
            token,
            client_name="halfpi-terminal",
            on_status=self._sdk_status,
            on_update=self._sdk_update,
        )
        self.initial = conversation
        self.current: str | None = None
        self.rendered: list[int] = []  # seqs of mounted MessageBoxes
        self.prompted: set[str] = set()

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield ListView(id="conversations")
            with Vertical():
                yield VerticalScroll(id="log")
                yield Static(id="streaming")
                yield Static(id="cards")
                yield Input(placeholder="Type a message; Enter sends", id="input")
        yield Static(Text("connecting"), id="status")

    async def on_mount(self) -> None:
        self.run_worker(self._start(), exclusive=True, group="connect")

    async def _start(self) -> None:
        try:
            await self.client.connect(timeout=None)
        except FaceError as exc:
            self._set_status_text(f"refused: {exc}")
            return
        await self._refresh_conversations()
        if self.initial:
            await self._open(self.initial)

    async def _refresh_conversations(self) -> None:
        listing = await self.client.list_conversations(limit=100)
        lv = self.query_one("#conversations", ListView)
        await lv.clear()
        for c in listing:
            await lv.append(ConversationItem(c["id"], c.get("name")))

    async def on_list_view_selected(self, event: ListView.Selected) -> None:
        item = event.item
        if isinstance(item, ConversationItem):
            await self._open(item.conversation_id)

    async def _open(self, conversation_id: str) -> None:
        self.current = conversation_id
        self.rendered = []
        await self.query_one("#log", VerticalScroll).remove_children()
        await self.client.subscribe(conversation_id)
        self._render()
        self.query_one("#input", Input).focus()

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value
        if not text.strip() or self.current is None:
            return
        event.input.value = ""
        try:
            handle = await self.client.chat(self.current, text)
        except FaceError as exc:
            self.notify(str(exc), severity="error")
            return
        self.run_worker(self._await_result(handle.request_id, handle), group="chats")

    async def _await_result(self, request_id: str, handle: Any) -> None:
        try:
            result = await handle.result()
        except FaceError as exc:
            self.notify(escape_controls(str(exc)), severity="error")
            return
        if not result.ok:
            self.notify(
                f"reply {result.status}" + (f" ({result.error_code})" if result.error_code else "")
            )

    async def action_new_conversation(self) -> None:
        try:
            conversation_id = await self.client.create_conversation("new conversation")
        except FaceError as exc:
            self.notify(str(exc), severity="error")
            return
        await self._refresh_conversations()
        await self._open(conversation_id)

    async def action_cancel_chat(self) -> None:
        view = self._view()
        if view is None or not view.streaming:
            return
        target = next(iter(view.streaming))
        await self.client.cancel(view.conversation_id, target)
        self._render()

    async def action_approve(self) -> None:
        await self._decide("allow_once")

    async def action_deny(self) -> None:
        await self._decide("deny_once")

    async def _decide(self, decision: str, approval_id: str | None = None) -> None:
        view = self._view()
        if approval_id is None:
            if view is None or not view.pending_approvals:
                return
            approval_id = next(iter(view.pending_approvals))
        try:
            await self.client.request(
                "face.approval.resolve", approval_id=approval_id, decision=decision
            )
        except FaceError as exc:
            self.notify(str(exc), severity="error")

    # -- rendering ---------------------------------------------------------------

    def _view(self) -> ConversationView | None:
        return self.client.views.get(self.current) if self.current else None

    def _sdk_update(self, kind: str, conversation_id: str) -> None:
        if conversation_id == self.current:
            if kind == "snapshot":
                self.rendered = []
                self.query_one("#log", VerticalScroll).remove_children()
            self._render()
            self._set_status_text(self._status_text(self.client.status))

    def _render(self) -> None:
        view = self._view()
        if view is None:
            return
        log = self.query_one("#log", VerticalScroll)
        fresh = [m for m in view.messages if m.seq not in self.rendered]
        for message in fresh:
            self.rendered.append(message.seq)
            log.mount(MessageBox(message))
        streaming = self.query_one("#streaming", Static)
        if view.streaming:
            parts = []
            for reply in view.streaming.values():
                tag = " (cancel requested)" if reply.status == "cancel_requested" else ""
                parts.append(f"agent{tag}: {escape_controls(reply.text)}▌")
            streaming.update(Text("\n".join(parts)))
        else:
            streaming.update(Text(""))
        cards = []
        for card in view.tool_cards.values():
            size = f", {card.output_bytes} bytes" if card.output_bytes is not None else ""
            cards.append(f"[tool] {escape_controls(card.tool)}: {card.status}{size}")
        for approval in view.pending_approvals.values():
            tool = escape_controls(str(approval.get("tool", "?")))
            reason = escape_controls(str(approval.get("reason", "")))
            cards.append(
                f"[approval] {tool} {reason} — ctrl+a allow once, ctrl+d deny once (default: deny)"
            )
        self.query_one("#cards", Static).update(Text("\n".join(cards)))
        for approval_id, approval in view.pending_approvals.items():
            if approval_id not in self.prompted:
                self.prompted.add(approval_id)

                def decided(decision: str | None, approval_id: str = approval_id) -> None:
                    self.run_worker(self._decide(decision or "deny_once", approval_id))

                self.push_screen(ApprovalScreen(approval), decided)
        if fresh:
            log.scroll_end(animate=False)

    def _status_text(self, status: Status) -> str:
        text = status.describe()
        view = self._view()
        if view is not None and any(
            r.status == "cancel_requested" for r in view.streaming.values()
        ):
            text += " · cancel requested"
        return text

    def _sdk_status(self, status: Status) -> None:
        self._set_status_text(self._status_text(status))

    def _set_status_text(self, text: str) -> None:
        # Not mounted yet (or already gone): the next status change redraws.
        with contextlib.suppress(Exception):
            self.query_one("#status", Static).update(Text(text))

    async def on_unmount(self) -> None:
        await self.client.close()


def run_terminal(urls: list[str], token: str, conversation: str | None = None) -> int:
    TerminalFace(urls, token, conversation).run()
    return 0
