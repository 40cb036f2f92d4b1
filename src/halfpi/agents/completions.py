"""The rules of talking to an OpenAI-compatible Chat Completions server,
as plain functions with no I/O (docs/agent.md, "Models").

- :class:`EventStream` and :func:`decode_chunk`: the answer is a
  ``text/event-stream`` of ``data: {chunk}`` lines ending with ``data:
  [DONE]``; the parts of a chunk a chat needs, decoded with msgspec (the
  SDK's typed chunks cost more per token than the rest of the Mind: see
  docs/agent.md, "Why the raw stream"). :class:`AnswerDecoder` puts them
  together: the text of all the chunks one network read brought, as one.
- :class:`ToolCallAssembler`: streamed tool calls arrive in fragments (a
  call's id and name first, its JSON arguments in pieces, several calls
  interleaved by ``index``); it puts them together.
- :func:`parse_arguments`: a model's arguments are untrusted text; what is
  not one JSON object goes back to the model as a tool error.
- :func:`fit_history`: the context budget — which earlier messages a
  request carries, the oldest dropped first.
- :func:`classify`: a provider's failure as a stable ``error_code``, one
  line for people with no secret in it, and whether a retry may help.
- :func:`tool_result_content`: a tool's result as the ``role: tool``
  message the model reads, bounded.
- :func:`refuses_unlisted`: whether a server's model list says which
  model names it refuses (llama.cpp's does not).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from halfpi.agents.base import ToolSpec, Turn

# The ``error_code`` of a chat a provider failed (docs/protocol.md §12).
PROVIDER_ERROR = "provider_error"  # 429, 5xx, unreachable, a stream cut, anything else
CONTEXT_TOO_LONG = "context_too_long"  # the request is longer than the model's context
MODEL_NOT_FOUND = "model_not_found"  # the server does not serve that model
PROVIDER_UNAUTHORIZED = "provider_unauthorized"  # the key is missing, wrong or not allowed
STEP_LIMIT = "step_limit"  # the model still called tools after the last step

# What a model reads of one tool result, at most (the Faces get the whole
# display record; a model's context is small and paid for).
MAX_TOOL_RESULT_CHARS = 16_000
MAX_STDERR_CHARS = 4_000
MAX_REASON_CHARS = 300

# How many tokens a text costs, estimated without the model's tokenizer:
# about four characters per token for English and code, plus a few tokens
# of framing per message. An estimate: leave headroom in the budget.
CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


# -- the stream ---------------------------------------------------------------------

DONE = b"[DONE]"


class EventStream:
    """Server-sent events in (bytes as they arrive), the ``data`` of each
    complete event out. Comments and the other fields (``event:``, ``id:``,
    ``retry:``) carry nothing a chat needs; several ``data:`` lines of one
    event are joined with a newline (the SSE rule)."""

    def __init__(self) -> None:
        self._rest = b""
        self._data: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        if (
            not self._rest
            and data.startswith(b"data: ")
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
            and not self._data
        ):
            # One whole event of one line: what a read brings from a server
            # that sends each event as an HTTP chunk (most of them).
            return [data[6:-2]]
        buf = self._rest + data if self._rest else data
        if self._data or b"\r" in buf:
            events: list[bytes] = []
            self._rest = buf[self._lines(buf, events):]
            return events
        # What servers send: events of one ``data: `` line each, ``\n\n``
        # after each; split whole (one C call for a read of many events).
        *blocks, self._rest = buf.split(b"\n\n")
        events = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                events.append(block[6:])
            elif block:
                self._lines(block + b"\n\n", events)
        return events

    def _lines(self, buf: bytes, events: list[bytes]) -> int:
        """Line by line (several ``data:`` lines, other fields, ``\r\n``):
        the events of ``buf`` onto ``events``; returns where its last
        complete line ends."""
        start = 0
        while (end := buf.find(b"\n", start)) >= 0:
            line = buf[start:end]
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append(self._data[0] if len(self._data) == 1 else b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                self._data.append(line[6:] if line.startswith(b"data: ") else line[5:])
        return start


class FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: FunctionDelta | None = None


class MessageDelta(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class Choice(msgspec.Struct):
    index: int = 0
    delta: MessageDelta | None = None
    finish_reason: str | None = None


class TokenCounts(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


class Chunk(msgspec.Struct):
    """One ``chat.completion.chunk``: what a chat reads of it (the rest of
    its fields are ignored). ``error``: a server reporting a failure mid-stream."""

    choices: list[Choice] | None = None
    usage: TokenCounts | None = None
    error: Any = None


_chunk = msgspec.json.Decoder(Chunk).decode


def decode_chunk(data: bytes) -> Chunk:
    """One event's data as a :class:`Chunk`; ValueError when it is not one."""
    try:
        return _chunk(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"the model server sent something that is not a chunk ({exc})") from None


