"""``halfpi.logs``: JSON lines with the ids of what runs, and libraries
kept quiet at DEBUG (docs/operations.md, "Logs")."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest

from halfpi import logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in logs.QUIET}
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, was in levels.items():
        logging.getLogger(name).setLevel(was)


def test_debug_leaves_the_libraries_that_print_frames_and_bodies_at_warning(
    restore_logging: None,
) -> None:
    logs.configure("debug", "json")
    assert logging.getLogger("halfpi.mind").isEnabledFor(logging.DEBUG)
    for name in ("websockets.server", "websockets.client", "openai._base_client", "httpx",
                 "httpcore.http11", "uvicorn.error"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name


def test_a_json_line_names_the_ids_bound_where_it_runs_and_in_tasks_started_there() -> None:
    formatter = logs.JsonFormatter()

    def line(message: str, **extra: str) -> dict[str, str]:
        record = logging.LogRecord("halfpi.test", logging.INFO, __file__, 1, message, (), None)
        record.__dict__.update(extra)
        decoded: dict[str, str] = json.loads(formatter.format(record))
        return decoded

    async def main() -> None:
        token = logs.bind(conversation_id="c_1", request_id="r_1", run_id=None)
        try:
            async def in_task() -> dict[str, str]:
                logs.bind(run_id="run_1")
                return line("inside")

            inside = await asyncio.create_task(in_task())
            assert inside["conversation_id"] == "c_1" and inside["run_id"] == "run_1"
            outside = line("outside")
            assert outside == {**outside, "conversation_id": "c_1", "request_id": "r_1"}
            assert "run_id" not in outside  # the task's binding stayed in the task
        finally:
            logs.unbind(token)
        after = line("after", run_id="run_2")
        assert "conversation_id" not in after and after["run_id"] == "run_2"
        assert set(after) == {"ts", "level", "logger", "message", "run_id"}
        assert after["level"] == "info" and after["logger"] == "halfpi.test"

    asyncio.run(main())
