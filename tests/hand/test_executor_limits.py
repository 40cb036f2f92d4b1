"""A Hand keeps the limits the Mind enforces (DESIGN §6, §8), whatever its tools print.

The Mind counts UTF-8 bytes of the text it receives; a tool's raw bytes
that are not UTF-8 grow when replaced (one byte → U+FFFD, three bytes), so
the Hand bounds the *text* it sends, not the bytes it read. Its digest is
the one the Mind can verify (:func:`halfpi.core.hand_wire.output_digest`).
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from halfpi.core.hand_wire import (
    CHUNK_BYTES,
    DISPLAY_BYTES,
    PROGRESS_BYTES,
    PROGRESS_EVENTS,
    HandResult,
    output_digest,
    result_violation,
)
from halfpi.hand.executor import Outcome, ProgressGate, exec_command, read_file


def test_progress_of_invalid_utf8_is_cut_into_chunks_of_at_most_4_kib() -> None:
    sent: list[str] = []
    gate = ProgressGate(lambda kind, text, gap: sent.append(text))
    gate("stdout", b"\xff" * CHUNK_BYTES)  # 4 KiB read → 12 KiB of U+FFFD
    assert sent and all(len(t.encode()) <= CHUNK_BYTES for t in sent)
    assert "".join(sent) == "\ufffd" * CHUNK_BYTES


def test_progress_stays_within_the_bytes_and_events_the_mind_allows() -> None:
    sent: list[str] = []
    gate = ProgressGate(lambda kind, text, gap: sent.append(text))
    for _ in range(2 * PROGRESS_EVENTS):
        gate("stderr", b"\xfe" * CHUNK_BYTES)
    assert len(sent) <= PROGRESS_EVENTS
    assert sum(len(t.encode()) for t in sent) <= PROGRESS_BYTES
    assert gate.gap


def test_result_text_is_bounded_to_1_mib_per_stream_even_when_replaced() -> None:
    raw = b"\xff" * DISPLAY_BYTES  # kept whole, 3 MiB once replaced
    wire = Outcome("succeeded", stdout=raw, output_bytes=len(raw),
                   digest=output_digest(raw, b"")).to_wire()
    assert len(wire["stdout"].encode()) <= DISPLAY_BYTES
    assert wire["truncated"] is True


async def test_exec_command_digest_is_verifiable_by_the_mind() -> None:
    outcome = await exec_command({"command": "printf out; printf err >&2"},
                                 lambda *a: None, asyncio.Event())
    assert outcome.digest == output_digest(b"out", b"err")
    wire = outcome.to_wire()
    result = HandResult(run_id="x_1", generation=1, **wire)
    assert result_violation(result) is None


async def test_read_file_digest_is_the_files_sha256(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"content\n")
    outcome = await read_file({"path": str(target)}, lambda *a: None, asyncio.Event())
    assert outcome.digest == "sha256:" + hashlib.sha256(b"content\n").hexdigest()
