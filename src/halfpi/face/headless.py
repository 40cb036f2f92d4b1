"""The headless face: JSONL in, JSONL out, for scripts and other agents.

stdin: one command per line, in the protocol's envelope
(``{"type": "face.chat", "payload": {...}}``). ``request_id`` may be left
out (one is generated); ``conversation_id`` may be left out when the face
was started with ``--conversation`` or ``--new-conversation``.

stdout: only JSON lines, each a protocol message — exactly what the SDK
took as news from the Mind (duplicates from replays removed), plus
``face.status`` lines (the one message type that comes from the face itself,
not from the Mind) whenever the connection state changes.

stderr: for the person running the script, one ``halfpi: …`` line each —
what it tries while no Mind answers and why that fails, a tool that waits
for an approval in another Face (until when), and the reason of every
command that did not succeed.

The exit status tells the outcomes apart (docs/faces.md): 0 succeeded,
1 failed, 2 refused (token or permission), 3 cancelled, 4 a tool's approval
was denied, 5 it expired, 6 interrupted, 64 usage, 69 no Mind reachable
within ``--connect-timeout``. With several commands, the first command
that did not succeed gives the status.

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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TextIO, TypeVar

import msgspec

from halfpi.client.redial import Locate
from halfpi.core import wire
from halfpi.core.backoff import backoff
from halfpi.core.events import (
    ApprovalRequested,
    ApprovalResolved,
    Error,
    EventData,
    Reset,
    ToolCompleted,
    decode_event,
    present,
)
from halfpi.core.throttle import worth_logging
from halfpi.face.client import FaceClient, Result, Status, new_request_id
from halfpi.face.commands import Body, command_of, type_of
from halfpi.face.errors import AuthError, ClientClosed, CommandError, FaceError
from halfpi.face.events import Answer
from halfpi.face.headless_lines import describe_failure, parse_command
from halfpi.face.incoming import Malformed, read
from halfpi.face.transport import ConnectionLost, Transport, websocket_connector

log = logging.getLogger("halfpi.face.headless")

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_CANCELLED = 0, 1, 2, 3
EXIT_DENIED, EXIT_EXPIRED, EXIT_INTERRUPTED = 4, 5, 6
EXIT_USAGE, EXIT_UNREACHABLE = 64, 69

# A terminal face.result's status → the exit status it gives.
STATUS_EXIT = {
    "succeeded": EXIT_OK,
    "failed": EXIT_FAILED,
    "timed_out": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
    "interrupted": EXIT_INTERRUPTED,
}
# A face.error's code → the exit status it gives (any other: EXIT_FAILED).
ERROR_EXIT = {
    "unauthorized": EXIT_REFUSED,
    "forbidden": EXIT_REFUSED,
    "approval_expired": EXIT_EXPIRED,
}
# A tool call of a chat that ended without running, by its status.
TOOL_EXIT = {"denied": EXIT_DENIED, "expired": EXIT_EXPIRED}
# Between two askings of a command the Mind refused retryably: short, as
# the refusal (a take-over, a node not ready yet) lasts seconds.
RETRY_CAP_S = 2.0

T = TypeVar("T")
ERROR_MEANING = {
    "agent_failed": "the agent gave up on this message",
    "agent_bad_input": "the agent could not read this message",
    "internal_error": "a fault in the Mind; its log says more",
}


@dataclass
class HeadlessOptions:
    urls: list[str]
    token: str
    conversation: str | None = None
    new_conversation: str | None = None
    until_done: bool = True
    retry_interrupted: int = 0
    # Give up (EXIT_UNREACHABLE) after this long without a Mind; None: never.
    connect_timeout: float | None = None
    # Where the Mind says it is now (HOME/mind.json), asked before every dial.
    locate: Locate | None = None


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


@dataclass
class _ChatTools:
    """What happened to one chat's tool calls, as far as it changes the exit status."""

    approvals: dict[str, str] = field(default_factory=dict)  # tool_call_id -> decided_by
    blocked: list[tuple[int, str]] = field(default_factory=list)  # (exit, reason)
    seen: set[str] = field(default_factory=set)  # tool_call_ids already in ``blocked``


