"""The terminal face in-process, under Textual's ``Pilot``.

A real Mind runs in the test's loop on a fake clock (``tests/support/rig.py``)
and the face's SDK reaches it through an in-process session
(``tests/support/session_link.py``): no socket, no terminal, no sleep. The
tests press keys while approvals arrive and settle elsewhere, hundreds of
times, and check what the face sent the Mind. ``tests/e2e/test_terminal.py``
drives the same face in a real terminal.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Button, Input, Static
from textual.widgets._footer import FooterKey

from halfpi.core.events import ApprovalRequested
from halfpi.face.terminal import TerminalFace
from halfpi.face.terminal_lines import NEWS_S
from halfpi.face.terminal_widgets import ApprovalScreen, ToolBox, clock, unsaved_note
from tests.support.frames import event
from tests.support.hand import allow_check, honest_result
from tests.support.rig import Peer, Rig, fake_time_mind
from tests.support.session_link import SessionLink, session_connector
from tests.support.wait import until

HAND_TOOL = '/tool exec_command {"argv": ["true"], "hand": "dev"}'
ROUNDS = 100  # approvals in the race test: bounded, a fraction of a second each
QUIET = {"heartbeat_s": 86_400.0, "dead_after_s": 3 * 86_400.0}


def key_event(key: str) -> events.Key:
    """The event a terminal sends for ``key`` ("h", "enter", "ctrl+a"…)."""
    named = {"enter": "\r", "escape": "\x1b", "tab": "\t"}
    if key in named:
        return events.Key(key, named[key])
    if key.startswith("ctrl+"):
        return events.Key(key, chr(ord(key[-1]) - ord("a") + 1))
    return events.Key(key, key if len(key) == 1 else None)  # "up", "f2": no character


@dataclass
class Face:
    """The face under test, the Mind it talks to, and a second Face (``other``)
    that starts chats and settles approvals from elsewhere."""

    rig: Rig
    app: TerminalFace
    pilot: Pilot[int]
    hand: Peer
    other: Peer
    links: list[SessionLink]
    chats: int = 0
    down: bool = False  # the Mind unreachable: every dial is refused
    pressed_for: dict[str, set[str]] = field(default_factory=dict)  # approval -> keys

    async def opened(self, before: str | None = None) -> str:
        """Wait until a conversation other than ``before`` is open and read;
        the other Face follows it too."""
        app = self.app
        await until(
            lambda: app.current not in (None, before) and app.client.views[app.current].ready
        )
        subscribed = await self.rig.command(
            self.other, "face.subscribe", conversation_ids=[self.cid]
        )
        await self.rig.reply(self.other, subscribed, ("face.accepted",))
        return self.cid

    async def go_to(self, cid: str) -> None:
        """Open ``cid`` by keyboard: ctrl+o to the list, ↑/↓ to it, Enter."""
        await self.press("ctrl+o")
        listed = self.app.conversations
        ids = [listed.get_option_at_index(i).id for i in range(listed.option_count)]
        highlighted = listed.highlighted or 0
        step = "down" if ids.index(cid) > highlighted else "up"
        for _ in range(abs(ids.index(cid) - highlighted)):
            await self.press(step)
        await self.press("enter")
        await until(lambda: self.app.current == cid and self.app.opening is None, 5.0)

    @property
    def cid(self) -> str:
        assert self.app.current is not None
        return self.app.current

    def decisions(self) -> list[dict[str, Any]]:
        """Every ``face.approval.resolve`` the face sent, on any connection."""
        return [
            f["payload"]
            for link in self.links
            for f in link.sent
            if f["type"] == "face.approval.resolve"
        ]

    def decided(self) -> list[str]:
        return [d["approval_id"] for d in self.decisions()]

    def prompt(self) -> ApprovalScreen | None:
        screen = self.app.screen
        return screen if isinstance(screen, ApprovalScreen) else None

    def shown(self) -> str | None:
        """The approval a person can see a prompt for now (armed: drawn)."""
        prompt = self.prompt()
        if prompt is None or not prompt.armed:
            return None
        return prompt.approval_id

    async def press(self, key: str) -> None:
        """Press ``key``, noting which prompt (if any) was open, and wait
        until the face has handled it (``Pilot.press`` also waits for the
        process to idle: up to a second a key on a busy machine)."""
        prompt = self.prompt()
        if prompt is not None:
            self.pressed_for.setdefault(prompt.approval_id, set()).add(key)
        self.app.post_message(key_event(key))
        await self.pilot.pause(0)

    async def ask(self, cid: str | None = None) -> tuple[str, str]:
        """The other Face starts a chat that waits for an approval (in the
        open conversation, or ``cid``): ``(chat request_id, approval_id)``,
        as soon as the Mind asked."""
        chat = await self.rig.command(
            self.other, "face.chat", conversation_id=cid or self.cid, content=HAND_TOOL
        )
        check = await self.rig.take(self.hand, lambda f: f["type"] == "hand.check")
        self.hand.send("hand.checked", allow_check(check["payload"]))
        requested = await self.rig.expect(self.other, event("approval.requested", request_id=chat))
        return chat, str(requested["payload"]["data"]["approval_id"])

    async def finish(self, chat: str, approval_id: str) -> str:
        """Play the Hand if the tool was allowed; the approval's end."""
        resolved = await self.rig.expect(
            self.other, event("approval.resolved", approval_id=approval_id)
        )
        status = str(resolved["payload"]["data"]["status"])
        if status == "allowed":
            order = await self.rig.take(self.hand, lambda f: f["type"] == "hand.run")
            run = order["payload"]
            self.hand.send("hand.result", honest_result(run["run_id"], run["generation"]))
        await self.rig.reply(self.other, chat)
        # The face has heard of it too: nothing of it is pending there.
        await until(lambda: approval_id not in self.app.client.approvals, 5.0)
        return status


