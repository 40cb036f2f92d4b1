"""The in-process journal at its Mind-wide byte bound (DESIGN §4.2).

Loads many conversations that had one short chat each, then lets a few
conversations stream together until well past the Mind-wide bound. Prints
the append rate before the bound is reached and after it (same run, same
streams: the ratio after/before should stay near 1 — trimming is O(1)
amortised per append), and the process RSS against the bytes the journal
accounts for (``entry_size`` is meant to be the memory really held).

    python benchmarks/journal_bound.py                  # 10,000 idle, 10 streaming, 128 MiB
    python benchmarks/journal_bound.py --bound-mib 512  # the default Mind-wide bound

No server, no sockets: the journal is driven directly, with messages built
and framed once the way the actor and one subscriber would, and appended as
the entries the actor's publication makes of them.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path

import msgspec

from halfpi.config import JournalLimits
from halfpi.core.outbound import DELTA, Message
from halfpi.journal.base import entry_of
from halfpi.journal.memory import MemoryJournal, entry_size

MiB = 1024 * 1024
_encode = msgspec.json.encode


def rss() -> int:
    """Resident set size now, in bytes (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Conversation:
    def __init__(self, journal: MemoryJournal, cid: str) -> None:
        self.journal = journal
        self.cid = cid
        self.epoch = journal.open_now(cid, 0)
        self.seq = 0

    def _cursor(self) -> str:
        return f"{self.epoch}.{self.seq}"

    def event(self, type_: str, data: dict[str, object], now: float) -> Message:
        self.seq += 1
        cursor = self._cursor()
        body = _encode(
            {
                "conversation_id": self.cid,
                "seq": self.seq,
                "cursor": cursor,
                "type": type_,
                "data": data,
                "ts": now,
            }
        )
        m = Message("face.event", body, conversation_id=self.cid, seq=self.seq, cursor=cursor)
        m.frame(1)  # sent to one subscriber: its frame tail is cached
        return m

    def delta(self, request_id: str, text: str) -> Message:
        self.seq += 1
        m = Message(
            "face.chat.delta",
            None,
            kind=DELTA,
            conversation_id=self.cid,
            seq=self.seq,
            cursor=self._cursor(),
            request_id=request_id,
            text=text,
        )
        m.encoded_body()
        m.frame(1)
        return m

    def chat(self, n: int, deltas: int, now: float) -> list[Message]:
        rid = f"r-{self.cid}-{n}"
        out = [
            self.event("chat.message", {"request_id": rid, "role": "user", "content": "hi"}, now),
            self.event("chat.started", {"request_id": rid, "run_id": f"run-{rid}"}, now),
        ]
        out += [self.delta(rid, f"word{i} ") for i in range(deltas)]
        out.append(
            self.event(
                "chat.completed",
                {"request_id": rid, "run_id": f"run-{rid}", "status": "succeeded",
                 "content": "".join(f"word{i} " for i in range(deltas))},
                now,
            )
        )
        return out


def stream(journal: MemoryJournal, streams: list[Conversation], count: int,
           chat_no: list[int], now: float) -> tuple[float, float]:
    """Append ``count`` messages from ``streams`` interleaved. Returns the
    seconds spent in making their entries and ``journal.append`` alone, and in
    building, framing and appending them (what the Mind does per event, short
    of the store and the sockets)."""
    appending = total = 0.0
    done = 0
    while done < count:
        start = time.perf_counter()
        batch: list[Message] = []
        while len(batch) < 5_000:
            for conv in streams:
                chat_no[0] += 1
                batch += conv.chat(chat_no[0], 40, now)
        batch = batch[: count - done]
        built = time.perf_counter()
        append = journal.append
        for m in batch:
            assert m.conversation_id is not None
            append(m.conversation_id, entry_of(m, now))
        end = time.perf_counter()
        appending += end - built
        total += end - start
        done += len(batch)
        del batch
    return appending, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=10_000, help="conversations with one chat")
    parser.add_argument("--streams", type=int, default=10, help="conversations streaming together")
    parser.add_argument("--bound-mib", type=float, default=128.0, help="Mind-wide byte bound")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()

    bound = int(args.bound_mib * MiB)
    # Count and time bounds out of the way: the Mind-wide byte bound decides.
    limits = JournalLimits(events=10**9, seconds=10**9, bytes_per_conversation=bound,
                           bytes_total=bound)
    gc.collect()
    rss_start = rss()
    journal = MemoryJournal(limits)
    now = 1_000.0

    for n in range(args.idle):
        conv = Conversation(journal, f"c_idle_{n:06d}")
        for m in conv.chat(1, 6, now):
            journal.append(conv.cid, entry_of(m, now))
    idle_bytes = journal.total_bytes
    if idle_bytes >= bound * 0.8:
        print(f"the idle conversations alone fill {idle_bytes / MiB:.1f} MiB; raise --bound-mib",
              file=sys.stderr)
        return 2

    streams = [Conversation(journal, f"c_stream_{n:02d}") for n in range(args.streams)]
    chat_no = [0]
    # Before: from the idle load up to 95 % of the bound.
    probe = streams[0].chat(0, 40, now)
    per_message = sum(entry_size(entry_of(m, now)) for m in probe) / len(probe)
    before_count = int((bound * 0.95 - idle_bytes) / per_message)
    before_append_s, before_s = stream(journal, streams, before_count, chat_no, now)
    assert journal.total_bytes <= bound, "the bound was reached too early"
    # Cross the bound, then the same number of appends again, all past it.
    stream(journal, streams, int(bound * 0.1 / per_message), chat_no, now)
    touched = journal.windows_touched
    after_append_s, after_s = stream(journal, streams, before_count, chat_no, now)
    touched = journal.windows_touched - touched
    gc.collect()
    held = rss() - rss_start

    figures = {
        "idle_conversations": args.idle,
        "streaming_conversations": args.streams,
        "bound_mib": args.bound_mib,
        "appends_per_phase": before_count,
        "build+append/s before bound": round(before_count / before_s),
        "build+append/s after bound": round(before_count / after_s),
        "ratio after/before (build+append)": round(before_s / after_s, 3),
        "append only/s before bound": round(before_count / before_append_s),
        "append only/s after bound": round(before_count / after_append_s),
        "ratio after/before (append only)": round(before_append_s / after_append_s, 3),
        "windows touched per append after": round(touched / before_count, 2),
        "accounted MiB": round(journal.total_bytes / MiB, 1),
        "RSS growth MiB": round(held / MiB, 1),
        "RSS growth / accounted": round(held / journal.total_bytes, 3),
        "peak RSS MiB": round(peak_rss() / MiB, 1),
    }

    print(f"{'figure':<36} value")
    for key, value in figures.items():
        print(f"{key:<36} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
