"""A Hand: connects out to the Mind's ``/v1/hand``, runs tools, survives drops.

Runs belong to the Hand process, not to a connection: when the link drops,
running tools keep running; the Hand reconnects with backoff, lists its
in-flight runs in ``hand.hello``, and the Mind either *adopts* them (new
connection generation; their results are then accepted) or tells it to
*abandon* them (they are killed — their outcome was already declared
``lost``; nothing runs twice). A result is kept until the Mind acknowledges
it (``hand.ack``), so one produced or lost in flight during a drop is sent
again once the run is adopted; the Mind takes only the first. Progress
produced while disconnected is dropped and the next progress says ``gap``.

A Hand process that restarts has a new ``instance_id``: the Mind marks every
run of the previous instance ``lost`` (I11).

Background tasks (DESIGN §8, docs/hands.md) are the Hand's own: it keeps
them in its task book (:mod:`halfpi.hand.tasks`), answers a delivery
(``hand.task.deliver``) with a receipt — the original one for a
redelivery — runs the task whatever happens to the connection, and tells
the Mind every change of state (``hand.task.update``), all of them again
after every reconnect to a Mind that speaks of tasks (its welcome lists
the ``tasks`` feature).

Every tool call passes the Hand's tool policy (DESIGN §8,
:mod:`halfpi.hand.policy`): the Mind asks for a verdict first
(``hand.check``), and the run is judged again when it starts — ``deny``
never runs, ``ask`` runs only if the Mind says a human approved it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import logging
import os
import platform
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import msgspec

from halfpi import __version__
from halfpi.client.reconnect import Link, Reconnect
from halfpi.client.redial import Locate, Narrator, Retry
from halfpi.client.transport import (
    ConnectionLost,
    Connector,
    Transport,
    tls_connector,
    websocket_connector,
)
from halfpi.core.hand_wire import (
    HAND_PROTOCOL,
    REASON_CHARS,
    HandAck,
    HandCancel,
    HandCheck,
    HandChecked,
    HandHello,
    HandInfo,
    HandMessage,
    HandPing,
    HandProgress,
    HandResult,
    HandRun,
    HandRunRef,
    HandStarted,
    HandTaskCancel,
    HandTaskDeliver,
    HandTaskLog,
    HandTaskLogPage,
    HandTaskReceipt,
    HandTaskRefused,
    HandTaskUpdate,
    HandTool,
    HandWelcome,
    MindMessage,
    Stream,
    TaskState,
    ToolArgs,
    decode_from_mind,
    encode_to_mind,
)
from halfpi.core.policy import Decision, Rule, Verdict
from halfpi.core.redact import Redactor
from halfpi.errors import HalfpiError, InvalidRequest
from halfpi.hand.conceal import conceal
from halfpi.hand.executor import KILL_GRACE_S, TOOLS, Outcome, ToolError, announce_confinement
from halfpi.hand.leftovers import Leftovers
from halfpi.hand.policy import HandPolicy, scrub_environment, without_secrets
from halfpi.hand.redaction import (
    SHAPES,
    LogRedaction,
    ProgressRedaction,
    redact_result,
    redact_text,
    say_redacted,
)
from halfpi.hand.tasks import TaskBook, TaskRecord
from halfpi.logs import bind, unbind
from halfpi.undumpable import make_undumpable

log = logging.getLogger("halfpi.hand")

HELLO_TIMEOUT_S = 30.0  # for hand.welcome
TASK_LOG_PAGE = 64 * 1024  # at most this much of a task's log per hand.task.log_page
TASKS_AFTER_CONNECT = 500  # the newest tasks re-announced after a reconnect
# How long a stopping Hand waits for its runs and tasks to end once told to:
# the kill grace of their command trees, and a margin.
WORK_END_S = 3 * KILL_GRACE_S

ToolFn = Callable[..., Awaitable[Outcome]]
# Called as ``tool(args, progress, cancelled, spawned, **policy_keywords)``:
# the keywords a tool declares among ``deny_paths`` (what a kernel-level
# confinement refuses), ``open_file`` (an opener that judges the file it
# opened) and ``env`` (the environment for its processes) are passed.


@dataclass
class Run:
    """A run on this Hand, from its ``hand.run`` to the Mind's ``hand.ack``."""

    run_id: str
    tool: str
    generation: int
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    result: HandResult | None = None  # kept until delivered
    progress_gap: bool = False
    sends: list[asyncio.Future[bool]] = field(default_factory=list)