@contextlib.asynccontextmanager
async def terminal_face(tmp_path: Path) -> AsyncIterator[Face]:
    async with fake_time_mind(tmp_path / "home") as rig:
        hand = await rig.hand("dev")
        other = await rig.face()
        links: list[SessionLink] = []
        reachable: list[Face] = []  # the face, once made: its ``down`` says
        app = TerminalFace(
            ["ws://mind.test/v1/face"],
            rig.face_token,
            connector=session_connector(rig.mind, links, lambda: any(f.down for f in reachable)),
            wall=rig.clock.wall,
            clock=rig.clock,
            **QUIET,
        )
        async with app.run_test(size=(120, 40)) as pilot:
            face = Face(rig, app, pilot, hand, other, links)
            reachable.append(face)
            await face.opened()
            yield face
            # Let the last keys finish bubbling before the app ends: Textual
            # itself fails on a key that reaches the app after its screens went.
            for _ in range(3):
                await pilot.pause(0)


# -- the approval prompt ------------------------------------------------------------


async def test_a_decision_key_decides_the_prompt_on_screen_and_nothing_else(
    tmp_path: Path,
) -> None:
    """Approvals arrive one after another; keys land at every moment of a
    prompt's life (before it is drawn, while it shows, as it closes, after),
    and some approvals are settled by another Face meanwhile. The face never
    crashes, decides each approval at most once, and only ever decides the
    approval whose prompt was on screen when the key was pressed."""
    rng = random.Random(24)
    async with terminal_face(tmp_path) as face:
        for i in range(ROUNDS):
            if i % 10 == 9:  # a fresh conversation now and then: the log stays short
                before = face.cid
                await face.press("ctrl+n")
                await face.opened(before)
            chat, approval_id = await face.ask()
            race = rng.choice(["early", "shown", "elsewhere", "twice", "text"])
            if race == "early":
                # Pressed as the approval reaches the face: before its prompt is drawn.
                await until(lambda a=approval_id: a in face.app.client.approvals, 5.0)
                await face.press(rng.choice(["ctrl+a", "ctrl+d", "enter"]))
            elif race == "elsewhere":
                await until(lambda a=approval_id: a in face.app.client.approvals, 5.0)
                await face.rig.command(
                    face.other, "face.approval.resolve", approval_id=approval_id,
                    decision="deny_once",
                )
                await face.press(rng.choice(["ctrl+a", "ctrl+d"]))
            elif race == "text":
                for key in "hi":
                    await face.press(key)
            if face.prompt() is not None or race != "elsewhere":
                # Decide it here once the prompt shows (unless it went already).
                await until(
                    lambda a=approval_id: face.shown() == a
                    or a in face.decided()
                    or a not in face.app.client.approvals,
                    5.0,
                )
                if face.shown() == approval_id:
                    # Enter and Esc decide nothing (typed through); Tab then
                    # Enter presses the button Tab reached.
                    keys = rng.choice([["ctrl+a"], ["ctrl+d"], ["enter", "ctrl+a"],
                                       ["escape", "ctrl+d"], ["tab", "enter"]])
                    for key in keys:
                        await face.press(key)
                    if race == "twice":
                        await face.press(rng.choice(["ctrl+a", "ctrl+d"]))
                elif approval_id not in face.decided():
                    await face.rig.command(
                        face.other, "face.approval.resolve", approval_id=approval_id,
                        decision="deny_once",
                    )
            await face.finish(chat, approval_id)
            decided = face.decided()
            assert len(decided) == len(set(decided)), f"iteration {i}: decided twice: {decided}"
            stray = [a for a in decided if a not in face.pressed_for]
            assert not stray, f"iteration {i} ({race}): decided without its prompt: {stray}"
        assert face.app.is_running


