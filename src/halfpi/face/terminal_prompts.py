"""The terminal face's approval prompts: which one shows, and where a
decision goes (docs/faces.md, "Approvals").

One prompt at a time, for an approval of the open conversation not decided
here yet. Each prompt (:class:`~halfpi.face.terminal_widgets.ApprovalScreen`)
is bound to its approval: a decision goes there, never to "the current
one". An approval decided here is not prompted again unless the Mind
refuses the decision; a prompt whose approval no longer waits in the open
conversation (settled elsewhere, expired, another conversation opened)
closes by itself, deciding nothing, and the next one waiting opens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from textual import events
from textual.app import App

from halfpi.core.events import ApprovalRequested
from halfpi.face.client import FaceClient
from halfpi.face.errors import FaceError
from halfpi.face.terminal_input import Composer
from halfpi.face.terminal_lines import left
from halfpi.face.terminal_widgets import UNTITLED, ApprovalScreen


class Prompter:
    def __init__(
        self,
        app: App[Any],
        client: FaceClient,
        *,
        wall: Callable[[], float],
        message_box: Callable[[], Composer],
        redraw: Callable[[], None],
    ) -> None:
        self.app = app
        self.client = client
        self.wall = wall
        self.message_box = message_box
        self.redraw = redraw
        # Approvals decided here whose end the Mind has not announced yet.
        self.deciding: set[str] = set()

    def shown(self) -> ApprovalScreen | None:
        """The prompt on top, if one is."""
        top = self.app.screen_stack[-1] if self.app.screen_stack else None
        return top if isinstance(top, ApprovalScreen) else None

    def decide_now(self, decision: str) -> None:
        """ctrl+a / ctrl+d: the prompt on screen decides its own approval,
        once, if it was drawn; without a prompt, nothing is decided."""
        prompt = self.shown()
        if prompt is not None:
            prompt.decide(decision)

    def update(self, pending: Mapping[str, ApprovalRequested], where: str | None,
               busy: bool) -> None:
        """``pending``: the approvals waiting in the open conversation (named
        ``where``); ``busy``: another prompt (a rename) holds the screen."""
        self.deciding &= pending.keys() | self.client.approvals.keys()
        prompt = self.shown()
        if prompt is not None and prompt.approval_id not in pending:
            prompt.close()
        if busy or self.shown() is not None:
            return
        for approval_id, approval in pending.items():
            if approval_id in self.deciding:
                continue
            expires_at = approval.expires_at
            self.app.push_screen(
                ApprovalScreen(
                    approval,
                    where or UNTITLED,
                    decide=self._decided,
                    type_through=self._type_through,
                    left=partial(self._left, expires_at),
                )
            )
            return

    def _left(self, expires_at: float) -> str:
        return left(expires_at, self.wall())

    def _decided(self, approval_id: str, decision: str) -> None:
        self.deciding.add(approval_id)
        self.app.run_worker(self._decide(decision, approval_id), group="decide")
        self.redraw()

    async def _decide(self, decision: str, approval_id: str) -> None:
        try:
            await self.client.resolve_approval(approval_id, decision)
        except FaceError as exc:
            self.deciding.discard(approval_id)  # still waiting? it is asked again
            self.app.notify(f"Not decided: {exc}", severity="error")
            self.redraw()

    def _type_through(self, event: events.Key) -> None:
        """A key typed while a prompt shows, meant for the message box under it."""
        if event.key == "enter":
            self.message_box().action_submit()
        elif event.character:
            self.message_box().insert_text_at_cursor(event.character)