def stream_error(error: Any) -> str:
    """The message of an error a server reported mid-stream."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return str(error)


class StreamError(ValueError):
    """The answer says it is not a whole reply: something that is not a
    chunk, or an error the server reported mid-stream."""


class AnswerDecoder:
    """One streamed answer's bytes in, what a chat needs of them out: the
    text not yet taken, tool-call fragments (into ``calls``), token counts,
    the finish reason.

    The text of every chunk fed before :meth:`take_text` comes out as one
    string, so the chunks of one network read cost the Mind one delta, not
    one each (a fast model's chunks arrive many to a read). Chunks after
    ``[DONE]`` are ignored (the body is still read to its end: the
    connection is reused)."""

    __slots__ = ("_events", "_text", "calls", "done", "finish", "usage")

    def __init__(self, calls: ToolCallAssembler) -> None:
        self._events = EventStream()
        self._text: list[str] = []
        self.calls = calls
        self.usage: list[TokenCounts] = []
        self.finish: str | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        """Raises :class:`StreamError` when the answer is not a whole reply."""
        for event in self._events.feed(data):
            if self.done or event == DONE:
                self.done = True
                continue
            try:
                chunk = _chunk(event)
            except msgspec.DecodeError as exc:
                raise StreamError(
                    f"the model server sent something that is not a chunk ({exc})"
                ) from None
            if chunk.error is not None:
                raise StreamError(stream_error(chunk.error))
            if chunk.usage is not None:
                self.usage.append(chunk.usage)
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta
            if delta is not None:
                text = delta.content or delta.refusal
                if text:
                    self._text.append(text)
                if delta.tool_calls:
                    for fragment in delta.tool_calls:
                        function = fragment.function
                        self.calls.feed(
                            fragment.index,
                            fragment.id,
                            function.name if function is not None else None,
                            function.arguments if function is not None else None,
                        )
            if choice.finish_reason:
                self.finish = choice.finish_reason

    def take_text(self) -> str:
        """The text fed since the last take, as one string ("" if none)."""
        parts = self._text
        if not parts:
            return ""
        self._text = []
        return parts[0] if len(parts) == 1 else "".join(parts)

    def take_usage(self) -> list[TokenCounts]:
        usage, self.usage = self.usage, []
        return usage


# -- tool calls -------------------------------------------------------------------


@dataclass(slots=True)
class ToolCall:
    """One assembled call: ``id`` as the model named it (or one we made up
    when the server sent none), ``arguments`` the raw JSON text."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class _Pending:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class ToolCallAssembler:
    """Fragments in, calls out, in ``index`` order.

    OpenAI sends a call's ``id`` and ``name`` in its first fragment only and
    the arguments in pieces after it; some servers (llama-cpp-python) repeat
    the id and the whole name in every fragment. So: an id is kept once
    given; a name fragment equal to the name so far is a repeat, anything
    else continues it; argument fragments are appended."""

    def __init__(self) -> None:
        self._calls: dict[int, _Pending] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def feed(self, index: int, id: str | None, name: str | None, arguments: str | None) -> None:
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _Pending()
        if id and not call.id:
            call.id = id
        if name and name != call.name:
            call.name += name
        if arguments:
            call.arguments.append(arguments)

    def calls(self, step: int) -> list[ToolCall]:
        """The calls of step ``step``; a call the server gave no id gets
        ``call_<step>_<index>``, so its result can still be matched."""
        return [
            ToolCall(
                index,
                call.id or f"call_{step}_{index}",
                call.name,
                "".join(call.arguments),
            )
            for index, call in sorted(self._calls.items())
        ]


def parse_arguments(text: str) -> dict[str, Any] | str:
    """The arguments as a JSON object, or why they are not one (a line the
    model reads back). Empty text is an empty object (a call without
    arguments)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"the arguments are not valid JSON ({exc.msg} at character {exc.pos})"
    if not isinstance(value, dict):
        return f"the arguments must be a JSON object, not {type(value).__name__}"
    return value


def assistant_message(text: str, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """The model's own step, as the next request repeats it. ``content`` is a
    string even when empty: some servers refuse ``null`` next to tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ]
    return message