class PromptHost(App[None]):
    """Just a message box and one approval prompt over it."""

    def __init__(self) -> None:
        super().__init__()
        self.decided: list[tuple[str, str]] = []
        self.typed: list[str] = []  # keys the prompt passed on to the box

    def compose(self) -> ComposeResult:
        yield Input(id="input")

    def type_through(self, key: events.Key) -> None:
        self.typed.append(key.key)
        if key.is_printable:
            self.query_one(Input).insert_text_at_cursor(key.character or "")

    def open_prompt(self, approval_id: str = "a_1") -> ApprovalScreen:
        prompt = ApprovalScreen(
            ApprovalRequested(approval_id=approval_id, tool="exec_command",
                              args={"argv": ["true"]}),
            "here",
            decide=lambda approval_id, decision: self.decided.append((approval_id, decision)),
            type_through=self.type_through,
            left=lambda: "1:59",
        )
        self.push_screen(prompt)
        return prompt


async def test_a_prompt_decides_its_own_approval_once_and_only_once_drawn() -> None:
    host = PromptHost()
    async with host.run_test() as pilot:
        prompt = host.open_prompt()
        # Before it is drawn nobody can have answered it: nothing is decided.
        assert not prompt.armed
        assert prompt.decide("allow_once") is False
        await until(lambda: prompt.armed, 5.0)
        assert host.decided == []
        await pilot.press("h", "i")  # typing goes on, into the box under it
        assert host.query_one(Input).value == "hi"
        await pilot.press("ctrl+a")
        assert host.decided == [("a_1", "allow_once")]
        assert host.screen is not prompt
        # Whatever comes late — a second decision, a button press, a second
        # close (settled elsewhere) — changes nothing and closes nothing else.
        assert prompt.decide("deny_once") is False
        prompt.on_button_pressed(Button.Pressed(Button("Deny once", id="deny")))
        prompt.close()
        await pilot.pause(0)
        assert host.decided == [("a_1", "allow_once")]
        assert len(host.screen_stack) == 1


async def test_an_enter_or_escape_typed_while_a_prompt_shows_decides_nothing() -> None:
    """A person typing a message can hit Enter (or Esc) the instant a prompt
    appears: the prompt needs its own keys (ctrl+a, ctrl+d, or a button
    reached with Tab), so Enter goes on to the message box under it and Esc
    does nothing, however long the prompt has shown."""
    host = PromptHost()
    async with host.run_test() as pilot:
        prompt = host.open_prompt()
        await until(lambda: prompt.armed, 5.0)
        await pilot.press("enter", "escape", "enter")
        assert host.decided == []
        assert host.typed == ["enter", "enter"]
        assert host.screen is prompt
        await pilot.press("tab", "enter")  # Tab reaches a button: a deliberate choice
        assert host.decided == [("a_1", "deny_once")]


