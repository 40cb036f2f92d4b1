"""What the headless face says on stderr while it cannot reach its Mind.

Every attempt is a ``face.status`` line on stdout (for programs); stderr is
for a person: what is tried and why it fails, the same reason again only at
attempts 2, 4, 8, 16…, and one line when the Mind is back.
"""

from __future__ import annotations

from halfpi.face.headless import ConnectionNotes
from halfpi.face.results import Status

URL = "ws://127.0.0.1:9/v1/face"
REFUSED = "connection refused: nothing listens there"


def test_the_same_failure_is_repeated_at_doubling_attempts_only() -> None:
    notes = ConnectionNotes()
    statuses = [Status("reconnecting", attempt=n, next_in=2.0) for n in range(1, 21)]
    said = [line for s in statuses if (line := notes.status(s, URL, REFUSED))]
    assert len(said) == 5, said  # attempts 1, 2, 4, 8, 16
    assert said[0].startswith(f"cannot reach the Mind at {URL}: {REFUSED}; retrying in 2.0 s")
    assert [s.rsplit("(attempt ", 1)[1] for s in said[1:]] == ["2)", "4)", "8)", "16)"]


def test_a_new_reason_is_said_at_once_and_being_back_is_said_once() -> None:
    notes = ConnectionNotes()
    assert notes.status(Status("reconnecting", attempt=1, next_in=1.0), URL, REFUSED)
    assert notes.status(Status("reconnecting", attempt=3, next_in=1.0), URL, REFUSED) is None
    other = notes.status(Status("reconnecting", attempt=3, next_in=1.0), URL, "timed out")
    assert other is not None and "timed out" in other
    assert notes.status(Status("live"), URL, "") == f"connected to {URL}"
    assert notes.status(Status("live"), URL, "") is None  # no failure since: nothing to say


def test_stdin_read_after_the_face_ended_ends_quietly() -> None:
    import asyncio
    import io

    from halfpi.face.headless import read_lines

    loop = asyncio.new_event_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    loop.close()  # Ctrl+C: the face's loop is gone when stdin reaches its end
    read_lines(io.StringIO('{"type": "face.ping", "payload": {}}\n'), queue, loop)
    assert queue.empty()
