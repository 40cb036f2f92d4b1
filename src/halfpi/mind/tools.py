"""One tool call of a chat, from the agent's request to its recorded result.

1. Project the arguments (DESIGN §6) and record the call — ``chat.tool_called``
   and the first step of its display record — in the chat's detail mode,
   frozen when the chat was admitted (I9).
2. Ask the Hand for its policy verdict (``hand.check``, DESIGN §8): only
   the Hand can resolve the paths the call names. ``deny`` fails the call
   (``forbidden_path``); ``ask`` — or ``allow`` where this Mind's own floor
   (``Config.approval_required``) requires approval — asks a human and waits
   (DESIGN §7).
3. Run it on the Hand (DESIGN §8), telling it whether a human approved (the
   Hand judges again and refuses what its policy does not permit), relaying
   bounded progress to transparent viewers of a transparent admission only.
4. Record the result — ``chat.tool_completed`` and the second step of the
   record — and hand the full result back to the agent.

A chat cancel reaches every step: a pending approval becomes ``cancelled``
(its waiter woken at once), a running tool gets the cancel propagated.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from msgspec import UNSET

from halfpi.agents.base import ToolSpec
from halfpi.config import Config
from halfpi.core.events import RunChanged, ToolCalled, ToolCompleted, ToolOutput, builtins
from halfpi.core.ids import new_id
from halfpi.core.policy import FORBIDDEN_PATH, Decision, Verdict, with_floor
from halfpi.core.projection import project_args, truncate_output
from halfpi.mind.actor import ChatRun, ConversationActor
from halfpi.mind.approvals import Approvals
from halfpi.mind.hands import HandRegistry, HandUnavailable, ToolRun
from halfpi.mind.redaction import OutputRedaction
from halfpi.store.base import ToolCallRow, ToolRunRow, WriteTx

# Per-tool display rules for argument fields (DESIGN §6); secrets are masked
# centrally whatever these say.
TOOL_RULES: dict[str, dict[str, str]] = {
    "exec_command": {
        "command": "show",
        "argv": "show",
        "cwd": "show",
        "env": "mask",
        "stdin": "preview",
    },
    "read_file": {"path": "show"},
}
# The built-in tools as a model is offered them (docs/agent.md): what each
# does and its arguments as a JSON Schema. Only what a model needs: a shell
# line (``cd DIR && …`` picks a directory), a path. Optional fields invite a
# small model to fill them with guesses; ``argv``, ``cwd``, ``timeout_s``,
# ``max_bytes`` keep their defaults, and ``hand`` is the conversation's.
TOOL_SPECS: dict[str, ToolSpec] = {
    "exec_command": ToolSpec(
        "exec_command",
        "Run a shell command on the user's machine and return its exit code, stdout and "
        "stderr. A person approves each command before it runs.",
        {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "the command line, run by sh -c"},
            },
            "required": ["command"],
            "additionalProperties": False,
        },
    ),
    "read_file": ToolSpec(
        "read_file",
        "Read a text file on the user's machine and return its content (at most 1 MiB).",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "the file's path"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    ),
}
CANCEL_SETTLE_S = 10.0
DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 24 * 3600.0


class BadArguments(ValueError):
    """Arguments the Mind itself must read are not what they must be."""


class ToolCalls:
    """The tool path of every chat: what it needs is passed in — the Hands,
    the approvals, this Mind's approval floor — and it appends to the
    conversation through the actor's public API."""

    def __init__(
        self,
        hands: HandRegistry,
        approvals: Approvals,
        config: Config,
        redaction: OutputRedaction | None = None,
    ) -> None:
        self.hands = hands
        self.approvals = approvals
        self.config = config
        # The Mind's secrets never leave through a tool (DESIGN §8).
        self.redaction = redaction or OutputRedaction.of(config)

    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools a model is offered: those of the conversation's Hand
        (the default one) that have a spec; none while no Hand is connected."""
        hand_id = self.hands.default_hand()
        hand = self.hands.hands.get(hand_id) if hand_id is not None else None
        if hand is None:
            return ()
        return tuple(spec for name, spec in TOOL_SPECS.items() if name in hand.tools)

    async def call(
        self, actor: ConversationActor, run: ChatRun, tool: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        """One tool call of ``run``, from the agent's request to its recorded
        result (the module docstring has the steps); returns the full result."""
        now = actor.wall()
        args = dict(args)
        hand_id = args.pop("hand", None) or self.hands.default_hand()
        projection = project_args(args, TOOL_RULES.get(tool))
        transparent = run.detail_mode == "transparent"
        call = ToolCallRow(
            tool_call_id=new_id("t", now),
            conversation_id=actor.id,
            chat_run_id=run.run_id,
            request_id=run.request_id,
            tool=tool,
            detail_mode=run.detail_mode,
            args_digest=projection.digest,
            args=projection.args if transparent else None,
            scan_warnings=projection.warnings,
            called_seq=0,
            status="called",
            created_at=now,
            hand_id=hand_id,
        )
        called = actor.stage(
            ToolCalled(
                request_id=run.request_id,
                tool_call_id=call.tool_call_id,
                tool=tool,
                args_digest=projection.digest,
                scan_warnings=list(projection.warnings),
                detail_mode=run.detail_mode,
                hand=hand_id,
                args=projection.args if transparent else UNSET,
            ),
            now,
        )
        call = dataclasses.replace(call, called_seq=called.seq)
        try:
            await actor.commit(called, tx=WriteTx(tool_calls=[call]))
            if hand_id is None or not self.hands.connected(hand_id):
                why = f"no connected Hand {hand_id!r}" if hand_id else "no Hand is connected"
                return await self._unavailable(actor, run, call, why)
            timeout_s = _timeout_of(args)
            try:
                decision = await self.hands.check(hand_id, tool, args)
            except HandUnavailable as exc:
                return await self._unavailable(actor, run, call, exc.message)
            decision = with_floor(decision, tool, required=self._floor(hand_id, tool))
            if decision.verdict is Verdict.DENY:
                category = decision.category or FORBIDDEN_PATH
                return await _complete(
                    actor,
                    run,
                    call,
                    None,
                    "failed",
                    {"error_category": category, "error": decision.reason},
                )
            approved = False
            if decision.verdict is Verdict.ASK:
                state = await self._approve(actor, run, call, tool, decision)
                if state != "allowed":
                    return await _complete(actor, run, call, None, state, {"error_category": state})
                approved = True
            return await self._run_on_hand(
                actor, run, call, hand_id, tool, args, timeout_s, approved
            )
        except BadArguments as exc:
            return await _complete(
                actor,
                run,
                call,
                None,
                "failed",
                {"error_category": "bad_arguments", "error": str(exc)},
            )
        except asyncio.CancelledError:
            # The chat was cancelled at some step: settle what is pending (the
            # approval, the call), shielded so a second cancel cannot cut it short.
            await asyncio.shield(self._cancelled(actor, run, call))
            raise
        except Exception:
            await asyncio.shield(
                _complete(actor, run, call, None, "failed", {"error_category": "internal_error"})
            )
            raise

    def _floor(self, hand_id: str, tool: str) -> bool:
        """Whether this Mind requires approval for ``tool`` on ``hand_id``
        whatever the Hand's own rule says (a Hand can never lower it). The
        rules its operator gave the local Hand (``--hand-approval``) are that
        operator's own choice, so they stand for that Hand."""
        config = self.config
        if tool not in config.approval_required:
            return False
        own = dict(config.hand_approval)
        return not (hand_id == config.local_hand_label and config.local_hand and tool in own)

    async def _unavailable(
        self, actor: ConversationActor, run: ChatRun, call: ToolCallRow, why: str
    ) -> dict[str, Any]:
        return await _complete(
            actor, run, call, None, "failed", {"error_category": "hand_unavailable", "error": why}
        )

    async def _cancelled(self, actor: ConversationActor, run: ChatRun, call: ToolCallRow) -> None:
        approval = self.approvals.for_call(call.tool_call_id)
        if approval is not None:
            self.approvals.settle(approval, "cancelled", None, None, "the chat was cancelled")
        await _complete(actor, run, call, None, "cancelled", {"error_category": "cancelled"})

    async def _approve(
        self,
        actor: ConversationActor,
        run: ChatRun,
        call: ToolCallRow,
        tool: str,
        decision: Decision,
    ) -> str:
        """Ask a human; the decision that stands (DESIGN §7)."""
        approval = await self.approvals.request(
            actor,
            request_id=run.request_id,
            tool_call_id=call.tool_call_id,
            tool=tool,
            args_digest=call.args_digest,
            args=call.args,
            detail_mode=run.detail_mode,
            reason=f"the agent wants to run {tool}: {decision.reason}",
        )
        return await asyncio.shield(approval.decided)

    async def _run_on_hand(
        self,
        actor: ConversationActor,
        run: ChatRun,
        call: ToolCallRow,
        hand_id: str,
        tool: str,
        args: dict[str, Any],
        timeout_s: float,
        approved: bool,
    ) -> dict[str, Any]:
        now = actor.wall()
        record = ToolRunRow(
            new_id("x", now), call.tool_call_id, actor.id, hand_id, tool, "queued", now
        )
        transparent = call.detail_mode == "transparent"
        progress_seq = 0
        # Each stream redacted as it comes: a secret cut by a chunk boundary
        # waits, whole, for the next chunk or the end (core/redact.py).
        streams = {kind: self.redaction.stream() for kind in ("stdout", "stderr")}
        gaps: set[str] = set()

        def show(kind: str, text: str) -> None:
            nonlocal progress_seq
            if text:
                progress_seq += 1
                gap = kind in gaps
                gaps.discard(kind)
                actor.emit_progress(run, call.tool_call_id, kind, text, gap, progress_seq)

        def on_progress(kind: str, text: str, gap: bool) -> None:
            stream = streams.get(kind)
            if not transparent or stream is None:
                return  # summary admissions get no progress at all (DESIGN §6)
            if gap:
                stream.drop()
                gaps.add(kind)
            show(kind, stream.feed(text))

        def on_state(status: str) -> None:
            nonlocal record
            record = dataclasses.replace(
                record, status=status, finished_at=actor.wall() if status != "running" else None
            )
            _run_changed(actor, record)

        tool_run = ToolRun(
            record.run_id,
            hand_id,
            tool,
            args,
            timeout_s,
            actor.id,
            call.tool_call_id,
            on_progress=on_progress,
            on_state=on_state,
            approved=approved,
        )
        # The display record learns its run as the run is created, in one write.
        _run_changed(actor, record, dataclasses.replace(call, run_id=record.run_id))
        run.tool_runs[record.run_id] = tool_run
        self.hands.start(tool_run)
        try:
            result = await asyncio.shield(tool_run.done)
        except asyncio.CancelledError:
            self.hands.cancel(tool_run)
            await asyncio.shield(self._settle_run(actor, run, call, tool_run))
            raise
        finally:
            run.tool_runs.pop(record.run_id, None)
        if transparent:
            for kind, stream in streams.items():
                for piece in stream.flush():
                    show(kind, piece)
        result = self.redaction.result(result, _where(actor, call, record.run_id, hand_id))
        return await _complete(actor, run, call, record.run_id, result["status"], result)

    async def _settle_run(
        self, actor: ConversationActor, run: ChatRun, call: ToolCallRow, tool_run: ToolRun
    ) -> None:
        """After a cancel was propagated: the Hand's answer (or ``lost`` if it
        stays silent for ``CANCEL_SETTLE_S`` of the Mind's clock) completes the call."""
        hands = self.hands
        silent = hands.scheduler.call_later(
            CANCEL_SETTLE_S, hands.finish, tool_run, "lost", {"error_category": "lost"}
        )
        try:
            result = await asyncio.shield(tool_run.done)
        finally:
            silent.cancel()
        where = _where(actor, call, tool_run.run_id, tool_run.hand_id)
        result = self.redaction.result(result, where)
        await _complete(actor, run, call, tool_run.run_id, result["status"], result)


