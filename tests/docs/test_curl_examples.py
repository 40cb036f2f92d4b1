"""The curl examples of docs/protocol.md, run with the real ``curl`` against a
real ``halfpi mind``, so the documentation cannot drift from the door.

An example is a ```sh block holding one ``curl`` command (``\\`` continues
a line) and a line ``# → STATUS BODY`` saying what it answers. The command
runs in bash with ``$TOKEN`` (the Mind's face token) and ``$CID`` (a
conversation it created) set, the documented address replaced by the
Mind's; the status must be the documented one, and where the documented
body names an error ``code``, the answer's code must be that one. A body
documented as ``text/event-stream`` is an SSE stream: it is read for a few
seconds and must be one (``retry:`` first, then the stream's
``face.accepted``); the ``id:`` of its last event is ``$LAST_ID`` for the
examples after it. The examples run in the order the chapter gives them
(later ones build on earlier ones: the same Idempotency-Key again, the
last id of a stream).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import programs
from tests.support.http_door import base_url
from tests.support.mind import MindProcess

DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
DOCUMENTED = "http://127.0.0.1:15707"
BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)
ANSWER = re.compile(r"^# → (\d{3})(?: (.*))?$")
CODE = re.compile(r'"code":"([a-z_]+)"')


@dataclass(frozen=True)
class Example:
    line: int  # where it is in docs/protocol.md
    command: str
    status: int
    code: str | None  # the error code its documented body names
    stream: bool  # documented as an SSE stream (text/event-stream)


def examples(text: str) -> list[Example]:
    found = []
    for block in BLOCK.finditer(text):
        body = block.group(1)
        if "curl" not in body:
            continue
        line = text.count("\n", 0, block.start()) + 1
        lines = body.splitlines()
        answers = [i for i, ln in enumerate(lines) if ANSWER.match(ln)]
        assert len(answers) == 1, f"docs/protocol.md:{line}: one '# → STATUS' line per example"
        answer = ANSWER.match(lines[answers[0]])
        assert answer is not None
        command = "\n".join(lines[: answers[0]]).replace("\\\n", " ")
        assert command.lstrip().startswith("curl "), f"docs/protocol.md:{line}"
        code = CODE.search(answer.group(2) or "")
        found.append(Example(line, command, int(answer.group(1)),
                             code.group(1) if code else None,
                             answer.group(2) == "text/event-stream"))
    return found


EXAMPLES = examples(DOCS.read_text())


STREAM_SECONDS = 3  # how long a stream example is read (curl --max-time)
CURL_TIMED_OUT = 28  # curl's exit status when --max-time ends the transfer


def test_the_chapter_has_curl_examples() -> None:
    assert len(EXAMPLES) >= 10
    assert any(e.stream for e in EXAMPLES)
    assert {e.status for e in EXAMPLES} >= {200, 202, 400, 401, 404, 409}


@pytest.fixture(scope="module")
def last_id() -> dict[str, str]:
    """The id: of the last event of the last stream example read."""
    return {}


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MindProcess, str]]:
    programs.require("curl")  # .ci/run installs it (HALFPI_CURL=required)
    home = tmp_path_factory.mktemp("curl") / "home"
    home.mkdir()
    proc = MindProcess(home)
    proc.start()
    try:
        made = subprocess.run(
            ["curl", "-s", "-X", "POST", "-H", f"Authorization: Bearer {proc.token}",
             "-H", "Idempotency-Key: the-examples-conversation", "-d", '{"name": "plans"}',
             f"{base_url(proc.url)}/v1/commands/face.conversation.create"],
            capture_output=True, check=True, timeout=30,
        )
        yield proc, json.loads(made.stdout)["data"]["conversation_id"]
    finally:
        proc.kill()


@pytest.mark.e2e
@pytest.mark.parametrize("example", EXAMPLES, ids=[f"line{e.line}" for e in EXAMPLES])
def test_the_curl_example_answers_what_the_docs_say(
    running: tuple[MindProcess, str], last_id: dict[str, str], example: Example,
    tmp_path: Path,
) -> None:
    proc, cid = running
    body = tmp_path / "body"
    command = example.command.replace(DOCUMENTED, base_url(proc.url))
    limit = f" --max-time {STREAM_SECONDS}" if example.stream else ""
    script = f"{command}{limit} -o {body} -w '%{{http_code}}'"
    env = dict(os.environ, TOKEN=proc.token, CID=cid, LAST_ID=last_id.get("id", ""))
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                          timeout=60)
    where = f"docs/protocol.md:{example.line}"
    if example.stream:
        # A stream does not end by itself: curl stops it at --max-time.
        assert done.returncode == CURL_TIMED_OUT, (where, done.stderr)
        assert int(done.stdout) == example.status, (where, body.read_text())
        text = body.read_text()
        assert text.startswith("retry: "), (where, text[:200])
        assert "event: face.accepted\n" in text, (where, text[:500])
        ids = [ln[len("id: "):] for ln in text.splitlines() if ln.startswith("id: ")]
        assert ids, (where, text[:500])
        if "Last-Event-ID" in example.command:
            # Resumed from the id the example before it read: exactly.
            assert '"replay":"exact"' in text, (where, text[:500])
        last_id["id"] = ids[-1]
        return
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == example.status, (where, body.read_text())
    answer = json.loads(body.read_text())
    if example.code is not None:
        assert answer["error"]["code"] == example.code, where