class ConnectionNotes:
    """What a person reads on stderr while the face cannot reach its Mind:
    what is tried and why it fails; the same reason again only at attempts
    2, 4, 8, 16… (an hour without a Mind is a dozen lines, not one a
    second); and one line when it is back."""

    def __init__(self) -> None:
        self._last_failure = ("", "")  # (url, why) last said in full
        self._complained = False  # a failure was said since the last success

    def status(self, status: Status, url: str, why: str) -> str | None:
        """The line to say for ``status`` (``why``: the last attempt's failure)."""
        if status.state == "reconnecting":
            self._complained = True
            retry = f"retrying in {status.next_in:.1f} s" if status.next_in is not None else ""
            if why and (url, why) == self._last_failure:
                if not worth_logging(status.attempt):
                    return None  # already said
                return f"still cannot reach {url}; {retry} (attempt {status.attempt})"
            if why:
                self._last_failure = (url, why)
                return f"cannot reach the Mind at {url}: {why}; {retry} (attempt {status.attempt})"
            detail = f" ({status.detail})" if status.detail else ""
            return f"lost the connection to {url}{detail}; {retry}"
        if status.state in ("live", "resuming"):
            self._last_failure = ("", "")
            back, self._complained = self._complained, False
            return f"connected to {url}" if back else None
        return None


