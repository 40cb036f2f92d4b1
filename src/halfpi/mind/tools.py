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
from typing import TYPE_CHECKING, Any

import msgspec

from halfpi.core.ids import new_id
from halfpi.core.outbound import PROGRESS, Message
from halfpi.core.policy import FORBIDDEN_PATH, Decision, Verdict, with_floor
from halfpi.core.projection import project_args, summary_data, truncate_output
from halfpi.mind.hands import HandUnavailable, ToolRun
from halfpi.store.base import ToolCallRow, ToolRunRow, WriteTx

if TYPE_CHECKING:
    from halfpi.config import Config
    from halfpi.mind.actor import ChatRun, ConversationActor

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
CANCEL_SETTLE_S = 10.0
DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 24 * 3600.0


async def call_tool(
    actor: ConversationActor, run: ChatRun, tool: str, args: dict[str, Any]
) -> dict[str, Any]:
    host = actor.host
    now = host.now()
    args = dict(args)
    hand_id = args.pop("hand", None) or host.hands.default_hand()
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
    summary = {
        "request_id": run.request_id,
        "tool_call_id": call.tool_call_id,
        "tool": tool,
        "args_digest": projection.digest,
        "scan_warnings": list(projection.warnings),
        "detail_mode": run.detail_mode,
        "hand": hand_id,
    }
    data = {**summary, "args": projection.args} if transparent else summary
    message, event = actor._event(
        "chat.tool_called", data, now, summary_data("chat.tool_called", data)
    )
    call = dataclasses.replace(call, called_seq=message.seq)
    try:
        await actor._commit(WriteTx(events=[event], tool_calls=[call]), [(message, None)])
        if hand_id is None or not host.hands.connected(hand_id):
            why = f"no connected Hand {hand_id!r}" if hand_id else "no Hand is connected"
            return await _unavailable(actor, run, call, why)
        timeout_s = _timeout_of(args)
        try:
            decision = await host.hands.check(hand_id, tool, args)
        except HandUnavailable as exc:
            return await _unavailable(actor, run, call, exc.message)
        decision = with_floor(decision, tool, required=_floor(host.config, hand_id, tool))
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
            state = await _approve(actor, run, call, tool, decision)
            if state != "allowed":
                return await _complete(actor, run, call, None, state, {"error_category": state})
            approved = True
        return await _run_on_hand(actor, run, call, hand_id, tool, args, timeout_s, approved)
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
        await asyncio.shield(_cancelled(actor, run, call))
        raise
    except Exception:
        await asyncio.shield(
            _complete(actor, run, call, None, "failed", {"error_category": "internal_error"})
        )
        raise


class BadArguments(ValueError):
    """Arguments the Mind itself must read are not what they must be."""


def _floor(config: Config, hand_id: str, tool: str) -> bool:
    """Whether this Mind requires approval for ``tool`` on ``hand_id``
    whatever the Hand's own rule says (a Hand can never lower it). The
    rules its operator gave the local Hand (``--hand-approval``) are that
    operator's own choice, so they stand for that Hand."""
    if tool not in config.approval_required:
        return False
    own = dict(config.hand_approval)
    return not (hand_id == "local" and config.local_hand and tool in own)


async def _unavailable(
    actor: ConversationActor, run: ChatRun, call: ToolCallRow, why: str
) -> dict[str, Any]:
    return await _complete(
        actor, run, call, None, "failed", {"error_category": "hand_unavailable", "error": why}
    )


def _timeout_of(args: dict[str, Any]) -> float:
    raw = args.get("timeout_s")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw <= MAX_TIMEOUT_S:
        raise BadArguments(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S:.0f}]")
    return float(raw)


async def _cancelled(actor: ConversationActor, run: ChatRun, call: ToolCallRow) -> None:
    host = actor.host
    approval = host.approvals.for_call(call.tool_call_id)
    if approval is not None:
        host.approvals.settle(approval, "cancelled", None, None, "the chat was cancelled")
    await _complete(actor, run, call, None, "cancelled", {"error_category": "cancelled"})


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