def _where(actor: ConversationActor, call: ToolCallRow, run_id: str, hand_id: str) -> str:
    """Where a tool's output came from, for the audit line (never the output)."""
    return (f"conversation {actor.id}, tool call {call.tool_call_id} ({call.tool}), "
            f"run {run_id}, Hand {hand_id}")


def _timeout_of(args: dict[str, Any]) -> float:
    raw = args.get("timeout_s")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= MAX_TIMEOUT_S:
        raise BadArguments(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:.0f}]")
    return float(raw)


async def _complete(
    actor: ConversationActor,
    run: ChatRun,
    call: ToolCallRow,
    run_id: str | None,
    status: str,
    result: dict[str, Any],
) -> dict[str, Any]:
    """Complete a call once: the first completion stands (I10)."""
    if call.tool_call_id in run.completed_calls:
        return {"tool": call.tool, "status": status, "success": False}
    run.completed_calls.add(call.tool_call_id)
    return await complete_call(actor, call, run_id, status, result)


def run_changed(record: ToolRunRow) -> RunChanged:
    """``run.changed`` for a tool run's record."""
    return RunChanged(
        run_id=record.run_id,
        tool_call_id=record.tool_call_id,
        hand=record.hand_id,
        tool=record.tool,
        status=record.status,
    )


