"""The model provider: an OpenAI-compatible Chat Completions server (DESIGN §1.2).

One provider for OpenAI, vLLM, Ollama, llama.cpp's server, LM Studio and
OpenRouter: the official ``openai`` SDK's async client with a configurable
``base_url``, streaming. The loop of one chat:

1. The history from the Store within the context budget, the system prompt
   and the user's message (``completions.request_messages``).
2. A streamed request offering the tools of the conversation's Hand as
   JSON-Schema functions. Text becomes deltas as it arrives; tool-call
   fragments are assembled (``completions.ToolCallAssembler``).
3. The calls run one after the other through the Mind's own tool path
   (``ChatInput.call_tool``: policy, visibility, approvals, the Hand); each
   result goes back as a ``role: tool`` message with its ``tool_call_id``.
   Arguments that are not one JSON object, or a tool that was not offered,
   go back to the model as a tool error: nothing runs.
4. Again from 2, until the model answers without calling a tool, or the
   step limit (then the chat fails, ``step_limit``).

Failures (``completions.classify``): a 429, a 5xx, a connection that could
not be made or broke are retried with backoff — only while that request has
shown nothing; once text was shown the chat fails with it kept. A cancel
(the chat task cancelled) closes the provider's stream at once. The API key
lives in the client only: never logged, stored, or put in a reason a Face
reads (``completions.scrub``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import openai

from halfpi.agents.base import AgentFailed, ChatInput, Delta, Output, ToolSpec, Usage
from halfpi.agents.completions import (
    PROVIDER_ERROR,
    STEP_LIMIT,
    AnswerDecoder,
    Failure,
    StreamError,
    ToolCall,
    ToolCallAssembler,
    assistant_message,
    classify,
    function_tools,
    parse_arguments,
    refuses_unlisted,
    request_messages,
    scrub,
    tool_choice,
    tool_error,
    tool_result_content,
)
from halfpi.config import Config, ModelSettings
from halfpi.core.backoff import backoff

log = logging.getLogger("halfpi.agent")

OPENAI_URL = "https://api.openai.com/v1"
KEY_ENV = "OPENAI_API_KEY"
KEY_FILE = "openai.key"  # in the home, mode 0600
# Local servers need no key, but the SDK sends one: this one says so.
NO_KEY = "no-key"
RETRY_INITIAL_S = 0.5
RETRY_CAP_S = 8.0
RETRY_AFTER_CAP_S = 30.0
CONNECT_TIMEOUT_S = 10.0
CHECK_TIMEOUT_S = 5.0


class AgentConfigError(ValueError):
    """The provider cannot start as configured: one line that says why."""


def read_key(config: Config, settings: ModelSettings) -> str | None:
    """The API key: the key file named by ``--api-key-file`` or
    ``api_key_file`` (the preferred way: the key stays out of the Mind's
    environment, which its children inherit), else ``$OPENAI_API_KEY``,
    else HOME/openai.key. A key file must be readable by its owner only: one
    others may read is refused, never used. None when there is no key."""
    key = os.environ.get(KEY_ENV, "").strip()
    if key and not settings.api_key_file:
        return key
    path = Path(settings.api_key_file).expanduser() if settings.api_key_file else None
    if path is not None and not path.is_absolute():
        path = config.home / path
    path = path or config.home / KEY_FILE
    try:
        key = _read_key_file(path)
    except FileNotFoundError:
        if settings.api_key_file:
            raise AgentConfigError(f"the API key file {path} does not exist") from None
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise AgentConfigError(f"cannot read the API key file {path}: {why}") from None
    if not key:
        raise AgentConfigError(f"the API key file {path} is empty")
    return key


def _read_key_file(path: Path) -> str:
    """The key file's text, its mode checked on the very file read (one
    descriptor: no race between the check and the read). Refused with one
    line: a file others may use, and anything but a regular file — a pipe
    (``<(…)``) gives its key once, so the redaction of tool output, which
    reads the file again, would not know it (``O_NONBLOCK``: a FIFO without
    a writer is refused, never waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise AgentConfigError(
                f"the API key file {path} is not a regular file: write the key to a file, "
                "mode 0600"
            )
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AgentConfigError(f"the API key file {path} is readable by others "
                                   f"(mode {mode & 0o777:o}): chmod 600 it")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read().decode("utf-8").strip()
    finally:
        os.close(fd)


def from_config(config: Config) -> OpenAIAgent:
    """The provider as ``halfpi mind --agent openai`` configures it."""
    settings = config.model
    if settings is None or not settings.model:
        raise AgentConfigError(
            "--agent openai needs a model: --model NAME, or model = \"NAME\" under [openai] "
            f"in {config.home / 'agent.toml'}"
        )
    key = read_key(config, settings)
    if key is None and settings.base_url is None:
        raise AgentConfigError(
            f"no API key for {OPENAI_URL}: set {KEY_ENV}, or write the key to "
            f"{config.home / KEY_FILE} (chmod 600); a local server needs --base-url"
        )
    return OpenAIAgent(settings, key)


def where(base_url: str | None) -> str:
    """The server, for people: scheme, host and path, never a user or password."""
    parts = urlsplit(base_url or OPENAI_URL)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass(slots=True)
class _Step:
    """What one request of the loop produced."""

    text: list[str] = field(default_factory=list)
    calls: ToolCallAssembler = field(default_factory=ToolCallAssembler)
    finish: str | None = None


class _Broken(Exception):
    """The answer broke off: the connection failed mid-stream, the stream
    ended without a finish reason, or the server reported an error in it."""


class _Response(Protocol):
    """What is read of the HTTP client's response (the SDK's ``http_response``)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


def _body(response: _Response) -> AsyncIterator[bytes]:
    """The body's bytes as they come: raw when the server did not compress
    it (what model servers do with an event stream), which skips the HTTP
    client's decoder and re-chunker, a cost per chunk."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    return response.aiter_raw() if encoding in ("", "identity") else response.aiter_bytes()


async def _pump(chunks: AsyncIterator[bytes], answer: AnswerDecoder, ready: asyncio.Event) -> None:
    """Feeds the answer's bytes to ``answer`` as they arrive, setting
    ``ready`` after each piece and at the end. A transport failure while
    reading (the connection dropped, a read timed out) or an answer that is
    not a whole reply becomes :class:`_Broken`.

    The HTTP client hands over one piece per HTTP chunk (a chunk per model
    chunk, from most servers); the pieces of one network read come without
    the loop running in between, and are shown together once this task
    waits for the network again. At a person's pace a read brings one
    piece, and it is shown at once, before that wait: getting ready to wait
    for the network costs the HTTP client more than a token's whole way
    through the Mind (``waited``: the loop ran since the last piece, so this
    one starts a read; ``alone``: the read before it brought one piece).
    A fast stream's reads bring many: one delta each."""
    loop = asyncio.get_running_loop()
    waited = True
    pieces = 0  # of the current read

    def wake() -> None:
        nonlocal waited
        waited = True

    try:
        async for data in chunks:
            answer.feed(data)
            ready.set()
            if waited:
                alone, pieces, waited = pieces <= 1, 0, False
                if alone:
                    await asyncio.sleep(0)  # the reader shows it before the next wait
                loop.call_soon(wake)  # runs once this task waits again
            pieces += 1
    except openai.APIError:
        raise
    except StreamError as exc:
        raise _Broken(str(exc)) from None
    except Exception as exc:  # the HTTP client's own errors: only the stream broke
        raise _Broken(f"the connection broke mid-reply ({type(exc).__name__}: {exc})") from exc
    finally:
        ready.set()


# The model's way to start a background task (DESIGN §8): one of the Hand's
# tools, run on the Hand after this reply, outliving it.
START_TASK = ToolSpec(
    "start_task",
    "Run one of the other tools as a background task on the Hand (a build, a download, a "
    "long test run): returns at once with its task_id; the task's progress and its end "
    "appear in the conversation.",
    {
        "type": "object",
        "properties": {
            "tool": {"type": "string", "description": "the tool to run, e.g. exec_command"},
            "arguments": {"type": "object", "description": "that tool's arguments"},
        },
        "required": ["tool"],
    },
)


class OpenAIAgent:
    def __init__(
        self,
        settings: ModelSettings,
        api_key: str | None,
        *,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self._key = api_key or NO_KEY
        self.client = openai.AsyncOpenAI(
            api_key=self._key,
            base_url=settings.base_url or OPENAI_URL,
            # Our own retries: only while nothing was shown, on the Mind's terms.
            max_retries=0,
            timeout=openai.Timeout(settings.timeout_s, connect=CONNECT_TIMEOUT_S),
        )
        self.sleep = sleep  # between retries (tests pass their own)
        self.rng = rng

    def __repr__(self) -> str:  # never the key
        return f"OpenAIAgent(model={self.settings.model!r}, at={where(self.settings.base_url)})"

    async def aclose(self) -> None:
        await self.client.close()

    async def check(self) -> str | None:
        """A start-up look at the server: None if it answers and its model
        list does not refuse the model (``refuses_unlisted``), else one line
        saying what is wrong."""
        settings = self.settings
        try:
            page = await self.client.models.list(timeout=CHECK_TIMEOUT_S)
        except openai.APIError as exc:
            failure = self._failure(exc)
            return f"the model server at {where(settings.base_url)}: {failure.message}"
        names = [m.id for m in page.data]
        if refuses_unlisted(settings.model, [(m.id, m.owned_by) for m in page.data]):
            listed = ", ".join(names[:8]) + (" …" if len(names) > 8 else "")
            return (
                f"the model server at {where(settings.base_url)} does not list the model "
                f"{settings.model!r} (it lists {listed}); chats may fail with model_not_found"
            )
        return None

    # -- the loop -----------------------------------------------------------------------

    async def reply(self, chat: ChatInput) -> AsyncIterator[Output]:
        settings = self.settings
        offered = self._offered(chat.tools)
        history = await chat.history()
        messages, dropped = request_messages(
            settings.system_prompt, history, chat.content, settings.context_budget
        )
        if dropped:
            log.info(
                "chat %s: %d earlier message(s) left out to fit the context budget",
                chat.request_id,
                dropped,
            )
        said_last = ""  # the last character shown, to separate steps' texts
        for number in range(settings.step_limit):
            choice = settings.tool_choice if number == 0 else settings.later_tool_choice
            step = _Step()
            separate = bool(said_last) and not said_last.isspace()
            async for out in self._request(messages, offered, choice, step):
                if separate and type(out) is Delta:
                    separate = False
                    yield Delta("\n\n")
                yield out
            if step.text:
                said_last = step.text[-1][-1:] or said_last
            calls = step.calls.calls(number)
            if not calls:
                return
            messages.append(assistant_message("".join(step.text), calls))
            for call in calls:
                result = await self._run(chat, call, offered)
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "content": tool_result_content(result),
                    }
                )
        raise AgentFailed(
            f"the model was still calling tools after {settings.step_limit} steps", STEP_LIMIT
        )

    def _offered(self, tools: Sequence[ToolSpec]) -> list[ToolSpec]:
        """The Hand's tools the settings allow, and — when a Hand is there —
        ``start_task``, which runs one of them as a background task."""
        allowed = self.settings.tools
        offered = [t for t in tools if allowed is None or t.name in allowed]
        if tools and (allowed is None or START_TASK.name in allowed):
            offered.append(START_TASK)
        return offered

    async def _run(
        self, chat: ChatInput, call: ToolCall, offered: Sequence[ToolSpec]
    ) -> dict[str, Any]:
        """One call the model asked for, through the Mind's tool path; a call
        that cannot be made comes back as a tool error, nothing runs."""
        if not any(t.name == call.name for t in offered):
            names = ", ".join(t.name for t in offered) or "none"
            why = f"no tool {call.name!r} is offered (offered: {names})"
            return tool_error("unknown_tool", why)
        args = parse_arguments(call.arguments)
        if isinstance(args, str):
            return tool_error("bad_arguments", args)
        if call.name == START_TASK.name:  # admitted through the Mind's outbox (DESIGN §8)
            tool, arguments = args.get("tool"), args.get("arguments", {})
            if not isinstance(tool, str) or not isinstance(arguments, dict):
                return tool_error("bad_arguments", "start_task takes {tool: NAME, arguments: {…}}")
            return await chat.start_task(tool, arguments)
        return await chat.call_tool(call.name, args)

    def _params(
        self, messages: list[dict[str, Any]], offered: Sequence[ToolSpec], choice: str
    ) -> dict[str, Any]:
        settings = self.settings
        params: dict[str, Any] = {"model": settings.model, "messages": messages, "stream": True}
        if settings.stream_usage:
            params["stream_options"] = {"include_usage": True}
        if settings.temperature is not None:
            params["temperature"] = settings.temperature
        if settings.max_output_tokens is not None:
            params["max_tokens"] = settings.max_output_tokens
        forced = tool_choice(choice, offered)
        if forced is not None:
            params["tools"] = function_tools(offered)
            params["tool_choice"] = forced
        return params

    async def _request(
        self,
        messages: list[dict[str, Any]],
        offered: Sequence[ToolSpec],
        choice: str,
        step: _Step,
    ) -> AsyncIterator[Output]:
        """One request of the loop, streamed into ``step``; retried while the
        attempt showed nothing. Raises :class:`AgentFailed` when it fails."""
        params = self._params(messages, offered, choice)
        delays = backoff(RETRY_INITIAL_S, 2.0, RETRY_CAP_S, rng=self.rng)
        attempt = 0
        while True:
            try:
                async for out in self._attempt(params, step):
                    yield out
                return
            except (openai.APIError, _Broken) as exc:
                failure = self._failure(exc)
                if not failure.retryable or step.text or attempt >= self.settings.retries:
                    log.info("model request failed: %s", failure.message)
                    raise AgentFailed(failure.message, failure.code) from None
                attempt += 1
                delay = _retry_after(exc)
                delay = next(delays) if delay is None else delay
                log.info(
                    "model request failed (%s); retry %d in %.1f s",
                    failure.message,
                    attempt,
                    delay,
                )
                step.calls = ToolCallAssembler()  # a failed attempt's fragments are void
                await self.sleep(delay)

    async def _attempt(self, params: dict[str, Any], step: _Step) -> AsyncIterator[Output]:
        """One streamed request. The SDK sends it (base URL, key, status
        errors as its exceptions) and hands over the raw event stream, which
        is decoded here (``completions.AnswerDecoder``): the SDK's typed
        chunks would cost more per token than everything else the Mind does.

        A task of its own reads the stream while this generator yields: the
        chunks one network read brings (many, from a fast model) are decoded
        in one go and shown as one delta, so the Mind's work per token (a
        seq, the journal, each Face's frame) is paid once per read. A model
        at a person's pace sends a chunk per read: a delta per chunk, as
        soon as it comes."""
        completions = self.client.chat.completions.with_streaming_response
        # Leaving this block — at the end, on a failure, on a cancel — closes
        # the response: a cancelled reply costs no more tokens.
        async with completions.create(**params) as response:
            answer = AnswerDecoder(step.calls)
            ready = asyncio.Event()
            reader = asyncio.create_task(_pump(_body(response.http_response), answer, ready))
            try:
                ended = False
                while not ended:
                    await ready.wait()
                    ready.clear()
                    ended = reader.done()  # before the take: nothing is fed after it
                    text = answer.take_text()
                    if text:
                        step.text.append(text)
                        yield Delta(text)
                    if answer.usage:
                        for usage in answer.take_usage():
                            yield Usage(
                                usage.prompt_tokens or 0,
                                usage.completion_tokens or 0,
                                usage.total_tokens or 0,
                            )
                reader.result()  # the stream's failure, after the text it showed
            finally:
                if not reader.done():  # cancelled, or the caller went away
                    reader.cancel()
                    await asyncio.wait({reader})
                if not reader.cancelled():
                    reader.exception()  # raised above, or nobody is left to hear it
        step.finish = answer.finish
        if step.finish is None:
            raise _Broken("the model server ended the stream before the reply finished")
        if step.finish == "content_filter":
            raise AgentFailed("the provider's content filter stopped the reply", PROVIDER_ERROR)

    def _failure(self, exc: BaseException) -> Failure:
        secrets = (self._key,)
        if isinstance(exc, openai.APIStatusError):
            body = exc.body if isinstance(exc.body, dict) else {}
            message = body.get("message") if isinstance(body.get("message"), str) else None
            return classify(
                exc.status_code,
                message or exc.message,
                code=exc.code,
                secrets=secrets,
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__
            why = f"{exc.message} ({cause})" if cause is not None and str(cause) else exc.message
            return classify(None, why, secrets=secrets)
        what = exc.message if isinstance(exc, openai.APIError) else str(exc)
        return Failure(PROVIDER_ERROR, scrub(f"the model server failed: {what}", secrets), True)


def _retry_after(exc: BaseException) -> float | None:
    """The server's ``Retry-After`` (seconds), bounded; None without one."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    raw = exc.response.headers.get("retry-after")
    try:
        seconds = float(raw) if raw is not None else None
    except ValueError:
        return None
    return None if seconds is None else max(0.0, min(seconds, RETRY_AFTER_CAP_S))
