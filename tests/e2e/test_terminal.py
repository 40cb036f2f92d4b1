"""The terminal face driven in a real terminal, as a person would use it.

Each test runs a real ``halfpi mind`` and ``halfpi face`` in tmux, types with
``send-keys`` and reads the screen with ``capture-pane``. Every wait is for
something on the screen, with a deadline; none is a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.support import programs
from tests.support.client import FaceClient
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.usefixtures("tmux_installed"),
]


@pytest.fixture
def tmux_installed() -> None:
    """Skips without tmux (the run's summary names it); CI requires it (HALFPI_TMUX)."""
    programs.require("tmux")


WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliett", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"]
LIVE = "● "  # the connection line while connected


class Tmux:
    """One tmux server of its own per session (``-L``): a server shared with
    other test runs exits when their last session ends, under our feet."""

    def __init__(self, name: str) -> None:
        self.name = f"{name}-{os.getpid()}"
        self.tmux = ["tmux", "-L", self.name]

    def start(self, command: str, width: int = 140, height: int = 36) -> None:
        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", str(width),
                        "-y", str(height), command], check=True)

    def keys(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def type(self, text: str) -> None:
        """Literal text (no key names), as typed."""
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, "-l", text], check=True)

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.name],
                              capture_output=True, text=True, check=True).stdout

    async def wait_for(self, predicate: Callable[[str], bool], timeout: float = 20.0) -> str:
        """Wait until the screen satisfies ``predicate``; the event loop keeps
        running meanwhile (a fault proxy or a second Face may live in it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if loop.time() > deadline:
                raise TimeoutError(f"screen never matched; it shows:\n{screen}")
            await asyncio.sleep(0.05)

    def kill(self) -> None:
        """The server of this session and its panes' processes (the Face):
        nothing is left running after the test (``kill-server`` takes no
        target: with one it fails and kills nothing)."""
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def face_command(home: Path, url: str) -> str:
    # COLUMNS/LINES from the tmux server's environment (whoever started it)
    # would override the pane's real size: the face must measure the pane.
    return (f"env -u COLUMNS -u LINES HALFPI_HOME={home} TERM=xterm-256color "
            f"{sys.executable} -m halfpi.cli face --url {url}")


def status_line(screen: str) -> str:
    """The connection line: the last line above the footer."""
    lines = screen.rstrip().splitlines()
    return lines[-2] if len(lines) >= 2 else ""


def is_live(screen: str) -> bool:
    return status_line(screen).lstrip().startswith(LIVE)


def chat_area(screen: str) -> str:
    """The conversation log only: right of the list, below the title, above
    the message box."""
    lines = screen.splitlines()
    end = next((i for i, line in enumerate(lines) if "┏━" in line[30:] or "╭─" in line[30:]),
               len(lines))
    return "\n".join(line[32:] for line in lines[1:end])


def ready(screen: str) -> bool:
    """Connected, with a conversation open (its title line is drawn)."""
    return is_live(screen) and "c_" in screen.splitlines()[0]


@contextlib.asynccontextmanager
async def running(tmp_path: Path, name: str, **mind: object) -> AsyncIterator[
    tuple[MindProcess, Tmux]
]:
    home = tmp_path / "home"
    home.mkdir()
    proc = MindProcess(home, **mind).start()  # type: ignore[arg-type]
    tmux = Tmux(name)
    try:
        yield proc, tmux
    finally:
        tmux.kill()
        proc.kill()


# -- 1. nothing typed is lost: a conversation is open from the start ---------------


async def test_text_typed_before_the_mind_answers_is_sent_into_a_new_conversation(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()  # first start: makes the token, no conversation
    url = mind.url
    mind.terminate()
    tmux = Tmux("halfpi-first-hour")
    try:
        tmux.start(face_command(home, url))
        await tmux.wait_for(lambda s: "reconnecting (attempt" in s and "Type a message" in s)
        tmux.type("hello from the first minute")
        tmux.keys("Enter")
        await tmux.wait_for(lambda s: "you · sending…" in s)  # shown, not dropped
        mind.start()
        screen = await tmux.wait_for(
            lambda s: s.count("hello from the first minute") >= 3 and "agent" in s, timeout=30
        )
        # Sent into a new conversation, titled from that message (title line
        # and list); the reply came back.
        assert screen.splitlines()[0].split("  ·")[0].strip().endswith(
            "hello from the first minute"
        )
        assert "you · sending…" not in screen

        # Reopened: the most recent conversation is open at once, and what is
        # typed goes there — no keys needed to pick it.
        tmux.kill()
        tmux = Tmux("halfpi-reopen")
        tmux.start(face_command(home, mind.url))
        await tmux.wait_for(lambda s: ready(s) and "hello from the first minute" in s)
        tmux.type("and a second one")
        tmux.keys("Enter")
        screen = await tmux.wait_for(lambda s: s.count("and a second one") == 2)
        assert screen.count("hello from the first minute") >= 3
        assert "▸ hello from the first" in screen  # one conversation, still current
    finally:
        tmux.kill()
        mind.kill()


async def test_a_message_typed_and_sent_while_the_face_starts_is_sent(tmp_path: Path) -> None:
    """Typed before the face took the terminal (still in its ordinary mode,
    where Enter becomes a line feed): the message is sent, not left in the
    box. A message of several lines (ctrl+j) arrives whole."""
    async with running(tmp_path, "halfpi-early") as (mind, tmux):
        tmux.start(face_command(mind.home, mind.url))
        tmux.type("early bird")
        tmux.keys("Enter")
        await tmux.wait_for(lambda s: chat_area(s).count("early bird") == 2, timeout=30)
        tmux.type("first line")
        tmux.keys("C-j")
        tmux.type("second line")
        tmux.keys("Enter")
        screen = await tmux.wait_for(lambda s: chat_area(s).count("second line") == 2)
        lines = [line.strip() for line in chat_area(screen).splitlines()]
        said = lines.index("first line")
        assert lines[said + 1] == "second line"  # one message, two lines


# -- 2. every advertised key works wherever focus is -------------------------------------


async def test_ctrl_x_cancels_a_reply_right_after_enter(tmp_path: Path) -> None:
    async with running(tmp_path, "halfpi-cancel") as (mind, tmux):
        tmux.start(face_command(mind.home, mind.url))
        await tmux.wait_for(ready)
        tmux.type("/sleep 20")
        tmux.keys("Enter")
        await tmux.wait_for(lambda s: "agent · streaming" in s and "^x Cancel reply" in s)
        tmux.keys("C-x")  # the focus is still in the message box
        # Cancelled, with who did it; nothing left to cancel, so not offered.
        screen = await tmux.wait_for(
            lambda s: "agent · cancelled" in s and "^x Cancel reply" not in s, timeout=10
        )
        assert "✗ cancelled by local" in screen
        # The box still has the focus: typing goes on.
        tmux.type("still here")
        tmux.keys("Enter")
        await tmux.wait_for(lambda s: s.count("still here") == 2)


async def press_again_if_early(tmux: Tmux, key: str, decided: str) -> None:
    """A key sent the instant a prompt's text shows may beat its first
    frame: the face then decides nothing and asks for the key again (no
    person presses that fast). Press it again in that case only."""
    said = await tmux.wait_for(lambda s: decided in s or "again" in s)
    if decided not in said:
        tmux.keys(key)


async def test_ctrl_a_allows_while_the_approval_prompt_shows(tmp_path: Path) -> None:
    async with running(tmp_path, "halfpi-allow") as (mind, tmux):
        marker = tmp_path / "ran"
        tmux.start(face_command(mind.home, mind.url))
        await tmux.wait_for(ready)
        tmux.type(f'/tool exec_command {{"argv": ["touch", "{marker}"]}}')
        tmux.keys("Enter")
        # The footer says ctrl+a allows…
        await tmux.wait_for(lambda s: "Deny once" in s and "^a Allow once" in s)
        tmux.keys("C-a")  # …and it works, though the focus is on the Deny button
        await press_again_if_early(tmux, "C-a", "allowed by local")
        screen = await tmux.wait_for(lambda s: "exec_command succeeded" in s)
        assert "· succeeded · allowed by local" in screen
        assert marker.exists()


async def test_the_approval_prompt_defaults_to_deny(tmp_path: Path) -> None:
    async with running(tmp_path, "halfpi-deny") as (mind, tmux):
        marker = tmp_path / "ran"
        tmux.start(face_command(mind.home, mind.url))
        await tmux.wait_for(ready)
        tmux.type(f'/tool exec_command {{"argv": ["touch", "{marker}"], "api_key": "k-42"}}')
        tmux.keys("Enter")
        prompt = await tmux.wait_for(lambda s: "Deny once" in s and "Allow once" in s)
        assert '"api_key": "***"' in prompt  # masked in the prompt too
        tmux.keys("Tab", "Enter")  # the first button Tab reaches: deny once
        # Keys that beat the prompt's first frame decide nothing ("press it
        # again"): the button Tab chose stays chosen for the next Enter.
        said = await tmux.wait_for(lambda s: "denied by local" in s or "again" in s)
        if "denied by local" not in said:
            tmux.keys("Enter")
        # Nothing waits any more: the keys are not offered.
        screen = await tmux.wait_for(
            lambda s: "denied by local" in s and "\n exec_command denied" in chat_area(s)
            and "^a Allow once" not in s
        )
        # The card is under its message and says who denied it; the reply says it once.
        assert "denied: denied" not in screen
        lines = chat_area(screen).splitlines()
        card = next(i for i, line in enumerate(lines) if "⚙ exec_command" in line)
        asked = next(i for i, line in enumerate(lines) if "/tool exec_command" in line)
        reply = next(i for i, line in enumerate(lines) if line.strip() == "exec_command denied")
        assert asked < card < reply
        assert not marker.exists()


# -- 3/4. the conversation list is live, titled, renamable by keyboard ------------------


async def test_conversations_of_other_faces_appear_titled_and_can_be_renamed(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, "halfpi-list") as (mind, tmux):
        tmux.start(face_command(mind.home, mind.url))
        await tmux.wait_for(ready)
        other = await FaceClient.connect(mind.url, mind.token)
        request_id = await other.command("face.conversation.create")
        created = await other.reply(request_id)
        cid = created["payload"]["data"]["conversation_id"]
        # It appears with no key pressed…
        await tmux.wait_for(lambda s: "│   untitled" in s)
        # …and takes its title from its first message.
        await other.chat_to_end(cid, "Plan the trip to Lisbon\nwith details")
        await tmux.wait_for(lambda s: "Plan the trip to Lisbon" in s)

        # Keyboard only: ctrl+o to the list, ↑ to it, Enter opens it.
        tmux.keys("C-o")
        await tmux.wait_for(lambda s: "┏━ Conversations" in s and "esc Back to message" in s)
        tmux.keys("Up", "Enter")
        await tmux.wait_for(lambda s: cid in s.splitlines()[0] and "▸ Plan the trip" in s)
        # F2 renames it; every Face hears of it.
        tmux.keys("F2")
        await tmux.wait_for(lambda s: "Rename this conversation" in s)
        tmux.type("Lisbon trip")
        tmux.keys("Enter")
        await tmux.wait_for(lambda s: "▸ Lisbon trip" in s)
        news = await other.expect(
            lambda f: f["type"] == "face.conversation.changed"
            and f["payload"]["conversation"]["name"] == "Lisbon trip"
        )
        assert news["payload"]["change"] == "renamed"
        await other.close()


# -- 5. failed, cancelled and interrupted replies stay, with their reason --------------


async def test_failed_and_interrupted_replies_stay_with_their_reason_across_a_crash(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, "halfpi-reasons") as (mind, tmux):
        tmux.start(face_command(mind.home, mind.url))
        await tmux.wait_for(ready)
        tmux.type("/tool exec_command {not json")
        tmux.keys("Enter")
        screen = await tmux.wait_for(lambda s: "agent · failed (agent_bad_input)" in s)
        assert "✗ tool arguments are not JSON" in screen

        tmux.type(f"/pace 150 {' '.join(WORDS * 2)}")
        tmux.keys("Enter")
        await tmux.wait_for(lambda s: "agent · streaming" in s and "charlie delta" in chat_area(s))
        saved = await wait_for_checkpoint(mind.home / "halfpi.db")
        # Killed between two checkpoints: the face has shown more than was saved.
        await tmux.wait_for(lambda s: len(streamed(s)) > len(saved) + 6)
        mind.kill()  # kill -9, mid-reply
        saved = await wait_for_checkpoint(mind.home / "halfpi.db")  # what stands
        down = await tmux.wait_for(lambda s: "reconnecting (attempt" in s)
        shown = streamed(down)  # what the face showed of the reply, to its last word
        mind.start()
        screen = await tmux.wait_for(lambda s: "agent · interrupted" in s, timeout=30)
        lines = [line.strip() for line in chat_area(screen).splitlines()]
        reason = lines.index("✗ the Mind stopped before the reply finished")
        assert lines[reason + 1] == saved  # the text it had kept, no more
        # The words shown after the last checkpoint did not vanish silently.
        assert shown.startswith(saved) and len(shown) > len(saved)
        note = f"… (the last words shown were not saved: “{shown[len(saved):].strip()}”)"
        assert note in " ".join(chat_area(screen).split())
        assert "▌" not in screen
        # The earlier failure survived the resync too, reason and all.
        assert "agent · failed (agent_bad_input)" in screen
        assert "✗ tool arguments are not JSON" in screen


def streamed(screen: str) -> str:
    """The text of the reply streaming on ``screen``, its wrapped lines joined."""
    lines = [line.strip() for line in chat_area(screen).splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("agent · streaming"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i] or "▌" in lines[i])
    return " ".join(lines[start + 1 : end + 1]).rstrip("▌").strip()


async def wait_for_checkpoint(db: Path, timeout: float = 20.0) -> str:
    """Poll the store (read-only) until the running reply has saved text."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            row = conn.execute(
                "SELECT content FROM runs WHERE finished_at IS NULL AND content != ''"
            ).fetchone()
        if row is not None:
            return str(row[0])
        assert loop.time() < deadline, "the reply never saved its text"
        await asyncio.sleep(0.05)


