"""No tool output leaves a Hand with a halfpi credential in it (DESIGN §8).

Everything a tool says is scanned (:mod:`halfpi.core.redact`, by shape: a
Hand knows no secret of the Mind) where it is framed for the Mind or kept:

- a run's **progress** (:class:`ProgressRedaction` wraps the tool's
  progress sink: one stream per kind, a chunk's tail held back until the
  next one says whether it was the start of a token; the pieces it passes
  on keep the per-run bounds — 4 KiB, 256 events, 1 MiB — that the Mind
  enforces);
- a run's **result** (:func:`redact_result`: ``stdout``, ``stderr``,
  ``error``); a redacted result says ``truncated: true`` — what it shows
  is not all the tool wrote — while ``output_bytes`` and ``digest`` still
  cover what it really wrote (DESIGN §6);
- a background task's **log** (:class:`LogRedaction`, before a byte of it
  is written) and its ``error``.

What was redacted is logged — how many of which kind, never the value —
and the Mind counts the markers it receives (``halfpi_tool_output_redactions``).

The Mind's in-process Hand (``local``) is given the Mind's own secrets too
(``HandNode.secrets``), so its task logs never keep them either; a Hand
elsewhere is never told them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import msgspec

from halfpi.core.hand_wire import CHUNK_BYTES, BoundedProgress, HandResult, Progress
from halfpi.core.redact import Redactor, StreamRedactor

log = logging.getLogger("halfpi.hand")

SHAPES = Redactor()
KINDS = ("stdout", "stderr")


class ProgressRedaction(BoundedProgress):
    """A run's progress sink, redacted; :meth:`close` at the tool's end
    passes on what was held back."""

    def __init__(self, sink: Progress, redactor: Redactor = SHAPES) -> None:
        super().__init__(sink)
        self.streams = {kind: StreamRedactor(redactor, limit=CHUNK_BYTES) for kind in KINDS}

    def __call__(self, kind: str, text: str, gap: bool) -> None:
        stream = self.streams.get(kind)
        if stream is None:  # not a stream the Mind knows: it refuses it anyway
            self.sink(kind, text, gap)
            return
        if gap:
            stream.drop()  # what it held does not go on where the gap is
            self.gap = True
        self._send(kind, stream.feed(text))

    def close(self) -> None:
        for kind, stream in self.streams.items():
            for piece in stream.flush():
                self._send(kind, piece)

    @property
    def counts(self) -> Counter[str]:
        return sum((s.counts for s in self.streams.values()), Counter())

    def _send(self, kind: str, text: str) -> None:
        if text:
            self.send(kind, text)


def redact_result(
    result: HandResult, counts: Counter[str], redactor: Redactor = SHAPES
) -> HandResult:
    """A result as the Mind may have it; what was redacted is added to ``counts``."""
    found: Counter[str] = Counter()
    shown: dict[str, str] = {}
    for key, value in (("stdout", result.stdout), ("stderr", result.stderr),
                       ("error", result.error)):
        if value:
            shown[key], seen = redactor.redact(value)
            found += seen
    counts += found
    if not found:
        return result
    # Not all the tool wrote is shown: truncated.
    return msgspec.structs.replace(result, truncated=True, **shown)


def redact_text(
    text: str | None, counts: Counter[str], redactor: Redactor = SHAPES
) -> str | None:
    if not text:
        return text
    shown, found = redactor.redact(text)
    counts += found
    return shown


class LogRedaction:
    """A background task's output on its way to its log: redacted before it
    is written (bytes as Latin-1, one character each: the shapes are ASCII)."""

    def __init__(self, write: Callable[[bytes], object], redactor: Redactor = SHAPES) -> None:
        self.write = write
        self.streams = {kind: StreamRedactor(redactor) for kind in KINDS}

    def __call__(self, kind: str, data: bytes) -> None:
        shown = self.streams[kind].feed(data.decode("latin-1"))
        if shown:
            self.write(shown.encode("latin-1"))

    def close(self) -> None:
        for stream in self.streams.values():
            for piece in stream.flush():
                self.write(piece.encode("latin-1"))

    @property
    def counts(self) -> Counter[str]:
        return sum((s.counts for s in self.streams.values()), Counter())


def say_redacted(what: str, counts: Counter[str]) -> None:
    """One line for the Hand's log: what was redacted, never the value."""
    if counts:
        found = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in sorted(counts.items()))
        log.warning("%s: redacted %s from its output", what, found)
