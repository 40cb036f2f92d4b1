"""The headless face: JSONL in, JSONL out, for scripts and other agents.

stdin: one command per line, in the protocol's envelope
(``{"type": "face.chat", "payload": {...}}``). ``request_id`` may be left
out (one is generated); ``conversation_id`` may be left out when the face
was started with ``--conversation`` or ``--new-conversation``.

stdout: only JSON lines, each a protocol message — exactly what the SDK
took as news from the Mind (duplicates from replays removed), plus
``face.status`` lines (the one message type that comes from the face itself,
not from the Mind) whenever the connection state changes. Logs go to stderr.

Everything the SDK does applies: reconnect, exact resume, and re-sending of
replay-safe commands under the same ``request_id``. A chat that ends
``interrupted`` (the Mind restarted mid-reply) is *not* re-asked unless the
script says so with ``--retry-interrupted N`` — asking again is a decision
(I11), and this flag is how a script makes it explicitly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
from dataclasses import dataclass
from typing import Any, TextIO

from halfpi.face.client import FaceClient, Result, Status, new_request_id
from halfpi.face.errors import AuthError, CommandError, FaceError

log = logging.getLogger("halfpi.face.headless")

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2, 64


@dataclass
class HeadlessOptions:
    urls: list[str]
    token: str
    conversation: str | None = None
    new_conversation: str | None = None
    until_done: bool = True
    retry_interrupted: int = 0


class Output:
    """Writes JSON lines; one write per message, flushed, never interleaved."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, type_: str, payload: dict[str, Any]) -> None:
        self.stream.write(
            json.dumps(
                {"type": type_, "payload": payload}, ensure_ascii=True, separators=(",", ":")
            )
            + "\n"
        )
        self.stream.flush()


class Headless:
    def __init__(self, options: HeadlessOptions, out: Output) -> None:
        self.options = options
        self.out = out
        self.client = FaceClient(
            options.urls,
            options.token,
            client_name="halfpi-headless",
            on_status=self._status,
            on_message=out,
        )
        self.conversation = options.conversation
        self.failed = False
        self._work: set[asyncio.Task[None]] = set()

    def _status(self, status: Status) -> None:
        self.out(
            "face.status",
            {
                "state": status.state,
                "text": status.describe(),
                "attempt": status.attempt,
                "next_in": status.next_in,
                "replayed": status.replayed,
            },
        )

    async def run(self, lines: asyncio.Queue[str | None]) -> int:
        try:
            await self.client.connect()
        except AuthError as exc:
            log.error("%s", exc)
            return EXIT_REFUSED
        try:
            if self.options.new_conversation is not None:
                self.conversation = await self.client.create_conversation(
                    self.options.new_conversation or None
                )
            if self.conversation is not None:
                await self.client.subscribe(self.conversation)
            while (line := await lines.get()) is not None:
                if line.strip():
                    await self._command(line)
            if self._work:
                await asyncio.wait(self._work)
        except AuthError as exc:
            log.error("%s", exc)
            return EXIT_REFUSED
        finally:
            await self.client.close()
        return EXIT_FAILED if self.failed else EXIT_OK

    async def _command(self, line: str) -> None:
        try:
            frame = json.loads(line)
            type_, payload = frame["type"], dict(frame.get("payload") or {})
            if not isinstance(type_, str) or set(frame) - {"type", "payload"}:
                raise ValueError("a command is {type, payload}")
        except (ValueError, KeyError, TypeError) as exc:
            self.failed = True
            self.out(
                "face.error",
                {
                    "code": "invalid_request",
                    "retryable": False,
                    "message": f"not a command line: {exc}",
                },
            )
            return
        if (
            "conversation_id" not in payload
            and self.conversation
            and type_
            in (
                "face.chat",
                "face.chat.cancel",
                "face.conversation.snapshot",
                "face.conversation.messages",
            )
        ):
            payload["conversation_id"] = self.conversation
        if type_ == "face.subscribe":
            for cid in payload.get("conversation_ids", []):
                await self.client.subscribe(cid)
            return
        task = asyncio.create_task(self._await(type_, payload))
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _await(self, type_: str, payload: dict[str, Any]) -> None:
        retries = self.options.retry_interrupted if type_ == "face.chat" else 0
        while True:
            payload.setdefault("request_id", new_request_id("h"))
            try:
                outcome = await self.client.request(type_, **payload)
            except CommandError:
                self.failed = True  # the face.error line is already out
                return
            except FaceError as exc:
                self.failed = True
                self.out(
                    "face.error",
                    {
                        "request_id": payload["request_id"],
                        "code": "outcome_unknown",
                        "retryable": False,
                        "message": str(exc),
                    },
                )
                return
            if isinstance(outcome, Result) and outcome.status == "interrupted" and retries > 0:
                retries -= 1
                log.warning("chat %s was interrupted; asking again as asked", payload["request_id"])
                payload = {k: v for k, v in payload.items() if k != "request_id"}
                continue
            if isinstance(outcome, Result) and not outcome.ok:
                self.failed = True
            return


def _read_lines(
    stream: TextIO, queue: asyncio.Queue[str | None], loop: asyncio.AbstractEventLoop
) -> None:
    """Blocking reads on a daemon thread, so an open stdin never holds up exit."""
    for line in iter(stream.readline, ""):
        loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def run_headless(
    options: HeadlessOptions, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout
) -> int:
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(
        target=_read_lines,
        args=(stdin, lines, asyncio.get_running_loop()),
        name="headless stdin",
        daemon=True,
    ).start()
    return await Headless(options, Output(stdout)).run(lines)
