"""The native server's HTTP door (uvicorn, Starlette, the door's routes)
is built in the background right after the Mind says ``listening``, off
the event loop: the first HTTP request does not stall every Face's frames
while ~0.2 to 0.4 s of imports run (docs/performance.md, "Start-up")."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from tests.support.mind import MindProcess
from tests.support.wait import until

pytestmark = pytest.mark.e2e

# Notes, in the Mind's process, which thread first imports uvicorn.
_SITECUSTOMIZE = '''\
import sys, threading

class _Note:
    done = False

    def find_spec(self, name, path=None, target=None):
        if name == "uvicorn" and not _Note.done:
            _Note.done = True
            main = threading.current_thread() is threading.main_thread()
            with open({marker!r}, "w") as out:
                out.write("main" if main else "other")
        return None

sys.meta_path.insert(0, _Note())
'''


async def test_the_http_door_is_built_off_the_loop_without_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site, marker = tmp_path / "site", tmp_path / "uvicorn-imported"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(marker=str(marker)))
    monkeypatch.setenv("PYTHONPATH", str(site))
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        # No HTTP request was made: the door is being built anyway, by
        # another thread than the loop's.
        await until(lambda: marker.exists() and marker.read_text() != "", 20.0)
        assert marker.read_text() == "other", mind.log()
        url = f"http://127.0.0.1:{mind.port}/healthz"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200
    finally:
        assert mind.terminate() == 0, mind.log()
    assert "Traceback" not in mind.log()