async def test_a_prompt_settled_elsewhere_closes_once_and_decides_nothing() -> None:
    host = PromptHost()
    async with host.run_test() as pilot:
        prompt = host.open_prompt()
        prompt.close()  # before it was even mounted
        prompt.close()
        await pilot.pause(0)
        await pilot.press("ctrl+d", "enter")
        assert host.decided == []
        assert len(host.screen_stack) == 1
        assert not prompt.armed


async def test_hundreds_of_prompts_closed_and_decided_in_any_order_stay_harmless() -> None:
    """Prompts open and close in every order the face can produce — settled
    elsewhere before or after they were drawn, decided by key or button,
    closed twice, pressed late — with no crash, no prompt left behind, at
    most one decision per approval, and none before it was drawn."""
    rng = random.Random(300)
    host = PromptHost()
    async with host.run_test() as pilot:
        for i in range(300):
            prompt = host.open_prompt(f"a_{i}")
            steps = rng.sample(["settle", "key", "button", "wait"], k=rng.randint(1, 4))
            if not prompt.armed:  # nothing awaited since it opened: not drawn yet
                assert prompt.decide(rng.choice(["allow_once", "deny_once"])) is False
            for step in steps:
                if step == "wait":
                    await pilot.pause(0)
                elif step == "settle":
                    prompt.close()
                elif step == "key":
                    host.post_message(key_event(rng.choice(["ctrl+a", "ctrl+d", "enter", "x"])))
                    await pilot.pause(0)
                else:
                    prompt.on_button_pressed(Button.Pressed(Button("Allow once", id="allow")))
            prompt.close()  # settled elsewhere, after all that
            await pilot.pause(0)
            assert len(host.screen_stack) == 1, f"round {i}: {steps}"
            mine = [d for d in host.decided if d[0] == f"a_{i}"]
            assert len(mine) <= 1, f"round {i}: {steps}"
            assert not mine or prompt.decision == mine[0][1]


async def test_an_approval_elsewhere_is_reached_and_a_switch_decides_nothing(
    tmp_path: Path,
) -> None:
    """Two conversations; approvals arrive in the first while the second is
    open. ctrl+g goes there and its prompt opens; keys pressed during the
    switch decide nothing; leaving and coming back reopens a prompt still
    waiting; an approval settled elsewhere meanwhile never prompts."""
    rng = random.Random(8)
    async with terminal_face(tmp_path) as face:
        first = face.cid
        await face.press("ctrl+n")
        second = await face.opened(first)
        for i in range(25):
            assert face.app.current == second
            chat, approval_id = await face.ask(first)
            face.app.tick()
            await until(lambda: "ctrl+g go there" in str(face.app.approvals_line.render()), 5.0)
            settle_elsewhere = rng.random() < 0.3
            if settle_elsewhere:
                await face.rig.command(
                    face.other, "face.approval.resolve", approval_id=approval_id,
                    decision="deny_once",
                )
            await face.press("ctrl+g")
            await face.press("ctrl+a")  # as the switch happens: before any prompt is drawn
            if not settle_elsewhere:
                await until(
                    lambda a=approval_id: face.shown() == a or a in face.decided(), 5.0
                )
                if face.shown() == approval_id:
                    await face.press(rng.choice(["ctrl+a", "ctrl+d", "enter"]))
            await face.finish(chat, approval_id)
            assert face.prompt() is None
            decided = face.decided()
            assert len(decided) == len(set(decided)), f"round {i}: decided twice"
            assert set(decided) <= set(face.pressed_for), f"round {i}: decided unseen"
            await face.go_to(second)  # by keyboard, for the next round