# -- 6. approvals waiting elsewhere are shown, and one key goes there -------------------


async def test_an_approval_waiting_in_another_conversation_is_shown_and_reached(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, "halfpi-elsewhere") as (mind, tmux):
        tmux.start(face_command(mind.home, mind.url))
        await tmux.wait_for(ready)
        script = await FaceClient.connect(mind.url, mind.token)
        cid = await script.create_conversation("deploy")
        chat_id = await script.command(
            "face.chat", conversation_id=cid, content='/tool exec_command {"argv": ["true"]}'
        )
        screen = await tmux.wait_for(
            lambda s: "approval waiting in other conversations" in s and "^g Go to approval" in s
        )
        assert "in “deploy”" in screen and "ctrl+g go there" in screen
        assert "▸ " in screen and "deploy ⚠" in screen  # marked in the list too
        tmux.keys("C-g")
        await tmux.wait_for(lambda s: "Approve tool exec_command in “deploy”?" in s)
        tmux.keys("C-d")
        await press_again_if_early(tmux, "C-d", "denied by local")
        screen = await tmux.wait_for(lambda s: "denied by local" in s)
        assert "approval waiting" not in screen
        result = await script.reply(chat_id)
        assert result["payload"]["content"] == "exec_command denied"
        await script.close()


# -- 7. an honest connection line: where, why, a countdown, and prompt recovery --------