class HandNode:
    def __init__(
        self,
        url: str,
        token: str,
        hand_id: str,
        *,
        tools: dict[str, ToolFn] | None = None,
        connector: Connector = websocket_connector,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        delays: Callable[[], Iterator[float]] | None = None,
        policy: HandPolicy | None = None,
        state_dir: Path | None = None,
        locate: Locate | None = None,
    ) -> None:
        self.url = url
        # Where the Mind says it is now (HOME/mind.json), asked before every
        # dial: a Mind restarted with --port 0 listens on a new port.
        self.locate = locate
        self.token = token
        self.hand_id = hand_id
        self.instance_id = os.urandom(8).hex()
        self.tools: dict[str, ToolFn] = dict(tools or TOOLS)
        self.connector = connector
        self.sleep = sleep
        # None: the shared plan's (full jitter, 30 s cap; 2 s for a local Mind).
        self.delays = delays
        self.policy = policy or HandPolicy()
        self.runs: dict[str, Run] = {}
        self._checks: set[asyncio.Task[None]] = set()
        self.leftovers = Leftovers(state_dir / f"{hand_id}.runs.json" if state_dir else None)
        # Background tasks need somewhere durable: no state folder, no tasks.
        self.book = TaskBook(state_dir / f"{hand_id}.tasks") if state_dir else None
        self.task_runs: dict[str, asyncio.Event] = {}  # running tasks: their cancel
        self._cancels_asked: set[str] = set()  # tasks the Mind asked to cancel
        self._task_work: set[asyncio.Task[None]] = set()
        self.clock: Callable[[], float] = time.time
        # Exact values this Hand redacts from tool output besides the shapes of
        # halfpi credentials (value -> kind): the Mind's own secrets, given only
        # to the Hand in its process (hand/redaction.py).
        self.secrets: Callable[[], Mapping[str, str]] | None = None
        self.speaks_tasks = False
        # Say at the start how commands are confined (a run of ``true``),
        # not on the first real run: a standalone or the local Hand does.
        self.announce = False
        self.generation = 0
        self.connected = asyncio.Event()
        self._transport: Transport | None = None
        self._stopping = False
        self._reconnect: Reconnect[HandWelcome] | None = None
        self._narrator = Narrator()

    # -- connection loop -------------------------------------------------------

    async def run_forever(self) -> bool:
        """Serve until stopped (True) or refused by the Mind (False)."""
        conceal(self.token)  # out of /proc/<pid>/environ and cmdline, where commands could read it
        await self.leftovers.kill_all()  # commands of a previous instance of this Hand
        if self.book is not None:
            for task_id in self.book.open(self.clock()):
                log.warning("task %s was unfinished when this Hand stopped: lost", task_id)
        for root in self.policy.protected_roots():
            log.warning("root %s is a protected path: tools are refused there", root)
        # The shared loop (the Face SDK's too): the URL in turn, backoff reset
        # after a welcome, a 2 s cap for a Mind on this machine.
        self._reconnect = reconnect = Reconnect(
            self.url,
            self.connector,
            self._handshake,
            sleep=self.sleep,
            delays=self.delays,
            on_retry=self._retrying,
            locate=self.locate,
        )
        if self._stopping:
            return True
        announcing = None
        if self.announce:  # beside the first dial: the link is not delayed by it
            announcing = asyncio.create_task(announce_confinement(self.policy.deny_paths()))
        try:
            async with contextlib.aclosing(reconnect.links()) as links:
                async for link in links:
                    try:
                        await self._session(link)
                    except ConnectionLost as exc:
                        link.lost = exc
                    finally:
                        self._transport = None
                        self.connected.clear()
        except ConnectionLost as exc:  # refused (4001) or revoked (4003)
            log.error("the Mind refused this Hand (%s): %s", exc.code, exc.reason)
            return False
        finally:
            if announcing is not None:
                announcing.cancel()  # its run ends with it
                await asyncio.gather(announcing, return_exceptions=True)
            await self._end_work()
        return True

    async def stop(self) -> None:
        self._stopping = True
        self._cancel_work()
        if self._reconnect is not None:
            self._reconnect.close()
        if self._transport is not None:
            await self._transport.close()

    def _cancel_work(self) -> None:
        for cancelled in self.task_runs.values():
            cancelled.set()
        for run in self.runs.values():
            run.cancelled.set()

    async def _end_work(self) -> None:
        """The Hand stops: end every run and task it started and wait for
        them, bounded. None is left to be cancelled half-way by the event
        loop's shutdown — which, while a process is being spawned, can wait
        forever on Python 3.11 (its subprocess transport waits for pipes
        that were never connected)."""
        self._stopping = True
        self._cancel_work()
        work = {*self._task_work, *self._checks,
                *(run.task for run in self.runs.values() if run.task is not None)}
        work = {w for w in work if not w.done()}
        if not work:
            return
        _, pending = await asyncio.wait(work, timeout=WORK_END_S)
        if not pending:
            return
        log.warning("%s did not end within %.0f s of the Hand stopping: cancelled",
                    ", ".join(sorted(task.get_name() for task in pending)), WORK_END_S)
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=KILL_GRACE_S)  # a cancel may not finish either

    def _retrying(self, retry: Retry) -> None:
        """While the Mind cannot be reached: one line per change of reason."""
        line = self._narrator.failed(retry)
        if line is not None:
            log.warning("%s", line)

    async def _handshake(self, transport: Transport) -> HandWelcome:
        """Say ``hand.hello``; the ``hand.welcome``, or ConnectionLost."""
        await transport.send(encode_to_mind(self._hello()).decode())
        try:
            welcome = decode_from_mind(await asyncio.wait_for(transport.recv(), HELLO_TIMEOUT_S))
        except TimeoutError:
            raise ConnectionLost(None, "no hand.welcome in time") from None
        except InvalidRequest as exc:
            raise ConnectionLost(None, f"the Mind's answer to hand.hello: {exc.message}") from None
        if not isinstance(welcome, HandWelcome):
            raise ConnectionLost(None, f"expected hand.welcome, got {type(welcome).__name__}")
        return welcome

    async def _session(self, link: Link[HandWelcome]) -> None:
        transport, welcome = link.transport, link.welcome
        self.generation = welcome.generation
        self.policy.protect(welcome.protect)  # the Mind's home
        for run_id in welcome.abandon:
            run = self.runs.pop(run_id, None)
            if run is not None:
                log.warning("abandoning run %s (the Mind declared it lost)", run_id,
                            extra={"run_id": run_id})
                run.cancelled.set()
        for run_id in welcome.adopted:
            run = self.runs.get(run_id)
            if run is not None:
                run.generation = self.generation
        self._transport = transport
        self.connected.set()
        line = self._narrator.connected(link.url)
        if line is not None:
            log.info("%s", line)
        else:  # at once: nothing worth an info line
            log.debug("connected to the Mind at %s (generation %d)", link.url, self.generation)
        for run in list(self.runs.values()):
            if run.result is not None:
                await self._deliver(run)
        self.speaks_tasks = "tasks" in welcome.features
        if self.speaks_tasks and self.book is not None:
            # What the Mind knows may be stale: every task as it stands now.
            for record in self.book.tasks()[-TASKS_AFTER_CONNECT:]:
                await self._send(task_wire(record))
        while True:
            try:
                text = await asyncio.wait_for(transport.recv(), 15.0)
            except TimeoutError:
                await self._send(HandPing())
                continue
            try:
                message = decode_from_mind(text)
            except InvalidRequest as exc:
                # Dropped, the link kept: an order that never ran ends by the
                # Mind's own deadline, as for a Hand that did not answer.
                log.warning("refused a message from the Mind (%s): %s",
                            exc.code.value, exc.message[:300])
                continue
            await self._on_message(message)

    async def _on_message(self, message: MindMessage) -> None:
        match message:
            case HandCheck():
                check = asyncio.create_task(self._check(message), name="a policy check")
                self._checks.add(check)
                check.add_done_callback(self._checks.discard)
            case HandRun():
                self._start(message)
            case HandCancel(run_id=run_id):
                run = self.runs.get(run_id)
                if run is not None:
                    run.cancelled.set()
            case HandTaskDeliver():
                await self._task_deliver(message)
            case HandTaskCancel(task_id=task_id):
                await self._task_cancel(task_id)
            case HandTaskLog():
                await self._task_log(message)
            case HandAck(run_ids=run_ids):
                # The Mind has the result durably: only now may it be forgotten.
                for run_id in run_ids:
                    done = self.runs.get(run_id)
                    if done is not None and done.result is not None:
                        self.runs.pop(run_id, None)
            case _:
                pass  # hand.pong, a second welcome: nothing to do

    def _hello(self) -> HandHello:
        return HandHello(
            token=self.token,
            hand_id=self.hand_id,
            instance_id=self.instance_id,
            info=HandInfo(
                hostname=socket.gethostname()[:200],
                os=platform.system()[:200],
                arch=platform.machine()[:200],
                version=__version__,
            ),
            tools=[HandTool(name=name) for name in sorted(self.tools)],
            policy=self.policy.advertised(),
            protocol=HAND_PROTOCOL,
            runs=[HandRunRef(run_id=r.run_id, generation=r.generation)
                  for r in self.runs.values()],
        )

    async def _send(self, message: HandMessage) -> bool:
        transport = self._transport
        if transport is None:
            return False
        try:
            await transport.send(encode_to_mind(message).decode())
        except ConnectionLost:
            return False
        return True

    # -- policy ----------------------------------------------------------------------

    async def _check(self, order: HandCheck) -> None:
        """Answer ``hand.check``: the verdict on the paths as they resolve now."""
        tool = order.tool
        if tool in self.tools:
            try:
                decision = await asyncio.to_thread(self.policy.check, tool, dict(order.args))
            except Exception as exc:  # a check always gets an answer, never a silence
                # The kind of failure only: its message may name the arguments.
                log.error("the policy check of %s failed: %s", tool[:100], type(exc).__name__)
                decision = Decision(Verdict.DENY, f"the policy check failed: {exc}",
                                    "policy_error")
        else:
            decision = Decision(Verdict.DENY, f"this Hand has no tool {tool[:100]!r}",
                                "unknown_tool")
        await self._send(HandChecked(
            check_id=order.check_id, verdict=decision.verdict.value,
            reason=decision.reason[:REASON_CHARS], category=decision.category))

    def _policy_keywords(
        self, tool: ToolFn, name: str, args: ToolArgs, approved: bool
    ) -> tuple[ToolArgs, dict[str, Any]]:
        """The arguments and keywords a tool runs with under the policy."""
        accepts = _parameters(tool)
        keywords: dict[str, Any] = {}
        if "deny_paths" in accepts:
            keywords["deny_paths"] = self.policy.deny_paths()
        if "open_file" in accepts:
            keywords["open_file"] = partial(self.policy.open_checked, name, approved)
        if "env" in accepts:
            keywords["env"] = scrub_environment(os.environ)
        elif name == "exec_command":
            args = without_secrets(args, os.environ)
        return args, keywords

    # -- runs ------------------------------------------------------------------------

    def _start(self, order: HandRun) -> None:
        run_id = order.run_id
        if run_id in self.runs:
            return  # a duplicate order for a run already here: never run twice
        run = Run(run_id, order.tool, order.generation)
        self.runs[run_id] = run
        bound = bind(run_id=run_id)  # the run's task logs with its id (--log-format json)
        try:
            run.task = asyncio.create_task(
                self._execute(run, dict(order.args), order.timeout_s, order.approved),
                name=f"run {run_id}",
            )
        finally:
            unbind(bound)

    async def _execute(
        self, run: Run, args: ToolArgs, timeout_s: float | None, approved: bool = False
    ) -> None:
        await self._send(HandStarted(run_id=run.run_id, generation=run.generation))
        tool = self.tools.get(run.tool)
        if timeout_s is not None and "timeout_s" not in args:
            args["timeout_s"] = timeout_s

        def progress(kind: str, text: str, gap: bool) -> None:
            if self._transport is None:
                run.progress_gap = True
                return
            gap, run.progress_gap = gap or run.progress_gap, False
            run.sends = [f for f in run.sends if not f.done()]
            run.sends.append(asyncio.ensure_future(self._send(HandProgress(
                run_id=run.run_id, generation=run.generation,
                kind=cast(Stream, kind), data=text, gap=gap))))

        redactor = self._redactor()
        redacted = ProgressRedaction(progress, redactor)  # no credential leaves in its output
        try:
            if tool is None:
                raise ToolError("unknown_tool", f"this Hand has no tool {run.tool!r}")
            # Judged again now, whatever the check said: the disk may have changed.
            await asyncio.to_thread(self.policy.enforce, run.tool, args, approved=approved)
            args, keywords = self._policy_keywords(tool, run.tool, args, approved)
            outcome = await tool(
                args,
                redacted,
                run.cancelled,
                partial(self.leftovers.spawned, run.run_id),
                **keywords,
            )
            redacted.close()
        except ToolError as exc:
            outcome = Outcome("failed", error_category=exc.category, error=str(exc))
        except Exception as exc:  # a tool bug must still end the run
            log.exception("tool %s crashed", run.tool)
            outcome = Outcome("failed", error_category="tool_crashed", error=str(exc))
        counts = redacted.counts
        result = redact_result(outcome.result(run.run_id, run.generation), counts, redactor)
        run.result = result
        say_redacted(f"run {run.run_id} ({run.tool})", counts)
        # The tool's name and how it ended: never its arguments or output.
        log.debug("run %s: %s ended %s", run.run_id, run.tool, result.status)
        self.leftovers.ended(run.run_id)
        await asyncio.gather(*run.sends, return_exceptions=True)  # progress before result
        if run.run_id in self.runs:
            await self._deliver(run)

    async def _deliver(self, run: Run) -> None:
        assert run.result is not None
        # Kept until hand.ack, re-sent after a drop: stamped with the
        # generation that adopted it.
        await self._send(msgspec.structs.replace(run.result, generation=run.generation))


    # -- background tasks ------------------------------------------------------------

    async def _task_deliver(self, order: HandTaskDeliver) -> None:
        delivery_id = order.delivery_id[:128]
        tool, args, timeout_s = order.tool, dict(order.args), order.timeout
        book = self.book
        try:
            if book is None:
                raise ToolError("unavailable", "this Hand keeps no state: it takes no tasks")
            receipt = book.deliver(delivery_id, tool, args, timeout_s, self.clock())
        except HalfpiError as exc:
            await self._send(HandTaskRefused(delivery_id=delivery_id, code=exc.code.value,
                                             message=exc.message[:REASON_CHARS]))
            return
        except ToolError as exc:
            await self._send(HandTaskRefused(delivery_id=delivery_id, code=exc.category,
                                             message=str(exc)[:REASON_CHARS]))
            return
        await self._send(HandTaskReceipt(
            delivery_id=receipt.delivery_id, task_id=receipt.task_id,
            state=cast(TaskState, receipt.state), deduplicated=receipt.deduplicated,
            received_at=receipt.received_at))
        if not receipt.deduplicated:
            # Its cancel exists from now on: a stop or a cancel before the
            # work's first step still reaches it.
            cancelled = self.task_runs[receipt.task_id] = asyncio.Event()
            if self._stopping:
                cancelled.set()
            work = asyncio.create_task(self._task_execute(
                receipt.task_id, tool, args, timeout_s, order.approved, cancelled),
                name=f"task {receipt.task_id}")
            self._task_work.add(work)
            work.add_done_callback(self._task_work.discard)

    async def _task_execute(
        self, task_id: str, name: str, args: ToolArgs, timeout_s: float | None, approved: bool,
        cancelled: asyncio.Event,
    ) -> None:
        book = self.book
        assert book is not None
        try:
            if cancelled.is_set():  # before it began: it never starts
                state, error = self._cancelled_as(task_id)
                if book.move(task_id, state, self.clock(), error=error):
                    await self._task_update(task_id)
                return
            if not book.move(task_id, "running", self.clock()):
                return  # cancelled while queued
            await self._task_update(task_id)
            tool = self.tools.get(name)
            if timeout_s is not None and "timeout_s" not in args:
                args["timeout_s"] = timeout_s

            def progress(kind: str, text: str, gap: bool) -> None:
                pass  # the log keeps every byte (below); progress is for foreground runs

            # Redacted before a byte of it is kept (docs/hands.md, "Redaction").
            redactor = self._redactor()
            output = LogRedaction(partial(book.append_log, task_id), redactor)
            try:
                if tool is None:
                    raise ToolError("unknown_tool", f"this Hand has no tool {name!r}")
                await asyncio.to_thread(self.policy.enforce, name, args, approved=approved)
                args, keywords = self._policy_keywords(tool, name, args, approved)
                if "output" in _parameters(tool):
                    keywords["output"] = output
                outcome = await tool(args, progress, cancelled,
                                     partial(self.leftovers.spawned, task_id), **keywords)
                if "output" not in keywords:
                    output("stdout", outcome.stdout)
                    output("stderr", outcome.stderr)
                output.close()
                state, exit_code, error = outcome.status, outcome.exit_code, outcome.error
            except ToolError as exc:
                state, exit_code, error = "failed", None, f"{exc.category}: {exc}"
            except Exception as exc:  # a tool bug must still end the task
                log.exception("task %s: tool %s crashed", task_id, name)
                state, exit_code, error = "failed", None, f"tool_crashed: {exc}"
            if state == "cancelled":
                state, error = self._cancelled_as(task_id)
            counts = output.counts
            error = redact_text(error, counts, redactor)
            say_redacted(f"task {task_id} ({name})", counts)
            self.leftovers.ended(task_id)
            book.move(task_id, state, self.clock(), exit_code=exit_code,
                      error=None if error is None else error[:REASON_CHARS])
            await self._task_update(task_id)
        finally:
            self.task_runs.pop(task_id, None)
            self._cancels_asked.discard(task_id)

    def _redactor(self) -> Redactor:
        return SHAPES if self.secrets is None else Redactor(self.secrets())

    def _cancelled_as(self, task_id: str) -> tuple[str, str | None]:
        """How a task its cancel ended is recorded: ``cancelled`` when the
        Mind asked; else the Hand stopped under it — ``lost``, as a Hand
        that restarts records what it had not finished (never re-run)."""
        if task_id in self._cancels_asked:
            return "cancelled", None
        return "lost", "the Hand stopped while the task was unfinished"

    async def _task_cancel(self, task_id: str) -> None:
        book = self.book
        record = None if book is None else book.get(task_id)
        if book is None or record is None:
            await self._send(HandTaskRefused(task_id=task_id[:128], code="task_not_found",
                                             message="no such task"))
            return
        running = self.task_runs.get(task_id)
        if running is not None:
            self._cancels_asked.add(task_id)
            running.set()  # it ends as cancelled, unless it ends first
        elif book.move(task_id, "cancelled", self.clock()):
            await self._task_update(task_id)
        else:
            await self._task_update(task_id)  # already ended: say how

    async def _task_log(self, order: HandTaskLog) -> None:
        task_id = order.task_id[:128]
        book = self.book
        record = None if book is None else book.get(task_id)
        if book is None or record is None:
            await self._send(HandTaskRefused(task_id=task_id, code="task_not_found",
                                             message="no such task"))
            return
        offset = max(0, order.offset)
        limit = min(TASK_LOG_PAGE, max(1, order.limit or TASK_LOG_PAGE))
        page = book.read_log(task_id, offset, limit)
        await self._send(HandTaskLogPage(
            task_id=task_id, offset=offset, next_offset=page.next_offset,
            data_b64=base64.b64encode(page.data).decode(), truncated=page.truncated,
            state=cast(TaskState, record.state)))

    async def _task_update(self, task_id: str) -> None:
        record = None if self.book is None else self.book.get(task_id)
        if record is not None and self.speaks_tasks:
            await self._send(task_wire(record))