async def test_the_open_prompt_counts_down_to_its_expiry_and_its_footer_has_the_keys(
    tmp_path: Path,
) -> None:
    async with terminal_face(tmp_path) as face:
        ttl = face.rig.mind.config.approval_ttl_s
        chat, approval_id = await face.ask()
        await until(lambda: face.shown() == approval_id, 5.0)
        prompt = face.prompt()
        assert prompt is not None
        countdown = prompt.query_one("#countdown", Static)
        assert str(countdown.render()) == f"expires in {clock(ttl)}"
        face.rig.advance(61.0)
        face.app.tick()
        assert str(countdown.render()) == f"expires in {clock(ttl - 61.0)}"
        # The bar under the conversation says it too, and the keys that decide
        # are in the prompt's footer.
        assert f"({clock(ttl - 61.0)} left)" in str(face.app.approvals_line.render())
        deciding = {("ctrl+a", "Allow once"), ("ctrl+d", "Deny once")}
        await until(lambda: deciding <= {(k.key, k.description) for k in prompt.query(FooterKey)})
        # It expires: the prompt closes by itself, deciding nothing.
        face.rig.advance(ttl)
        assert await face.finish(chat, approval_id) == "expired"
        await until(lambda: face.prompt() is None, 5.0)
        assert face.decided() == []


async def test_tool_output_shows_in_its_card_preformatted_and_scrollable(
    tmp_path: Path,
) -> None:
    """``ls -l`` stays a listing: its line breaks and columns kept, inside
    the tool's card, scrollable when long, its control characters escaped."""
    rows = [f"-rw-r--r-- 1 me me {n:5d} Dec  2 05:00 file-{n:03d}.txt" for n in range(40)]
    listing = "total 160\n" + "\n".join(rows) + "\n\x1b]0;owned\x07\x1b[2J\n"
    async with terminal_face(tmp_path) as face:
        chat, approval_id = await face.ask()
        await until(lambda: face.shown() == approval_id, 5.0)
        await face.press("ctrl+a")
        order = await face.rig.take(face.hand, lambda f: f["type"] == "hand.run")
        run = order["payload"]
        face.hand.send("hand.result", honest_result(run["run_id"], run["generation"],
                                                    stdout=listing))
        await face.rig.reply(face.other, chat)
        log = face.app.log_view
        await until(lambda: bool(log.query(ToolBox)) and "file-039" in shown_output(log), 5.0)
        await face.pilot.pause(0)
        box = log.query_one(ToolBox)
        text = shown_output(log)
        assert text.splitlines()[:3] == ["total 160", rows[0], rows[1]]  # one line each
        assert "\x1b" not in text and "\x07" not in text
        assert "\\x1b]0;owned\\x07\\x1b[2J" in text
        # In the card, under its line; long output scrolls inside it.
        assert "exec_command" in str(box.line.render()) and "succeeded" in str(box.line.render())
        assert box.output.display
        assert box.output.virtual_size.height > box.output.size.height > 0
        assert box.output.max_scroll_y > 0


def shown_output(log: Widget) -> str:
    """The text of the (first) tool card's output, as drawn."""
    boxes = list(log.query(ToolBox))
    return str(boxes[0].text.render()) if boxes else ""


async def test_the_connection_line_tells_the_news_then_says_live_and_offers_only_what_works(
    tmp_path: Path,
) -> None:
    async with terminal_face(tmp_path) as face:
        app = face.app
        chat, approval_id = await face.ask()  # a reply in progress here
        await until(lambda: app.check_action("cancel_chat", ()) is True, 5.0)
        face.down = True
        face.links[-1].cut()
        await until(lambda: app.client.status.state == "reconnecting", 5.0)
        # Nobody would hear a cancel now: it is not offered.
        assert app.check_action("cancel_chat", ()) is False
        face.down = False
        app.client.reconnect_now()
        await until(lambda: app.client.status.state == "resumed", 5.0)
        app.tick()
        assert str(app.status_line.render()).startswith("● resumed:")
        assert app.check_action("cancel_chat", ()) is True
        face.rig.advance(NEWS_S)
        app.tick()
        assert str(app.status_line.render()) == "● live · ws://mind.test/v1/face"
        await face.rig.command(
            face.other, "face.approval.resolve", approval_id=approval_id, decision="deny_once"
        )
        await face.finish(chat, approval_id)


def test_an_interrupted_reply_says_which_shown_words_were_not_saved() -> None:
    note = "… (the last words shown were not saved: “charlie delta”)"
    assert unsaved_note(" charlie\ndelta") == note
    long = " ".join(f"w{i}" for i in range(40))
    assert unsaved_note(long).endswith("w38 w39”)")
    assert "\x1b" not in unsaved_note("\x1b[2J")