def countdown(screen: str) -> tuple[int, float] | None:
    found = re.search(r"reconnecting \(attempt (\d+), next in (\d+\.\d) s\)", screen)
    return (int(found.group(1)), float(found.group(2))) if found else None


async def test_reconnecting_says_where_and_why_counts_down_and_recovers_promptly(
    tmp_path: Path,
) -> None:
    async with running(tmp_path, "halfpi-reconnect") as (mind, tmux):
        tmux.start(face_command(mind.home, mind.url))
        await tmux.wait_for(ready)
        mind.kill()
        first = await tmux.wait_for(
            lambda s: (c := countdown(s)) is not None and c[1] >= 0.5 and "^r Retry now" in s
        )
        assert f"last try to {mind.url} failed: connection refused" in first
        attempt, left = countdown(first)  # type: ignore[misc]
        # The same attempt, later: the number went down (it is a countdown).
        later = await tmux.wait_for(
            lambda s: (c := countdown(s)) is not None and c[0] == attempt and c[1] < left
        )
        assert countdown(later) is not None
        # The Mind comes back: the face is live again within the 2 s cap a
        # local Mind gets (plus drawing time), not after a 30 s backoff.
        mind.start()
        back = time.monotonic()
        await tmux.wait_for(is_live, timeout=10)
        assert time.monotonic() - back < 4.0


