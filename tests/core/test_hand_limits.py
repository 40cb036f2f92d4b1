"""The Hand limits the Mind enforces itself (DESIGN §6, §8), as pure rules.

A Hand's progress is bounded (4 KiB chunks, 1 MiB and 256 events per run)
and its result too (1 MiB of text per stream); its ``output_bytes`` and
``digest`` are checked wherever the Mind holds the whole output.
"""

from __future__ import annotations

import hashlib

import pytest

from halfpi.core.hand_wire import (
    CHUNK_BYTES,
    DISPLAY_BYTES,
    PROGRESS_EVENTS,
    HandResult,
    ProgressBudget,
    combine_digests,
    output_digest,
    result_violation,
)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def result(stdout: str = "", stderr: str = "", **fields: object) -> HandResult:
    out, err = stdout.encode(), stderr.encode()
    base: dict[str, object] = {
        "run_id": "x_1",
        "generation": 1,
        "status": "succeeded",
        "stdout": stdout,
        "stderr": stderr,
        "output_bytes": len(out) + len(err),
        "digest": output_digest(out, err),
        "truncated": False,
    }
    base.update(fields)
    return HandResult(**base)  # type: ignore[arg-type]


def test_digest_of_output_without_stderr_is_the_plain_sha256() -> None:
    """So ``sha256sum FILE`` matches what read_file reports."""
    assert output_digest(b"hello\n", b"") == sha(b"hello\n")


def test_digest_with_stderr_hashes_the_two_stream_hashes_in_order() -> None:
    out, err = b"out\n", b"err\n"
    expected = "sha256:" + hashlib.sha256(
        hashlib.sha256(out).digest() + hashlib.sha256(err).digest()
    ).hexdigest()
    assert output_digest(out, err) == expected
    assert output_digest(err, out) != expected  # order matters: stdout, then stderr
    # A Hand that hashes each stream as it reads gets the same value.
    assert combine_digests(
        hashlib.sha256(out).digest(), hashlib.sha256(err).digest(), stderr_empty=False
    ) == expected


def test_progress_budget_takes_chunks_up_to_the_bounds() -> None:
    budget = ProgressBudget()
    for _ in range(PROGRESS_EVENTS):
        assert budget.take("x" * CHUNK_BYTES) is None
    assert budget.bytes == PROGRESS_EVENTS * CHUNK_BYTES  # exactly 1 MiB: allowed
    violation = budget.take("x")
    assert violation is not None and "256" in violation


def test_progress_chunk_over_4_kib_of_utf8_is_a_violation() -> None:
    assert ProgressBudget().take("x" * (CHUNK_BYTES + 1)) is not None
    # Counted in UTF-8 bytes, not characters: 1366 euro signs are 4 KiB + 2 bytes.
    assert ProgressBudget().take("€" * 1366) is not None
    assert ProgressBudget().take("€" * 1365) is None


def test_honest_results_pass() -> None:
    assert result_violation(result("hello\n")) is None
    assert result_violation(result("out\n", "err\n")) is None
    # A tool that failed before any output: no digest needed.
    assert result_violation(result(status="failed", digest="", error="nope")) is None
    # Truncated: the Mind cannot recompute, but the length must cover what it got.
    assert result_violation(
        result("a" * 100, truncated=True, output_bytes=5000, digest=sha(b"x"))
    ) is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"output_bytes": 5}, "output_bytes"),
        ({"digest": "sha256:lie"}, "digest"),
        ({"digest": sha(b"something else")}, "digest"),
        ({"output_bytes": 0, "digest": ""}, "output_bytes"),
        ({"truncated": True, "output_bytes": 5}, "output_bytes"),
        ({"truncated": True, "digest": "md5:abc"}, "digest"),
        ({"output_bytes": -1}, "output_bytes"),
        ({"error": "e" * 5000}, "error"),
    ],
)
def test_lying_or_oversized_results_are_violations(fields: dict[str, object], words: str) -> None:
    violation = result_violation(result("x" * 100, **fields))
    assert violation is not None and words in violation


def test_result_streams_over_1_mib_are_violations() -> None:
    big = "y" * (DISPLAY_BYTES + 1)
    assert "stdout" in (result_violation(result(big, truncated=True,
                                                output_bytes=2 * DISPLAY_BYTES)) or "")
    assert "stderr" in (result_violation(result("", big, truncated=True,
                                                output_bytes=2 * DISPLAY_BYTES)) or "")
    exact = "z" * DISPLAY_BYTES
    assert result_violation(result(exact)) is None


def test_output_that_was_not_utf8_is_not_verified() -> None:
    """Invalid bytes reach the Mind replaced (U+FFFD): the original length and
    digest cannot be recomputed from the text, so they are not checked."""
    raw = b"\xff\xfe binary"
    text = raw.decode("utf-8", errors="replace")
    honest = result(text, output_bytes=len(raw), digest=output_digest(raw, b""))
    assert result_violation(honest) is None
