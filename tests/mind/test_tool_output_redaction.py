"""The Mind redacts the exact values of its own secrets from tool output
(DESIGN §8, issue 23 item 3a): the provider's API key, the metrics token and
the stream key, in progress (also when a chunk boundary cuts one in two),
results, what the agent is given and task logs — before anything is stored
or shown; counted for ``/metrics`` and logged without the value."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import secrets
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from halfpi.mind.redaction import OutputRedaction
from tests.support.client import FaceClient
from tests.support.frames import event
from tests.support.metrics import samples
from tests.support.mind import LocalMind, hand_ready, local_mind
from tests.support.rig import Peer, Rig

# Writes the secrets of the file named by argv[1], the first one cut by the
# 4 KiB read boundary of the Hand's pipe.
LEAK = (
    "import sys, time\n"
    "out = sys.stdout.buffer\n"
    "first, *rest = open(sys.argv[1], 'rb').read().split()\n"
    "out.write(b'x' * 4086 + first[:15]); out.flush(); time.sleep(0.3)\n"
    "out.write(first[15:] + b'\\n' + b'\\n'.join(rest) + b'\\n'); out.flush()\n"
)


@contextlib.asynccontextmanager
async def leaky_mind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     ) -> AsyncIterator[tuple[LocalMind, dict[str, str], Path]]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    values = {"provider API key": "sk-proj-" + secrets.token_urlsafe(40),
              "metrics token": "metrics-" + secrets.token_hex(16),
              "stream key": secrets.token_hex(32)}
    monkeypatch.setenv("OPENAI_API_KEY", values["provider API key"])
    (home / "stream.key").write_text(values["stream key"] + "\n")
    leak = tmp_path / "copied.txt"  # the secrets, copied where a tool may read
    leak.write_text("\n".join(values.values()) + "\n")
    script = tmp_path / "leak.py"
    script.write_text(LEAK)
    async with local_mind(home, metrics_token=values["metrics token"],
                          hand_approval=(("exec_command", "never"),)) as lmind:
        await hand_ready(lmind)
        yield lmind, values, leak


def stored(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return "\n".join(str(row) for table in ("tool_calls", "messages", "events")
                         for row in conn.execute(f"SELECT * FROM {table}"))


async def test_the_minds_secrets_never_leave_through_a_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with leaky_mind(tmp_path, monkeypatch) as (lmind, values, leak):
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid, detail_mode="transparent")
        for content in (
            "/tool exec_command " + json.dumps({"argv": [sys.executable,
                                                         str(tmp_path / "leak.py"), str(leak)]}),
            "/tool read_file " + json.dumps({"path": str(leak)}),
        ):
            done = await face.chat_to_end(cid, content)
            assert done["payload"]["status"] == "succeeded", done
        completed = [f for f in face.seen if event("chat.tool_completed")(f)]
        assert len(completed) == 2
        for frame in completed:
            # What is shown is not all the tool wrote; its size and digest are.
            assert frame["payload"]["data"]["truncated"] is True, frame
            assert frame["payload"]["data"]["output_bytes"] == leak.stat().st_size + (
                4086 if "exec_command" in frame["payload"]["data"]["tool"] else 0)
            shown = frame["payload"]["data"]["result"]["stdout"]
            for kind in values:
                assert f"[redacted: {kind}]" in shown, shown[-300:]
        progress = "".join(f["payload"]["data"] for f in face.seen
                           if f["type"] == "face.chat.tool.progress")
        assert progress.startswith("x" * 4086 + "[redacted: provider API key]\n"), progress[4000:]
        everything = json.dumps(face.seen) + stored(lmind.config.db_path) + caplog.text
        for kind, value in values.items():
            assert value not in everything, kind
            assert value[:20] not in everything, kind
        counted = samples(lmind.mind, "halfpi_tool_output_redactions", "kind")
        assert counted == {("halfpi_tool_output_redactions_total", k): 2 for k in values}
        audit = [r.getMessage() for r in caplog.records if "redacted" in r.getMessage()]
        assert audit and all("provider API key" in line or "metrics token" in line
                             for line in audit), audit
        await face.close()


async def test_a_read_cut_inside_a_secret_shows_no_piece_of_it_worth_having(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``read_file``'s ``max_bytes`` (needing no approval) chooses where the
    output ends: cut one character short of the provider key, it must not
    show the key less its last character. A piece of at least half a
    secret at the end of an output is taken out, and counted."""
    async with leaky_mind(tmp_path, monkeypatch) as (lmind, values, leak):
        key = values["provider API key"]
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid, detail_mode="transparent")
        for cut in (len(key) - 1, len(key) // 2 + 1):
            done = await face.chat_to_end(cid, "/tool read_file " + json.dumps(
                {"path": str(leak), "max_bytes": cut}))
            assert done["payload"]["status"] == "succeeded", done
        everything = json.dumps(face.seen) + stored(lmind.config.db_path)
        assert key[: len(key) // 2 + 1] not in everything
        counted = samples(lmind.mind, "halfpi_tool_output_redactions", "kind")
        assert counted[("halfpi_tool_output_redactions_total", "provider API key")] == 2
        await face.close()


async def test_a_task_log_is_read_with_the_minds_secrets_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with leaky_mind(tmp_path, monkeypatch) as (lmind, values, leak):
        face = await FaceClient.connect(lmind.url, lmind.token)
        cid = await face.create_conversation()
        await face.subscribe(cid, detail_mode="transparent")
        started = await face.chat_to_end(
            cid, "/task exec_command " + json.dumps({"argv": ["cat", str(leak)]}))
        assert started["payload"]["status"] == "succeeded", started
        ended = await face.expect(event("task.completed"), 20)
        task_id = ended["payload"]["data"]["task"]["task_id"]
        asked = await face.command("face.task.log", task_id=task_id, offset=0)
        page = (await face.reply(asked))["payload"]["data"]
        for kind, value in values.items():
            assert value not in json.dumps(page)
            assert f"[redacted: {kind}]" in page["data"], page
        await face.close()


def test_a_result_the_mind_redacted_says_it_is_not_whole() -> None:
    """From a Hand that does not know the Mind's secrets (any but the local
    one): what is shown is not all the tool wrote; its size and digest still
    say what it wrote (DESIGN §6)."""
    key = "sk-" + secrets.token_urlsafe(30)
    redaction = OutputRedaction(lambda: {key: "provider API key"})
    result = {"status": "succeeded", "stdout": f"KEY={key}\n", "stderr": "",
              "output_bytes": len(key) + 5, "digest": "sha256:" + "0" * 64, "truncated": False}
    shown = redaction.result(result, "a test")
    assert shown["stdout"] == "KEY=[redacted: provider API key]\n"
    assert shown["truncated"] is True
    assert (shown["output_bytes"], shown["digest"]) == (result["output_bytes"], result["digest"])
    assert redaction.counts == {"provider API key": 1}
    plain = redaction.result({**result, "stdout": "nothing secret\n"}, "a test")
    assert plain["truncated"] is False


async def test_a_log_page_that_would_cut_a_secret_ends_before_it(tmp_path: Path) -> None:
    """Pages are read by offset, one at a time: a page of a task that may
    still write ends before a secret it would cut in two; the next page
    starts there and shows it redacted, whole."""
    from tests.mind.test_tasks import receipt, task_delivered, task_event
    from tests.support.rig import fake_time_mind

    token = "metrics-" + secrets.token_hex(16)
    async with fake_time_mind(tmp_path / "home", metrics_token=token) as rig:
        hand, face, _cid, task_id, order = await task_delivered(rig)
        hand.send("hand.task.receipt", receipt(order))
        await rig.expect(face, task_event("task.progress", task_id=task_id))
        written = [(0, b"built " + token[:12].encode(), "running"),
                   (6, b"built " + token.encode() + b" done\n", "succeeded")]
        shown = [await log_page(rig, face, hand, task_id, log, offset, 65_536, state)
                 for offset, log, state in written]
        assert [(p["data"], p["next_offset"]) for p in shown] == [
            ("built ", 6), ("[redacted: metrics token] done\n", 6 + len(token) + 6)]


async def test_a_log_read_from_any_offset_with_any_limit_never_shows_a_secret(
    tmp_path: Path,
) -> None:
    """The offset and the limit are the reader's: a page that starts inside
    a secret, or pages smaller than it, must not show it piece by piece.
    The Hand (a remote one: it does not know the Mind's secrets) answers
    as a real one does, from its log."""
    from tests.mind.test_tasks import receipt, task_delivered, task_event
    from tests.support.rig import fake_time_mind

    token = "metrics-" + secrets.token_hex(16)
    log = b"built\n" + token.encode() + b"\ndone\n"
    at = log.index(token.encode())
    async with fake_time_mind(tmp_path / "home", metrics_token=token) as rig:
        hand, face, _cid, task_id, order = await task_delivered(rig)
        hand.send("hand.task.receipt", receipt(order))
        await rig.expect(face, task_event("task.progress", task_id=task_id))

        async def page(offset: int, limit: int, state: str) -> dict[str, Any]:
            return await log_page(rig, face, hand, task_id, log, offset, limit, state)

        for state in ("running", "succeeded"):
            # Inside the secret, to its end: no piece of it.
            for offset in (at + 1, at + 8, at + len(token) - 4):
                shown = await page(offset, 64, state)
                assert shown["offset"] == offset
                assert token[-4:] not in shown["data"], (offset, shown)
            # Page by page, a few bytes at a time, from the start: the pages
            # together never hold it, and the reader reaches the end.
            offset, seen = 0, ""
            for _ in range(len(log)):
                shown = await page(offset, 5, state)
                seen += shown["data"]
                if shown["next_offset"] == offset:
                    break
                offset = shown["next_offset"]
            assert token[8:16] not in seen and token[-6:] not in seen, seen
            if state == "succeeded":
                assert seen == "built\n[redacted: metrics token]\ndone\n", seen


async def log_page(rig: Rig, face: Peer, hand: Peer, task_id: str, log: bytes,
                   offset: int, limit: int, state: str) -> dict[str, Any]:
    """``face.task.log`` at ``offset``, answered as a Hand does from ``log``
    (what it asked for, as much as there is)."""
    asked = await rig.command(face, "face.task.log", task_id=task_id,
                              offset=offset, limit=limit)
    wanted = (await rig.take(hand, lambda f: f["type"] == "hand.task.log"))["payload"]
    start, size = wanted["offset"], wanted["limit"]
    data = log[start:start + size]
    hand.send("hand.task.log_page", {
        "task_id": "h1", "offset": start, "next_offset": start + len(data),
        "data_b64": base64.b64encode(data).decode(), "truncated": False, "state": state})
    return dict((await rig.reply(face, asked))["payload"]["data"])


def test_the_passwords_of_the_store_and_redis_urls_are_secrets_too(tmp_path: Path) -> None:
    """In cluster mode the Mind holds passwords in its store and Redis URLs
    (or ``PGPASSWORD``); a command line is readable by any process (``ps``),
    so they are redacted from tool output like the provider key."""
    from halfpi.config import Config
    from halfpi.mind.redaction import configured_secrets

    config = Config(home=tmp_path, store_url="postgresql://halfpi:pg-Secret-1234@db/halfpi",
                    redis_url="redis://:redis-Secret-5678@cache:6379/0")
    found = configured_secrets(config, environ={"PGPASSWORD": "env-Secret-9012"})
    assert found == {"pg-Secret-1234": "database password",
                     "redis-Secret-5678": "database password",
                     "env-Secret-9012": "database password"}
    query = Config(home=tmp_path, store_url="postgresql://db/halfpi?user=h&password=q-Secret-3456")
    assert configured_secrets(query, environ={}) == {"q-Secret-3456": "database password"}