async def test_a_reply_streams_and_completes_once_across_a_cut(tmp_path: Path) -> None:
    async with running(tmp_path, "halfpi-cut") as (mind, tmux):
        proxy = await FaultProxy(mind.port).start()
        try:
            tmux.start(face_command(mind.home, proxy.url))
            await tmux.wait_for(ready)
            tmux.type(f"/pace 120 {' '.join(WORDS)}")
            tmux.keys("Enter")
            await tmux.wait_for(lambda s: "agent · streaming" in s and "alpha bravo" in s)
            # Cut the link and keep the Mind unreachable for a moment.
            assert proxy.server is not None
            proxy.server.close()
            proxy.cut_all()
            await tmux.wait_for(lambda s: "reconnecting (attempt" in s)
            proxy.server = await asyncio.start_server(proxy._accept, "127.0.0.1", proxy.port)
            # The reply completes: the user's line and the agent's both end in "romeo".
            await tmux.wait_for(
                lambda s: chat_area(s).count("romeo") >= 2 and "▌" not in s, timeout=30
            )
            await tmux.wait_for(lambda s: "● resumed:" in s or "● live" in s)
            final = chat_area(tmux.screen())
            # Exactly once: no duplicated reply, no duplicated text inside it.
            assert final.count("romeo") == 2, final
            assert final.count("agent") == 1, final
            assert final.count("alpha") == 2, final
        finally:
            await proxy.stop()