# ``owned_by`` of servers that answer any model name with the model they
# loaded: their ``/v1/models`` names that model, not the names they accept.
SERVES_ANY_NAME = frozenset({
    "llamacpp",  # llama.cpp's llama-server
    "me",  # llama-cpp-python's server
})


def refuses_unlisted(model: str, listed: Sequence[tuple[str, str | None]]) -> bool:
    """Whether a chat asking for ``model`` will fail ``model_not_found``
    because the server's list of (id, owned_by) does not name it: only a
    list that is authoritative says so — not an empty one, and not one
    from a server that serves its loaded model under any name."""
    if not listed or any(name == model for name, _ in listed):
        return False
    return not any(owner in SERVES_ANY_NAME for _, owner in listed)


def tool_result_content(result: dict[str, Any]) -> str:
    """A tool's result for the model: one JSON object with what it needs
    (status, exit code, output, why it failed), the output bounded."""
    out: dict[str, Any] = {"status": result.get("status", "failed")}
    if result.get("exit_code") is not None:
        out["exit_code"] = result["exit_code"]
    stdout = str(result.get("stdout") or "")
    stderr = str(result.get("stderr") or "")
    if stdout:
        out["stdout"] = stdout[:MAX_TOOL_RESULT_CHARS]
    if stderr:
        out["stderr"] = stderr[:MAX_STDERR_CHARS]
    if len(stdout) > MAX_TOOL_RESULT_CHARS or len(stderr) > MAX_STDERR_CHARS:
        out["truncated"] = True
    for key in ("error_category", "error", "task_id", "hand"):  # (a started task's)
        if result.get(key):
            out[key] = str(result[key])
    return json.dumps(out, ensure_ascii=False)


def tool_error(category: str, why: str) -> dict[str, Any]:
    """A call the agent refused before it reached the Mind (bad arguments,
    a tool it was not offered), as a result the model reads."""
    return {"status": "failed", "success": False, "error_category": category, "error": why}


def function_tools(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": s.name, "description": s.description, "parameters": s.parameters},
        }
        for s in specs
    ]


def tool_choice(choice: str, offered: Sequence[ToolSpec]) -> str | dict[str, Any] | None:
    """The request's ``tool_choice`` for a configured choice: ``auto``,
    ``none``, ``required``, or a tool's name (that tool is forced). None
    when no tool is offered (the field is left out)."""
    if not offered:
        return None
    if choice in ("auto", "none", "required"):
        return choice
    if any(s.name == choice for s in offered):
        return {"type": "function", "function": {"name": choice}}
    return "auto"  # a forced tool the Hand does not offer: let the model choose


# -- the context budget -------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE


