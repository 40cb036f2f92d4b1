"""No tool output leaves a Hand with a halfpi credential in it (DESIGN §8,
issue 23 item 3a): progress, results and task logs, driven through a
scripted Mind. The Mind's own checks (``core.hand_wire``) still pass."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import msgspec

from halfpi.core.hand_wire import CHUNK_BYTES, HandResult, result_violation
from halfpi.core.policy import Rule
from tests.hand.test_node import hand, run
from tests.hand.test_node_tasks import tasked_hand

# Prints a fresh token cut by the 4 KiB read boundary (the pipe's reads are
# of 4 KiB), then a stream ticket on stderr.
PRINT_TOKENS = (
    "import secrets, sys, time\n"
    "out = sys.stdout.buffer\n"
    "token = 'hph_' + secrets.token_urlsafe(32)\n"
    "out.write(b'x' * 4080 + token[:20].encode()); out.flush(); time.sleep(0.2)\n"
    "out.write(token[20:].encode() + b' done\\n'); out.flush()\n"
    "sys.stderr.write('ticket hps_' + secrets.token_urlsafe(24) + '\\n')\n"
)


async def test_a_token_cut_by_a_chunk_boundary_never_leaves_in_progress_or_result(
    tmp_path: Path,
) -> None:
    async with hand(tmp_path, exec_command=Rule.NEVER) as w:
        result = await run(w, "x_1", "exec_command",
                           {"argv": [sys.executable, "-c", PRINT_TOKENS]}, approved=False)
        progress = [f["payload"] for f in w.mind.from_hand if f["type"] == "hand.progress"]
        shown = json.dumps([progress, result])
        assert "hph_" not in shown and "hps_" not in shown, shown[-500:]
        stdout = "".join(p["data"] for p in progress if p["kind"] == "stdout")
        assert stdout == "x" * 4080 + "[redacted: halfpi token] done\n"
        assert result["stdout"] == stdout
        assert result["stderr"] == "ticket [redacted: stream ticket]\n"
        assert all(len(p["data"].encode()) <= CHUNK_BYTES for p in progress)
        # The Mind takes it: a redacted result is shown as not whole.
        assert result["truncated"] is True and result["status"] == "succeeded"
        message = msgspec.convert({**result, "generation": 1}, HandResult)
        assert result_violation(message) is None


async def test_a_file_read_in_the_roots_is_answered_with_its_tickets_redacted(
    tmp_path: Path,
) -> None:
    async with hand(tmp_path) as w:
        notes = w.root / "notes.txt"
        notes.write_text("open http://127.0.0.1:15707/#link=Ab3dEf6hIj9lMn0pQr2tUv now\n")
        result = await run(w, "x_1", "read_file", {"path": str(notes)}, approved=False)
        assert result["stdout"] == "open http://127.0.0.1:15707/[redacted: sign-in link] now\n"


async def test_an_unresolvable_path_is_answered_at_once(tmp_path: Path) -> None:
    async with hand(tmp_path) as w:
        path = "/proc/1/root/etc/passwd"
        w.mind.tell("hand.check", check_id="k1", tool="read_file", args={"path": path})
        checked = await w.mind.expect("hand.checked", check_id="k1", timeout=5)
        assert checked["verdict"] == "deny", checked
        result = await run(w, "x_1", "read_file", {"path": path}, approved=True)
        assert result["status"] == "failed" and result["error_category"] != "tool_crashed"


async def test_a_task_log_is_written_redacted(tmp_path: Path) -> None:
    async with tasked_hand(tmp_path / "state") as (mind, _):
        mind.tell("hand.task.deliver", delivery_id="d-1", tool="exec_command",
                  args={"argv": [sys.executable, "-c", PRINT_TOKENS]})
        task_id = (await mind.expect("hand.task.receipt", delivery_id="d-1"))["task_id"]
        await mind.expect("hand.task.update", task_id=task_id, state="succeeded")
        mind.tell("hand.task.log", task_id=task_id, offset=0)
        page = await mind.expect("hand.task.log_page", task_id=task_id)
        log = base64.b64decode(page["data_b64"]).decode()
        assert "hph_" not in log and "hps_" not in log
        assert "[redacted: halfpi token] done\n" in log
        assert "ticket [redacted: stream ticket]\n" in log
        stored = b"".join(p.read_bytes() for p in (tmp_path / "state").rglob("*.log"))
        assert b"hph_" not in stored and b"hps_" not in stored


def test_progress_redaction_keeps_the_bounds_the_mind_enforces() -> None:
    """A chunk's held-back tail is passed on later, never as a 257th event
    or beyond 1 MiB: what does not fit is dropped and marked as a gap."""
    from halfpi.core.hand_wire import PROGRESS_EVENTS, ProgressBudget
    from halfpi.hand.redaction import ProgressRedaction

    sent: list[tuple[str, str, bool]] = []
    redaction = ProgressRedaction(lambda kind, text, gap: sent.append((kind, text, gap)))
    for _ in range(PROGRESS_EVENTS):
        redaction("stdout", "y" * 4094 + "hp", False)  # each ends as a token may begin
    redaction.close()
    budget = ProgressBudget()
    assert all(budget.take(text) is None for _, text, _ in sent)
    assert len(sent) == PROGRESS_EVENTS
