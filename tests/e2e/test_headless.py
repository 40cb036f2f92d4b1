"""The headless face in a shell pipeline, with the Mind restarted mid-reply."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from halfpi.face.client import FaceClient as SdkClient
from tests.support.cli import face_add
from tests.support.mind import MindProcess

ROOT = Path(__file__).resolve().parents[2]
ASK = ROOT / "examples" / "ask.sh"


def _env(home: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, HALFPI_HOME=str(home), PATH=f"{bin_dir}:{os.environ['PATH']}")


class FifoLog:
    """Reads the pipeline's exchange log through a FIFO as it is written, so
    the test reacts to a line the moment it exists (no polling)."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.lines: list[dict] = []  # type: ignore[type-arg]
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with open(self.path) as fifo:
            for line in fifo:
                with self._cond:
                    self.lines.append(json.loads(line))
                    self._cond.notify_all()

    def wait_for(self, predicate, timeout: float) -> dict:  # type: ignore[no-untyped-def,type-arg]
        with self._cond:
            found = self._cond.wait_for(
                lambda: next((m for m in self.lines if predicate(m)), None), timeout
            )
        if found is None:
            raise TimeoutError("no matching line")
        return found

    def close(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)


@pytest.mark.e2e
def test_pipeline_prints_the_final_answer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        done = subprocess.run(
            [str(ASK), "hello from a pipeline", "--url", mind.url],
            env=_env(home), capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "hello from a pipeline\n"
    finally:
        mind.kill()


@pytest.mark.e2e
def test_pipeline_survives_a_mind_restart_mid_reply(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "exchange.jsonl"
    fifo = FifoLog(log)
    mind = MindProcess(home).start()
    words = " ".join(f"w{i}" for i in range(12))
    try:
        pipeline = subprocess.Popen(
            [str(ASK), f"/pace 150 {words}", "--url", mind.url],
            env=dict(_env(home), HALFPI_ASK_LOG=str(log)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        fifo.wait_for(lambda m: m["type"] == "face.chat.delta", timeout=30)
        mind.restart()  # kill -9, then start again on the same port and home
        out, err = pipeline.communicate(timeout=60)
        assert pipeline.returncode == 0, err
        assert out == words + "\n"
        fifo.close()
        lines = fifo.lines
        # Every line is a protocol message; the first ask ended interrupted
        # (I11: not re-run by the Mind), and the script asked again explicitly.
        assert all(set(m) == {"type", "payload"} for m in lines)
        results = [m["payload"] for m in lines if m["type"] == "face.result"
                   and "content" in m["payload"]]
        assert [r["status"] for r in results] == ["interrupted", "succeeded"]
        assert results[0]["request_id"] != results[1]["request_id"]
        states = [m["payload"]["state"] for m in lines if m["type"] == "face.status"]
        assert "reconnecting" in states
    finally:
        mind.kill()


# -- exit codes and reasons on stderr (docs/faces.md) -------------------------------------

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_CANCELLED = 0, 1, 2, 3
EXIT_DENIED, EXIT_EXPIRED, EXIT_INTERRUPTED, EXIT_USAGE, EXIT_UNREACHABLE = 4, 5, 6, 64, 69


def headless(*args: str) -> list[str]:
    return [sys.executable, "-m", "halfpi.cli", "face", "--mode", "headless", *args]


def lines_in(*commands: dict) -> str:  # type: ignore[type-arg]
    return "".join(json.dumps(c) + "\n" for c in commands)


def reasons(stderr: str) -> list[str]:
    """stderr holds only ``halfpi: …`` lines, never a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert all(line.startswith("halfpi: ") for line in lines), stderr
    return lines


@pytest.mark.e2e
def test_ask_a_failed_chat_exits_1_with_its_reason_on_stderr(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        done = subprocess.run([str(ASK), "/fail", "--url", mind.url],
                              env=_env(home), capture_output=True, text=True, timeout=60)
        assert done.returncode == EXIT_FAILED, done.stderr
        (line,) = reasons(done.stderr)
        assert "failed" in line and "agent_failed" in line, line
    finally:
        mind.kill()


@pytest.mark.e2e
def test_ask_shows_the_waiting_approval_and_exits_5_when_it_expires(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, extra_args=("--approval-ttl", "1")).start()
    try:
        done = subprocess.run(
            [str(ASK), '/tool exec_command {"command": "echo never"}', "--url", mind.url],
            env=_env(home), capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == EXIT_EXPIRED, done.stderr
        waiting, expired = reasons(done.stderr)
        # Which tool, that it waits for a decision in another Face, and until when.
        assert "exec_command" in waiting and "approval" in waiting, waiting
        assert "another Face" in waiting and "until" in waiting, waiting
        assert "exec_command" in expired and "expired" in expired, expired
        assert "never" not in done.stdout  # it did not run
    finally:
        mind.kill()


@pytest.mark.e2e
async def test_ask_exits_4_when_another_face_denies_the_tool(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "exchange.jsonl"
    fifo = FifoLog(log)
    mind = MindProcess(home).start()
    try:
        pipeline = subprocess.Popen(
            [str(ASK), '/tool exec_command {"command": "echo never"}', "--url", mind.url],
            env=dict(_env(home), HALFPI_ASK_LOG=str(log)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        requested = await asyncio.to_thread(
            fifo.wait_for, lambda m: m["type"] == "face.event"
            and m["payload"]["type"] == "approval.requested", 30)
        laptop = await face_add(home, "laptop", "--approve")
        approver = await SdkClient(mind.url, laptop.token).connect()
        try:
            await approver.request("face.approval.resolve",
                                   approval_id=requested["payload"]["data"]["approval_id"],
                                   decision="deny_once", reason="not today")
        finally:
            await approver.close()
        out, err = await asyncio.to_thread(pipeline.communicate, timeout=60)
        assert pipeline.returncode == EXIT_DENIED, err
        lines = reasons(err)
        assert any("denied" in line and "exec_command" in line for line in lines), err
        # People read the decider's label, never its principal id.
        assert any("denied by laptop" in line for line in lines), err
        assert laptop.principal_id not in err
        assert "never" not in out
    finally:
        mind.kill()


@pytest.mark.e2e
def test_a_cancelled_chat_exits_3(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        done = subprocess.run(
            headless("--url", mind.url, "--new-conversation", "c"),
            input=lines_in(
                {"type": "face.chat", "payload": {"request_id": "long", "content": "/sleep 60"}},
                {"type": "face.chat.cancel", "payload": {"target_request_id": "long"}},
            ),
            env=_env(home), capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == EXIT_CANCELLED, done.stderr
        (line,) = reasons(done.stderr)
        assert "long" in line and "cancelled" in line, line
    finally:
        mind.kill()


@pytest.mark.e2e
def test_an_interrupted_chat_not_retried_exits_6(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    words = " ".join(f"w{i}" for i in range(12))
    try:
        face = subprocess.Popen(
            headless("--url", mind.url, "--new-conversation", "c"),
            env=_env(home), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )
        assert face.stdin is not None and face.stdout is not None
        face.stdin.write(lines_in({"type": "face.chat",
                                   "payload": {"content": f"/pace 150 {words}"}}))
        face.stdin.flush()  # stdin stays open: communicate() closes it
        for line in face.stdout:
            if json.loads(line)["type"] == "face.chat.delta":
                break
        mind.restart()
        _, err = face.communicate(timeout=60)
        assert face.returncode == EXIT_INTERRUPTED, err
        assert any("interrupted" in line for line in reasons(err)), err
    finally:
        mind.kill()


@pytest.mark.e2e
def test_an_unreachable_mind_is_explained_and_the_bound_exits_69(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    url = f"ws://127.0.0.1:{port}/v1/face"
    done = subprocess.run(
        headless("--url", url, "--token", "hpf_unused", "--connect-timeout", "1.5"),
        input=lines_in({"type": "face.conversation.list", "payload": {}}),
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    lines = reasons(done.stderr)
    # What it tries, why that fails, and that it tries again; then why it stops.
    assert url in lines[0] and "refused" in lines[0] and "retrying" in lines[0], lines[0]
    assert "1.5 s" in lines[-1] and "--connect-timeout" in lines[-1], lines[-1]


@pytest.mark.e2e
def test_a_refused_token_exits_2_with_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        done = subprocess.run(
            headless("--url", mind.url, "--token", "hpf_not_a_token"),
            input=lines_in({"type": "face.conversation.list", "payload": {}}),
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == EXIT_REFUSED, done.stderr
        (line,) = reasons(done.stderr)
        assert "refused" in line and "token" in line, line
    finally:
        mind.kill()


@pytest.mark.e2e
def test_a_command_the_mind_refuses_exits_1_and_says_why(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        done = subprocess.run(
            headless("--url", mind.url),
            input=lines_in({"type": "face.chat",
                            "payload": {"conversation_id": "c_nope", "content": "hi"}}),
            env=_env(home), capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == EXIT_FAILED, done.stderr
        (line,) = reasons(done.stderr)
        assert "conversation_not_found" in line, line
    finally:
        mind.kill()


@pytest.mark.e2e
def test_a_bad_flag_exits_64(tmp_path: Path) -> None:
    done = subprocess.run(headless("--connect-timeout", "soon"), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == EXIT_USAGE
    (line,) = reasons(done.stderr)
    assert "--connect-timeout" in line


# -- refusals the Mind marks retryable ---------------------------------------------------


class RefusingRelay:
    """A WebSocket relay between the headless face and a real Mind that
    answers the first ``refusals`` commands of type ``refuse`` itself, as a cluster
    node does during a take-over: ``face.error{unavailable, retryable}``.
    Everything else passes through unchanged."""

    def __init__(self, target: str, refusals: int, refuse: str = "face.chat") -> None:
        self.target = target
        self.refusals = refusals
        self.refuse = refuse
        self.refused = 0
        self.request_ids: list[str] = []  # of every ``refuse`` command, refused or passed
        self.url = ""
        self._server: Any = None

    async def __aenter__(self) -> RefusingRelay:
        self._server = await serve(self._relay, "127.0.0.1", 0, max_size=None)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/v1/face"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _relay(self, face: Any) -> None:
        async with connect(self.target, max_size=None) as mind:
            async def up() -> None:
                async for text in face:
                    frame = json.loads(text)
                    if frame["type"] == self.refuse:
                        self.request_ids.append(frame["payload"].get("request_id"))
                    if frame["type"] == self.refuse and self.refused < self.refusals:
                        self.refused += 1
                        await face.send(json.dumps({"type": "face.error", "payload": {
                            "request_id": frame["payload"].get("request_id"),
                            "code": "unavailable", "retryable": True,
                            "message": "the conversation has no owner right now; retry"}}))
                        continue
                    await mind.send(text)

            async def down() -> None:
                async for text in mind:
                    await face.send(text)

            tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
            with contextlib.suppress(Exception):
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()


async def run_headless_face(url: str, home: Path, *args: str,
                            stdin: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *headless("--url", url, *args), env=_env(home), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.e2e
async def test_a_retryable_refusal_is_asked_again_within_the_connect_timeout(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        async with RefusingRelay(mind.url, refusals=3) as relay:
            code, out, err = await run_headless_face(
                relay.url, home, "--new-conversation", "c", "--connect-timeout", "20",
                stdin=lines_in({"type": "face.chat", "payload": {"content": "hello again"}}))
        assert code == EXIT_OK, err
        assert relay.refused == 3
        assert '"chat.completed"' in out
        lines = reasons(err)
        assert any("unavailable" in line and "again" in line for line in lines), err
    finally:
        mind.kill()


@pytest.mark.e2e
async def test_a_retryable_refusal_that_lasts_ends_within_the_connect_timeout_saying_why(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        async with RefusingRelay(mind.url, refusals=10**9) as relay:
            code, _, err = await run_headless_face(
                relay.url, home, "--new-conversation", "c", "--connect-timeout", "1",
                stdin=lines_in({"type": "face.chat", "payload": {"content": "hello"}}))
        assert code == EXIT_FAILED, err
        assert relay.refused > 1  # asked again before giving up
        lines = reasons(err)
        assert lines[-1].startswith("halfpi: face.chat"), err
        assert "unavailable" in lines[-1] and "--connect-timeout" in lines[-1], err
        for line in lines:  # sentences, never a Python repr
            assert "{'" not in line and "Error(" not in line, line
    finally:
        mind.kill()


@pytest.mark.e2e
async def test_a_retryable_refusal_of_the_new_conversation_is_asked_again_under_one_request_id(
    tmp_path: Path,
) -> None:
    """docs/faces.md: the face asks again "with the same request_id", so a
    refusal that was in fact applied cannot make a second conversation."""
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        async with RefusingRelay(mind.url, refusals=2,
                                 refuse="face.conversation.create") as relay:
            code, out, err = await run_headless_face(
                relay.url, home, "--new-conversation", "c", "--connect-timeout", "20",
                stdin=lines_in({"type": "face.chat", "payload": {"content": "hello"}}))
        assert code == EXIT_OK, err
        assert relay.refused == 2
        assert len(relay.request_ids) == 3 and len(set(relay.request_ids)) == 1, relay.request_ids
        assert '"chat.completed"' in out
    finally:
        mind.kill()


@pytest.mark.e2e
def test_a_subscribe_line_the_mind_refuses_is_said_in_a_sentence_and_exits_1(
    tmp_path: Path,
) -> None:
    """A stdin ``face.subscribe`` the Mind refuses is said as a ``halfpi: …``
    sentence naming the code and the Mind's words, never a Python repr of
    the frame; the lines after it still run, and the exit status is 1 (a
    refused command, docs/faces.md), not 0."""
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        done = subprocess.run(
            headless("--url", mind.url, "--new-conversation", "subs"),
            input=lines_in({"type": "face.subscribe", "payload": {"conversation_ids": ["c_nope"]}},
                           {"type": "face.chat", "payload": {"content": "still here"}}),
            env=_env(home), capture_output=True, text=True, timeout=60,
        )
        (line,) = reasons(done.stderr)
        assert line.startswith("halfpi: face.subscribe refused"), line
        assert "conversation_not_found" in line and "no conversation c_nope" in line, line
        assert "{" not in line, line
        assert '"chat.completed"' in done.stdout, done.stdout
        assert done.returncode == 1, (done.returncode, done.stderr)
    finally:
        mind.kill()


@pytest.mark.e2e
async def test_a_line_the_mind_would_refuse_is_refused_before_it_is_sent(
    tmp_path: Path,
) -> None:
    """A stdin command that is not what the Mind reads (a field it does not
    know) is checked by the face as the Mind checks it: a ``face.error``
    line naming the field, one ``halfpi: …`` sentence, exit 1 — and the
    command never reaches the Mind; the lines after it still run."""
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        async with RefusingRelay(mind.url, refusals=0, refuse="face.chat") as relay:
            code, out, err = await run_headless_face(
                relay.url, home, "--new-conversation", "checked",
                stdin=lines_in({"type": "face.chat", "payload": {"content": "hi", "colour": 1}},
                               {"type": "face.chat", "payload": {"content": "still here"}}))
        errors = [json.loads(line)["payload"] for line in out.splitlines()
                  if json.loads(line)["type"] == "face.error"]
        assert [(e["code"], e.get("field")) for e in errors] == [("invalid_request", "colour")]
        (line,) = reasons(err)
        assert line.startswith("halfpi: face.chat") and "invalid_request" in line, line
        assert len(relay.request_ids) == 1  # only the valid chat reached the Mind
        assert '"chat.completed"' in out
        assert code == EXIT_FAILED, err
    finally:
        mind.kill()
