"""Secrets never leave through a tool (DESIGN §8): find them in tool output
and put a marker in their place. Pure: text in, text out.

Policy by path is not enough — a token copied under another name, a backup
folder, ``/proc/<pid>/environ`` — so every tool output is scanned:

- **by shape** (the Hand, which knows no secret of the Mind): halfpi's own
  credentials, as ``mind/auth.py``, ``mind/tickets.py`` and ``mind/links.py``
  make them — Face and Hand tokens (``hpf_``/``hph_`` + 43 URL-safe
  characters), stream tickets (``hps_`` + 32) and sign-in links
  (``#link=`` + a 22-character code);
- **by exact value** (the Mind, which knows its own): the provider's API
  key, the metrics token, the stream key.

A match becomes ``[redacted: KIND]``; what was redacted is counted by kind,
never kept. To keep false positives low a shape needs its prefix, at least
22 characters after it (18 for a link's code; a shorter piece of a token
leaves more than 128 unknown bits: no use to anyone) and, for tokens and
tickets, both upper- and lower-case letters, as random base64 has (an
identifier such as ``hph_token_for_tests`` has not); a match is no longer
than the credential (so a chance match in a base64url blob takes 47
characters of it, not the rest of the blob). A marker is never
longer than what it replaces, so redacted output is never longer either.
A secret that a command *transforms* (base64, reversed, one character a
line) is not recognisable: that is what the approval of ``exec_command``
is for.

Output arrives in chunks, and a chunk boundary may cut a secret in two:
:class:`StreamRedactor` holds back the tail of each chunk that could still
become one (at most :data:`MAX_CARRY` characters) until the next chunk or
the end says what it is.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

HALFPI_TOKEN = "halfpi token"
STREAM_TICKET = "stream ticket"
SIGN_IN_LINK = "sign-in link"
SHAPE_KINDS = (HALFPI_TOKEN, STREAM_TICKET, SIGN_IN_LINK)

# A configured value shorter than this is no secret worth the name (and
# redacting it would blank ordinary words); longer than MAX_VALUE, no key.
MIN_VALUE = 8
MAX_VALUE = 512
# The most a stream holds back between chunks: more than any credential.
MAX_CARRY = 1024

_BODY = "A-Za-z0-9_-"
# The length of each body as halfpi makes it (token_urlsafe of 32, 24 and
# 16 bytes): a match takes no more, so a chance match in a long run of
# URL-safe characters (a base64url blob holds one of the prefixes about once in four
# MiB) costs the text a credential's length, never the rest of the run.
TOKEN_CHARS, TICKET_CHARS, LINK_CHARS = 43, 32, 22
_SHAPES = re.compile(
    rf"(?P<token>hp[fh]_[{_BODY}]{{22,{TOKEN_CHARS}}})"
    rf"|(?P<ticket>hps_[{_BODY}]{{22,{TICKET_CHARS}}})"
    rf"|(?P<link>#link=[{_BODY}]{{18,{LINK_CHARS}}})"
)
_KIND_OF_GROUP = {"token": HALFPI_TOKEN, "ticket": STREAM_TICKET, "link": SIGN_IN_LINK}
# What the end of a chunk may be the beginning of: a shape's prefix, whole
# or in part, with the characters of its body so far.
_OPEN = re.compile(
    rf"(?:hp[fh]_[{_BODY}]{{0,{TOKEN_CHARS - 1}}}|hps_[{_BODY}]{{0,{TICKET_CHARS - 1}}}"
    rf"|#link=[{_BODY}]{{0,{LINK_CHARS - 1}}}|#(?:l(?:i(?:n(?:k)?)?)?)?|h(?:p[fhs]?)?)\Z"
)
_MARKER = re.compile(r"\[redacted: ([a-z][a-zA-Z -]{0,40})\]")
_UPPER = re.compile("[A-Z]")
_LOWER = re.compile("[a-z]")


def marker(kind: str) -> str:
    return f"[redacted: {kind}]"


def _random_enough(body: str) -> bool:
    return _UPPER.search(body) is not None and _LOWER.search(body) is not None


Span = tuple[int, int, str]  # start, end, kind


@dataclass(frozen=True, slots=True)
class Redactor:
    """What to look for: halfpi's credential shapes (``shapes``) and the
    exact ``values`` (value → the kind named in its marker)."""

    values: Mapping[str, str] = field(default_factory=dict)
    shapes: bool = True
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False,
                                             compare=False)

    def __post_init__(self) -> None:
        usable = {v: k for v, k in self.values.items() if MIN_VALUE <= len(v) <= MAX_VALUE}
        # Longest first: of two values that begin at one place, the longer is
        # what the output holds. One pattern: a text is read once, however
        # often it repeats a value.
        ordered = dict(sorted(usable.items(), key=lambda item: -len(item[0])))
        object.__setattr__(self, "values", ordered)
        if ordered:
            pattern = re.compile("|".join(re.escape(v) for v in ordered))
            object.__setattr__(self, "_pattern", pattern)

    def spans(self, text: str) -> list[Span]:
        """Where ``text`` holds a secret, in order, never overlapping."""
        found: list[Span] = []
        if self._pattern is not None:
            found = [(m.start(), m.end(), self.values[m.group()])
                     for m in self._pattern.finditer(text)]
        if self.shapes:
            # Between the values found: a value's last characters never
            # lengthen a shape into it.
            bounds = [0, *(x for s, e, _ in found for x in (s, e)), len(text)]
            for pos, endpos in zip(bounds[::2], bounds[1::2], strict=True):
                found += _shapes(text, pos, endpos)
        return sorted(found)

    def redact(self, text: str) -> tuple[str, Counter[str]]:
        """``text`` with each secret replaced by its marker, and how many of
        each kind were."""
        return _apply(text, self.spans(text))

    def redact_end(self, text: str) -> tuple[str, Counter[str]]:
        """:meth:`redact`, for a text that ends where it may have been cut
        (a result cut at 1 MiB or at ``max_bytes``, an error at 4096
        characters, a stream whose rest never came): a tail that is a piece
        of a configured value, at least half of it, is taken out and
        counted as that value — else whoever picks the cut reads all of a
        secret but its last character."""
        spans = self.spans(text)
        start, kind = self.piece_at_end(text)
        if start == len(text) or (spans and spans[-1][1] > start):
            return _apply(text, spans)
        shown, counts = _apply(text[:start], spans)
        counts[kind] += 1
        return shown, counts

    def piece_at_end(self, text: str) -> tuple[int, str]:
        """Where a tail of ``text`` that is half or more of a configured value
        begins, and the value's kind (``len(text)`` when none is)."""
        best, kind = len(text), ""
        for value, named in self.values.items():
            least = max(MIN_VALUE, (len(value) + 1) // 2)
            for size in range(min(len(value) - 1, len(text)), least - 1, -1):
                if len(text) - size < best and text.endswith(value[:size]):
                    best, kind = len(text) - size, named
                    break
        return best, kind

    def hold_from(self, text: str) -> int:
        """Where the tail that could still become a secret begins (``len(text)``
        when none could): the part from there on waits for more text."""
        start = len(text)
        if self.shapes:
            window = max(0, len(text) - MAX_CARRY)
            found = _OPEN.search(text, window)
            if found is not None:
                start = found.start()
        last = text[-1:]
        for value in self.values:
            for size in range(min(len(value) - 1, len(text)), 0, -1):
                if value[size - 1] != last or len(text) - size >= start:
                    continue  # cheap: the last character must match first
                if text.endswith(value[:size]):
                    start = len(text) - size
                    break
        return start


def _shapes(text: str, pos: int, endpos: int) -> list[Span]:
    found: list[Span] = []
    for match in _SHAPES.finditer(text, pos, endpos):
        group = match.lastgroup or "link"
        body = match.group(group).partition("_")[2]
        if group == "link" or _random_enough(body):
            found.append((match.start(), match.end(), _KIND_OF_GROUP[group]))
    return found


def _apply(text: str, spans: Iterable[Span]) -> tuple[str, Counter[str]]:
    counts: Counter[str] = Counter()
    parts, at = [], 0
    for start, end, kind in spans:
        parts += [text[at:start], marker(kind)]
        counts[kind] += 1
        at = end
    parts.append(text[at:])
    return "".join(parts), counts


def window_page(
    redactor: Redactor, text: str, lead: int, want: int, more: bool
) -> tuple[str, int, Counter[str]]:
    """A page of ``text`` from ``lead`` on, at most ``want`` characters of
    it, that shows no piece of a secret, however the page was placed.

    ``text`` is a window of a longer text (a task's log, read by offset):
    up to :data:`MAX_CARRY` characters before the page (``lead``) and more
    after it, so that a secret the page's start or end would cut is judged
    whole. ``more``: the text may go on past the window (a log still
    written). A secret cut by the start is shown as its marker; the page
    ends before a secret its end would cut, or that may still be written.
    Returns the redacted page, where it ends in ``text``, and the counts. A
    page that can show nothing yet is empty and ends at ``lead``; one that
    starts inside a secret it cannot get past shows only the marker."""
    spans = redactor.spans(text)
    if not more:  # the text ends here: perhaps inside a secret (Redactor.redact_end)
        piece, kind = redactor.piece_at_end(text)
        if piece < len(text) and not (spans and spans[-1][1] > piece):
            spans.append((piece, len(text), kind))
    cut = min(len(text), lead + want)
    if more:
        cut = min(cut, redactor.hold_from(text))
    for start, end, _ in spans:
        if start < cut < end:
            cut = start
    if cut <= lead:
        covering = [s for s in spans if s[0] <= lead < s[1]]
        if not covering or (more and covering[0][1] >= len(text)):
            return "", lead, Counter()
        cut = covering[0][1]
    shown, counts = _apply(text[:cut], [(max(s, lead), e, k) for s, e, k in spans
                                        if e > lead and s < cut])
    return shown[lead:], cut, counts


def count_markers(text: str, kinds: Iterable[str] = SHAPE_KINDS) -> Counter[str]:
    """The markers of ``kinds`` in ``text`` (a Hand's redactions, as the Mind
    counts them)."""
    known = frozenset(kinds)
    return Counter(k for k in _MARKER.findall(text) if k in known)


def credential_in(data: bytes) -> str | None:
    """The kind of halfpi credential ``data`` (a file's content) holds, if
    any: a file with a Face or Hand token in it is a token file, whatever
    its name (the tool policy refuses it)."""
    text = data.decode("latin-1")  # one character per byte: shapes are ASCII
    for match in _SHAPES.finditer(text):
        if match.lastgroup == "token" and _random_enough(match.group()[4:]):
            return HALFPI_TOKEN
    return None


class StreamRedactor:
    """One output stream (a run's stdout, say), redacted chunk by chunk.

    :meth:`feed` returns what may be shown now — at most ``limit`` UTF-8
    bytes (the Hand's 4 KiB chunks), the rest waiting for the next call —
    and holds back a tail that could be the start of a secret; :meth:`flush`
    (at the end of the stream) returns the rest, in pieces of at most
    ``limit`` bytes. What is shown is exactly ``redactor.redact`` of the
    whole stream, however it was cut (credentials never overlap, and none
    is longer than MAX_CARRY)."""

    def __init__(self, redactor: Redactor, limit: int | None = None) -> None:
        self.redactor = redactor
        self.limit = limit
        self.counts: Counter[str] = Counter()
        self._carry = ""  # raw text not judged yet
        self._ready = ""  # redacted text not shown yet (beyond the limit)

    def feed(self, text: str) -> str:
        buffer = self._carry + text
        spans = self.redactor.spans(buffer)
        hold = self.redactor.hold_from(buffer)
        for start, end, _ in spans:
            if start < hold < end:
                hold = start  # never cut a secret: judge it whole next time
        if len(buffer) - hold > MAX_CARRY:
            hold = len(buffer) - MAX_CARRY
            shown, counts = self.redactor.redact(buffer[:hold])
        else:
            shown, counts = _apply(buffer, [s for s in spans if s[1] <= hold])
            shown = shown[: len(shown) - (len(buffer) - hold)]
        self.counts += counts
        self._carry = buffer[hold:]
        return self._take(self._ready + shown)

    def drop(self) -> None:
        """Forget what is held back (the stream had a gap: it does not go on)."""
        self._carry = ""

    def flush(self) -> list[str]:
        shown, counts = self.redactor.redact_end(self._carry)
        self.counts += counts
        self._carry = ""
        rest, pieces = self._ready + shown, []
        self._ready = ""
        while rest:
            piece = self._take(rest)
            pieces.append(piece)
            rest, self._ready = self._ready, ""
        return pieces

    def _take(self, text: str) -> str:
        """At most ``limit`` bytes of ``text``, on a character boundary; the
        rest is kept for the next call."""
        if self.limit is None or len(text.encode()) <= self.limit:
            self._ready = ""
            return text
        encoded = text.encode()
        cut = self.limit
        while cut > 0 and (encoded[cut] & 0xC0) == 0x80:
            cut -= 1
        self._ready = encoded[cut:].decode()
        return encoded[:cut].decode()


# -- files that hold secrets, known wherever they are copied ------------------------

# ``halfpi backup`` writes this manifest into its folder: it lists the files
# taken and, under ``secrets``, those that hold a secret (backup.py).
BACKUP_MANIFEST = "backup.json"


def backup_secrets(manifest: object) -> frozenset[str] | None:
    """The names of the files that hold secrets in a folder whose manifest
    is ``manifest`` (parsed JSON); None when it is no halfpi backup's. A
    manifest without ``secrets`` (an older backup) calls every file it
    lists one: a backup is as secret as the home it was taken from."""
    if not isinstance(manifest, dict) or "halfpi" not in manifest:
        return None
    files = manifest.get("files")
    if not isinstance(files, list):
        return None
    listed = manifest.get("secrets")
    names = listed if isinstance(listed, list) else files
    return frozenset(n for n in names if isinstance(n, str))