class Headless:
    def __init__(self, options: HeadlessOptions, out: Output, err: TextIO = sys.stderr) -> None:
        self.options = options
        self.out = out
        self.err = err
        self.client = FaceClient(
            options.urls,
            options.token,
            client_name="halfpi-headless",
            connector=self._connect,
            on_status=self._status,
            on_update=self._update,
            on_message=self._message,
            locate=options.locate,
        )
        self.conversation = options.conversation
        self.exit_code = EXIT_OK
        self._work: set[asyncio.Task[None]] = set()
        self._chats: dict[str, _ChatTools] = {}  # request_id -> its tool outcomes
        self._url = options.urls[0] if options.urls else ""
        self._why = ""  # why the last connection attempt failed
        self.notes = ConnectionNotes()
        self._deadline: asyncio.TimerHandle | None = None
        self._gave_up = False
        self._body: asyncio.Future[int] | None = None

    # -- stderr: for the person running the script ----------------------------------

    def _note(self, text: str) -> None:
        self.err.write(f"halfpi: {text}\n")
        self.err.flush()

    def _fail(self, code: int, text: str) -> None:
        """Say why something did not succeed; the first failure sets the status."""
        self._note(text)
        if self.exit_code == EXIT_OK:
            self.exit_code = code

    def _refused(self, exc: AuthError) -> None:
        if self.exit_code == EXIT_REFUSED:
            return  # said once
        self.exit_code = EXIT_REFUSED
        what = (
            "the credential was revoked"
            if exc.close_code == 4003
            else "pass a valid --token (or HALFPI_TOKEN), or use HOME/face.token"
        )
        self._note(f"the Mind at {self._url} refused the token ({exc.close_code}): {what}")

    # -- refusals the Mind marks retryable -------------------------------------------

    async def _retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call``, asked again while the Mind refuses it with ``retryable:
        true`` (``unavailable`` during a cluster take-over, ``busy``): with
        backoff, within --connect-timeout (without it, until it is taken),
        saying so once. A command so refused was not admitted, so asking
        again with its request_id cannot make it run twice."""
        loop = asyncio.get_running_loop()
        bound = self.options.connect_timeout
        until = None if bound is None else loop.time() + bound
        delays = backoff(cap=RETRY_CAP_S)
        said = False
        while True:
            try:
                return await call()
            except CommandError as exc:
                delay = next(delays)
                if not exc.retryable or (until is not None and loop.time() + delay > until):
                    raise
                if not said:
                    said = True
                    within = "" if bound is None else f" for up to {bound:g} s (--connect-timeout)"
                    self._note(f"{what} refused for now ({exc}); asking again{within}")
                await asyncio.sleep(delay)

    def _refusal(self, what: str, exc: CommandError) -> str:
        """A refusal as one sentence; a retryable one says how long it lasted."""
        if exc.retryable and self.options.connect_timeout is not None:
            return (f"{what} refused: {exc} (still after {self.options.connect_timeout:g} s "
                    "of asking again: --connect-timeout)")
        return f"{what} refused: {exc}"

    # -- connecting: what is tried, and why it fails --------------------------------

    async def _connect(self, url: str) -> Transport:
        self._url = url
        try:
            return await websocket_connector(url)
        except ConnectionLost as exc:
            self._why = describe_failure(exc)
            raise

    def _status(self, status: Status) -> None:
        payload: dict[str, Any] = {
            "state": status.state,
            "text": status.describe(),
            "attempt": status.attempt,
            "next_in": status.next_in,
            "replayed": status.replayed,
            "url": self._url,
        }
        if status.detail:
            payload["detail"] = status.detail
        self.out("face.status", payload)
        if status.state == "reconnecting":
            self._arm()
        elif status.state in ("live", "resuming"):
            self._disarm()
        line = self.notes.status(status, self._url, self._why)
        if status.state == "reconnecting":
            self._why = ""
        if line is not None:
            self._note(line)

    def _arm(self) -> None:
        bound = self.options.connect_timeout
        if bound is None or self._deadline is not None:
            return
        self._deadline = asyncio.get_running_loop().call_later(bound, self._give_up)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _give_up(self) -> None:
        self._deadline = None
        self._gave_up = True
        urls = ", ".join(self.options.urls)
        self._note(
            f"gave up: no Mind could be reached at {urls} for "
            f"{self.options.connect_timeout:g} s (--connect-timeout)"
        )
        if self._body is not None:
            self._body.cancel()

    # -- stdout: every message, and what it means for the exit status ---------------

    def _message(self, type_: str, payload: dict[str, Any]) -> None:
        self.out(type_, payload)  # every message, exactly as it came
        try:
            if type_ == "face.event":
                self._event(decode_event(str(payload.get("type")), payload.get("data")))
            elif type_ in ("face.snapshot", "face.reset"):
                message = read(type_, payload)
                snap = message.snapshot if isinstance(message, Reset) else message
                for approval in snap.pending_approvals:
                    self._event(approval)
                for call in snap.tool_history:
                    self._tool_ended(call.request_id, call.tool_call_id, call.tool, call.status)
        except (Malformed, msgspec.ValidationError) as exc:
            log.warning("%s not understood: %s", type_, exc)

    def _update(self, kind: str, conversation_id: str) -> None:
        """A conversation the Mind refused to let this Face follow (a stdin
        ``face.subscribe``, ``--conversation``): a refused command, said
        once by the client's log line, and the exit status it sets."""
        view = self.client.views.get(conversation_id)
        if kind == "refused" and view is not None and view.refused is not None:
            if self.exit_code == EXIT_OK:
                self.exit_code = ERROR_EXIT.get(view.refused.code, EXIT_FAILED)

    def _event(self, event: EventData | None) -> None:
        if isinstance(event, ApprovalRequested):
            self._approval_requested(event)
        elif isinstance(event, ApprovalResolved):
            call = event.tool_call_id or ""
            for chat in self._chats.values():
                if call in chat.approvals and not chat.approvals[call]:
                    # People read the decider's credential label; its id
                    # only when the Mind sent no label.
                    who = present(event.decided_by_label) or event.decided_by or ""
                    chat.approvals[call] = who or "another Face"
                    if event.status == "allowed":
                        self._note(f"approval {event.approval_id} allowed by {who}: it runs")
        elif isinstance(event, ToolCompleted):
            self._tool_ended(event.request_id, event.tool_call_id, event.tool, event.status)

    def _approval_requested(self, approval: ApprovalRequested) -> None:
        tools = self._chats.get(approval.request_id or "")
        call = approval.tool_call_id or ""
        if tools is None or call in tools.approvals:
            return  # not this face's chat, or seen already (a replay, the snapshot)
        tools.approvals[call] = ""
        expires = approval.expires_at or time.time()
        until = time.strftime("%H:%M:%S", time.localtime(expires))
        left = max(0, round(expires - time.time()))
        self._note(
            f"{approval.tool} waits for an approval in another Face "
            f"(approval {approval.approval_id}, chat {approval.request_id}): "
            f"allow or deny it there, e.g. in `halfpi face` with ctrl+a / ctrl+d, "
            f"until {until} (in {left} s)"
        )

    def _tool_ended(self, request_id: str | None, call: str, tool: str,
                    status: str | None) -> None:
        """A tool call of one of this face's chats that ended without running
        (denied, expired) sets the chat's exit status."""
        tools = self._chats.get(request_id or "")
        if tools is None or status not in TOOL_EXIT or call in tools.seen:
            return
        tools.seen.add(call)
        if status == "denied":
            who = tools.approvals.get(call) or "another Face"
            why = f"{tool} did not run: its approval was denied by {who}"
        else:
            why = f"{tool} did not run: its approval expired (nobody decided in time)"
        tools.blocked.append((TOOL_EXIT[status], why))

    # -- the run ---------------------------------------------------------------------

    async def run(self, lines: asyncio.Queue[str | None]) -> int:
        body = asyncio.ensure_future(self._run(lines))
        self._body = body
        self._arm()  # the first connection counts too
        try:
            return await body
        except asyncio.CancelledError:
            if self._gave_up:
                return EXIT_UNREACHABLE
            raise
        finally:
            self._disarm()
            await self.client.close()

    async def _run(self, lines: asyncio.Queue[str | None]) -> int:
        try:
            await self.client.connect(timeout=None)
            if self.options.new_conversation is not None:
                name = self.options.new_conversation or None
                created = new_request_id("h")  # one id for every asking: created once at most
                self.conversation = await self._retrying(
                    "creating the conversation",
                    lambda: self.client.create_conversation(name, request_id=created))
            if self.conversation is not None:
                cid = self.conversation
                await self._retrying(f"subscribing to {cid}", lambda: self.client.subscribe(cid))
            number = 0
            while (line := await lines.get()) is not None:
                number += 1
                if line.strip():
                    await self._command(number, line)
            if self._work:
                await asyncio.wait(self._work)
        except AuthError as exc:
            self._refused(exc)
        except CommandError as exc:  # creating the --new-conversation was refused
            self._fail(ERROR_EXIT.get(exc.code, EXIT_FAILED),
                       self._refusal("the start (--new-conversation, --conversation)", exc))
        return self.exit_code

    def _error(self, error: Error) -> None:
        """A face.error line the face says itself (the Mind never saw the command)."""
        self.out("face.error", msgspec.to_builtins(error))

    async def _command(self, number: int, line: str) -> None:
        try:
            type_, payload = parse_command(line)
        except ValueError as exc:
            message = f"not a command line: {exc}"
            self._error(Error(code="invalid_request", message=message, retryable=False))
            self._fail(EXIT_FAILED, f"stdin line {number} is not a command: {exc}")
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
        payload.setdefault("request_id", new_request_id("h"))
        try:
            body = command_of(type_, payload)
        except CommandError as exc:  # checked as the Mind would: never sent
            self._error(exc.error)
            self._fail(EXIT_FAILED, self._refusal(f"{type_} {payload['request_id']}", exc))
            return
        if isinstance(body, wire.Subscribe):  # followed by the client: exact across drops
            for cid in body.conversation_ids:
                await self.client.subscribe(cid)
            return
        task = asyncio.create_task(self._await(body))
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _answer(self, body: Body) -> Answer:
        return await (await self.client.submit(body)).answer()

    async def _await(self, body: Body) -> None:
        type_ = type_of(body)
        retries = self.options.retry_interrupted if isinstance(body, wire.Chat) else 0
        while True:
            request_id = body.request_id
            try:
                outcome: Answer
                if isinstance(body, wire.Chat):
                    outcome = await self._retrying(
                        f"{type_} {request_id}", partial(self._chat, body))
                else:
                    outcome = await self._retrying(
                        f"{type_} {request_id}", partial(self._answer, body))
            except CommandError as exc:  # its face.error line is already out
                self._fail(ERROR_EXIT.get(exc.code, EXIT_FAILED),
                           self._refusal(f"{type_} {request_id}", exc))
                return
            except AuthError as exc:
                self._refused(exc)
                return
            except ClientClosed:
                return  # the face is stopping (gave up): that is the reason given
            except FaceError as exc:
                self._error(Error(code="outcome_unknown", message=str(exc), retryable=False,
                                  request_id=request_id or msgspec.UNSET))
                self._fail(EXIT_FAILED, str(exc))
                return
            if not isinstance(outcome, Result):
                return  # a snapshot: a read that succeeded
            if type_ != "face.chat":
                if not outcome.ok:
                    self._fail(
                        STATUS_EXIT.get(outcome.status, EXIT_FAILED),
                        f"{type_} {request_id} ended {outcome.status}{_code(outcome)}",
                    )
                return
            if outcome.status == "interrupted" and retries > 0:
                retries -= 1
                self._note(
                    f"chat {request_id} was interrupted (the Mind restarted during the reply); "
                    f"asking again as --retry-interrupted says ({retries} more allowed)"
                )
                body = msgspec.structs.replace(body, request_id=new_request_id("h"))
                continue
            self._chat_ended(request_id or "", outcome)
            return

    async def _chat(self, body: wire.Chat) -> Result:
        """A chat, followed: its conversation is subscribed once the Mind has
        admitted it, so its approvals and tool outcomes reach the script."""
        cid = body.conversation_id
        self._chats.setdefault(body.request_id, _ChatTools())
        handle = await self.client.submit(body)
        await handle.accepted()
        if cid not in self.client.views:
            await self.client.subscribe(cid)
        return await handle.result()

    def _chat_ended(self, request_id: str, result: Result) -> None:
        status = result.status
        if status == "succeeded":
            tools = self._chats.get(request_id)
            for code, why in tools.blocked if tools is not None else ():
                self._fail(code, f"chat {request_id}: {why}")
            return
        if status == "failed":
            meaning = ERROR_MEANING.get(result.error_code or "")
            detail = f" ({result.error_code}: {meaning})" if meaning else _code(result)
            self._fail(EXIT_FAILED, f"chat {request_id} failed{detail}")
        elif status == "interrupted":
            self._fail(
                EXIT_INTERRUPTED,
                f"chat {request_id} was interrupted: the Mind restarted during the reply "
                "(not asked again; --retry-interrupted N would)",
            )
        elif status == "cancelled":
            self._fail(EXIT_CANCELLED, f"chat {request_id} was cancelled")
        else:
            self._fail(STATUS_EXIT.get(status, EXIT_FAILED), f"chat {request_id} {status}")


def _code(result: Result) -> str:
    return f" ({result.error_code})" if result.error_code else ""


def read_lines(
    stream: TextIO, queue: asyncio.Queue[str | None], loop: asyncio.AbstractEventLoop
) -> None:
    """Blocking reads on a daemon thread, so an open stdin never holds up exit.
    Once the loop is closed (Ctrl+C, the face has ended) there is nobody left
    to hand lines to: the thread ends quietly."""
    try:
        for line in iter(stream.readline, ""):
            loop.call_soon_threadsafe(queue.put_nowait, line)
        loop.call_soon_threadsafe(queue.put_nowait, None)
    except RuntimeError:
        if not loop.is_closed():
            raise


async def run_headless(
    options: HeadlessOptions,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
    stderr: TextIO = sys.stderr,
) -> int:
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(
        target=read_lines,
        args=(stdin, lines, asyncio.get_running_loop()),
        name="headless stdin",
        daemon=True,
    ).start()
    return await Headless(options, Output(stdout), stderr).run(lines)
