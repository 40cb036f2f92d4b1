"""A Mind stopped the moment it says it listens still drains and exits 0:
its SIGTERM handler is in place before the ``listening`` line is written."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e


def test_a_sigterm_right_after_listening_drains_and_exits_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home)
    for _ in range(8):  # the race was lost about one start in two
        mind.start()
        assert mind.proc is not None
        mind.proc.send_signal(signal.SIGTERM)  # at once: no request, no wait
        assert mind.proc.wait(20) == 0, mind.log()
        assert mind.log().rstrip().endswith("stopped"), mind.log()