def fit_history(history: Sequence[Turn], budget: int) -> tuple[list[Turn], int]:
    """The newest earlier messages that fit in ``budget`` estimated tokens,
    oldest first, and how many were dropped.

    A question whose reply is empty (it failed before saying anything) is
    left out with it: it taught the model nothing and would break the
    user/assistant alternation some chat templates insist on. Then whole
    exchanges are kept from the newest back while they fit, so the oldest
    go first; the kept part never starts with a reply."""
    turns: list[Turn] = []
    skipped = 0
    for turn in history:
        if turn.role == "assistant" and not turn.content:
            skipped += 1
            if turns and turns[-1].role == "user":
                turns.pop()
                skipped += 1
            continue
        turns.append(turn)
    kept: list[Turn] = []
    spent = 0
    for turn in reversed(turns):
        cost = estimate_tokens(turn.content)
        if spent + cost > budget:
            break
        kept.append(turn)
        spent += cost
    kept.reverse()
    while kept and kept[0].role != "user":
        kept.pop(0)
    return kept, skipped + len(turns) - len(kept)


def request_messages(
    system_prompt: str, history: Sequence[Turn], content: str, budget: int
) -> tuple[list[dict[str, Any]], int]:
    """The messages of a chat's first request — the system prompt, the
    history that fits, the user's message — and how many earlier messages
    the budget left out. The system prompt and the message itself are always
    sent (the provider says ``context_too_long`` if even they do not fit)."""
    fixed = estimate_tokens(content) + (estimate_tokens(system_prompt) if system_prompt else 0)
    kept, dropped = fit_history(history, max(0, budget - fixed))
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.extend({"role": t.role, "content": t.content} for t in kept)
    messages.append({"role": "user", "content": content})
    return messages, dropped


# -- failures --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failure:
    """A provider failure: the chat's ``error_code``, one line for people
    (no secret in it), and whether the same request may succeed later."""

    code: str
    message: str
    retryable: bool


_CONTEXT = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|exceed_context|too many tokens"
    r"|prompt is too long|input is too long",
    re.IGNORECASE,
)
_NO_MODEL = re.compile(
    r"model_not_found|not a valid model|(model|`[^`]*`|'[^']*').{0,40}(does not exist|not found)",
    re.IGNORECASE,
)
# Key-shaped strings a provider may echo back (``Incorrect API key provided: sk-ab…``).
_KEYS = re.compile(r"\b(sk|rk|pk|or|key)-[A-Za-z0-9_*\-.]{4,}", re.IGNORECASE)
_BEARER = re.compile(r"(bearer\s+)\S+", re.IGNORECASE)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """One line, at most MAX_REASON_CHARS, without the key or anything shaped
    like one (a Face and the log see this)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    text = _BEARER.sub(r"\1***", _KEYS.sub("***", text))
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 1] + "…"


def classify(
    status: int | None,
    message: str,
    *,
    code: str | None = None,
    secrets: Iterable[str] = (),
) -> Failure:
    """Map one failed request to a :class:`Failure`. ``status`` is the HTTP
    status, None when the server could not be reached or the stream broke;
    ``code`` the provider's own error code when it gave one."""
    said = scrub(message, secrets)
    hint = f"{code or ''} {message}"
    if status is None:
        return Failure(PROVIDER_ERROR, f"the model server could not be reached: {said}", True)
    if status in (401, 403):
        return Failure(PROVIDER_UNAUTHORIZED, f"the model server refused the key: {said}", False)
    if _CONTEXT.search(hint) and status in (400, 413, 422):
        return Failure(
            CONTEXT_TOO_LONG, f"the conversation is too long for the model: {said}", False
        )
    if (status == 404 and "model" in hint.lower()) or (status == 400 and _NO_MODEL.search(hint)):
        return Failure(MODEL_NOT_FOUND, f"the model server has no such model: {said}", False)
    if status == 404:
        return Failure(
            PROVIDER_ERROR,
            f"the model server answered 404 (is the base URL right? it usually ends in /v1): "
            f"{said}",
            False,
        )
    if status == 429:
        return Failure(PROVIDER_ERROR, f"the model server is rate limiting: {said}", True)
    if status in (408, 409) or status >= 500:
        return Failure(PROVIDER_ERROR, f"the model server failed ({status}): {said}", True)
    refused = f"the model server refused the request ({status}): {said}"
    return Failure(PROVIDER_ERROR, refused, False)