def task_wire(record: TaskRecord) -> HandTaskUpdate:
    """A task as the Hand tells the Mind of it (``hand.task.update``)."""
    return HandTaskUpdate(
        task_id=record.task_id, delivery_id=record.delivery_id, tool=record.tool,
        state=cast(TaskState, record.state), created_at=record.created_at,
        started_at=record.started_at, ended_at=record.ended_at,
        exit_code=record.exit_code, error=record.error,
        log_bytes=record.log_bytes, log_truncated=record.log_truncated,
    )


def _parameters(tool: ToolFn) -> set[str]:
    """The keywords a tool declares (none for a callable Python cannot introspect)."""
    try:
        return set(inspect.signature(tool).parameters)
    except (TypeError, ValueError):
        return set()


async def run_hand(
    url: str,
    token: str,
    hand_id: str,
    state_dir: Path,
    *,
    roots: Iterable[str] = (),
    rules: Mapping[str, Rule] | None = None,
    protected: Iterable[str | Path] = (),
    ca_file: str | None = None,
    locate: Locate | None = None,
) -> bool:
    """Serve as a standalone Hand. Its roots default to the working directory;
    its home (``protected``) and state are never reachable by a tool.
    ``locate``: where the Mind is now, asked before every dial (else ``url``)."""
    node = HandNode(
        url,
        token,
        hand_id,
        state_dir=state_dir,
        # wss:// is verified against the system's CAs, or this CA file.
        connector=tls_connector(ca_file) if ca_file else websocket_connector,
        policy=HandPolicy(roots, rules, [*protected, state_dir]),
        locate=locate,
    )
    node.announce = True
    # Its memory holds its token: no command of its user may read it where
    # no PID namespace hides this process (undumpable.py). Concealed first:
    # a non-dumpable process of an ordinary user cannot read its own environ.
    conceal(token)
    make_undumpable()
    try:
        return await node.run_forever()
    except asyncio.CancelledError:
        return True