async def _approve(
    actor: ConversationActor, run: ChatRun, call: ToolCallRow, tool: str, decision: Decision
) -> str:
    """Ask a human; the decision that stands (DESIGN §7)."""
    host = actor.host
    approval = await host.approvals.request(
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
    actor: ConversationActor,
    run: ChatRun,
    call: ToolCallRow,
    hand_id: str,
    tool: str,
    args: dict[str, Any],
    timeout_s: float,
    approved: bool,
) -> dict[str, Any]:
    host = actor.host
    now = host.now()
    record = ToolRunRow(new_id("x", now), call.tool_call_id, actor.id, hand_id, tool, "queued", now)
    transparent = call.detail_mode == "transparent"
    progress_seq = 0

    def on_progress(kind: str, text: str, gap: bool) -> None:
        nonlocal progress_seq
        if transparent:  # summary admissions get no progress at all (DESIGN §6)
            progress_seq += 1
            actor.emit_progress(run, call.tool_call_id, kind, text, gap, progress_seq)

    def on_state(status: str) -> None:
        nonlocal record
        record = dataclasses.replace(
            record, status=status, finished_at=host.now() if status != "running" else None
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
    host.hands.start(tool_run)
    try:
        result = await asyncio.shield(tool_run.done)
    except asyncio.CancelledError:
        host.hands.cancel(tool_run)
        await asyncio.shield(_settle_run(actor, run, call, tool_run))
        raise
    finally:
        run.tool_runs.pop(record.run_id, None)
    return await _complete(actor, run, call, record.run_id, result["status"], result)


async def _settle_run(
    actor: ConversationActor, run: ChatRun, call: ToolCallRow, tool_run: ToolRun
) -> None:
    """After a cancel was propagated: the Hand's answer (or ``lost`` if it
    stays silent for ``CANCEL_SETTLE_S`` of the Mind's clock) completes the call."""
    hands = actor.host.hands
    silent = hands.scheduler.call_later(
        CANCEL_SETTLE_S, hands.finish, tool_run, "lost", {"error_category": "lost"}
    )
    try:
        result = await asyncio.shield(tool_run.done)
    finally:
        silent.cancel()
    await _complete(actor, run, call, tool_run.run_id, result["status"], result)


def _run_changed(
    actor: ConversationActor, record: ToolRunRow, call: ToolCallRow | None = None
) -> None:
    data = {
        "run_id": record.run_id,
        "tool_call_id": record.tool_call_id,
        "hand": record.hand_id,
        "tool": record.tool,
        "status": record.status,
    }
    message, event = actor._event("run.changed", data, actor.host.now())

    def shown() -> None:
        if record.status in ("queued", "running"):
            actor.visible_tool_runs[record.run_id] = data
        else:
            actor.visible_tool_runs.pop(record.run_id, None)

    tx = WriteTx(events=[event], tool_runs=[record], tool_calls=[call] if call else [])
    actor._commit(tx, [(message, shown)])


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
    now = actor.host.now()
    success = status == "succeeded"
    stdout, stderr = str(result.get("stdout") or ""), str(result.get("stderr") or "")
    shown_out, cut_out = truncate_output(stdout.encode(), 768 * 1024)
    shown_err, cut_err = truncate_output(stderr.encode(), 256 * 1024)
    display = {"stdout": shown_out, "stderr": shown_err, "exit_code": result.get("exit_code")}
    base: dict[str, Any] = {
        "request_id": call.request_id,
        "tool_call_id": call.tool_call_id,
        "run_id": run_id,
        "tool": call.tool,
        "status": status,
        "success": success,
        "output_bytes": int(result.get("output_bytes") or 0),
        "digest": result.get("digest") or "",
        "truncated": bool(result.get("truncated")) or cut_out or cut_err,
        "error_category": result.get("error_category"),
    }
    transparent = call.detail_mode == "transparent"
    data = {**base, "result": display} if transparent else base
    message, event = actor._event(
        "chat.tool_completed", data, now, summary_data("chat.tool_completed", data)
    )
    done = dataclasses.replace(
        call,
        status=status,
        run_id=run_id,
        success=success,
        output_bytes=base["output_bytes"],
        digest=base["digest"],
        truncated=base["truncated"],
        error_category=base["error_category"],
        result=display if transparent else None,
        completed_seq=message.seq,
        finished_at=now,
    )
    await asyncio.shield(
        actor._commit(WriteTx(events=[event], tool_calls=[done]), [(message, None)])
    )
    return {
        "tool": call.tool,
        "status": status,
        "success": success,
        "exit_code": result.get("exit_code"),
        "stdout": stdout,
        "stderr": stderr,
        "error_category": base["error_category"],
        "error": result.get("error"),
    }


def progress_message(
    actor: ConversationActor,
    request_id: str,
    tool_call_id: str,
    kind: str,
    text: str,
    gap: bool,
    call_seq: int,
    seq: int,
) -> Message:
    body = msgspec.json.encode(
        {
            "conversation_id": actor.id,
            "seq": seq,
            "cursor": actor.cursor(seq),
            "request_id": request_id,
            "tool_call_id": tool_call_id,
            "call_seq": call_seq,
            "kind": kind,
            "data": text,
            "gap": gap,
        }
    )
    return Message(
        "face.chat.tool.progress",
        body,
        kind=PROGRESS,
        conversation_id=actor.id,
        seq=seq,
        cursor=actor.cursor(seq),
        stream=tool_call_id,
    )