def _run_changed(
    actor: ConversationActor, record: ToolRunRow, call: ToolCallRow | None = None
) -> None:
    tx = WriteTx(tool_runs=[record], tool_calls=[call] if call else [])
    actor.append(run_changed(record), tx)


async def complete_call(
    actor: ConversationActor,
    call: ToolCallRow,
    run_id: str | None,
    status: str,
    result: dict[str, Any],
) -> dict[str, Any]:
    """Second step of the display record (with its ``chat.tool_completed``),
    and the agent's view of the outcome. Also what recovery uses to close a
    call whose outcome a restart made unknown."""
    now = actor.wall()
    success = status == "succeeded"
    stdout, stderr = str(result.get("stdout") or ""), str(result.get("stderr") or "")
    shown_out, cut_out = truncate_output(stdout.encode(), 768 * 1024)
    shown_err, cut_err = truncate_output(stderr.encode(), 256 * 1024)
    display = ToolOutput(stdout=shown_out, stderr=shown_err, exit_code=result.get("exit_code"))
    transparent = call.detail_mode == "transparent"
    data = ToolCompleted(
        request_id=call.request_id,
        tool_call_id=call.tool_call_id,
        run_id=run_id,
        tool=call.tool,
        status=status,
        success=success,
        output_bytes=int(result.get("output_bytes") or 0),
        digest=result.get("digest") or "",
        truncated=bool(result.get("truncated")) or cut_out or cut_err,
        error_category=result.get("error_category"),
        result=display if transparent else UNSET,
    )
    completed = actor.stage(data, now)
    done = dataclasses.replace(
        call,
        status=status,
        run_id=run_id,
        success=success,
        output_bytes=data.output_bytes,
        digest=data.digest,
        truncated=data.truncated,
        error_category=data.error_category,
        result=builtins(display) if transparent else None,
        completed_seq=completed.seq,
        finished_at=now,
    )
    await asyncio.shield(actor.commit(completed, tx=WriteTx(tool_calls=[done])))
    return {
        "tool": call.tool,
        "status": status,
        "success": success,
        "exit_code": result.get("exit_code"),
        "stdout": stdout,
        "stderr": stderr,
        "error_category": data.error_category,
        "error": result.get("error"),
        # What the agent may say of it where everyone reads (DESIGN §6).
        "detail_mode": call.detail_mode,
        "output_bytes": data.output_bytes,
    }
