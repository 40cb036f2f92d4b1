"""The headless face in a shell pipeline, with the Mind restarted mid-reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.mind import MindProcess

ROOT = Path(__file__).resolve().parents[2]
ASK = ROOT / "examples" / "ask.sh"


def _env(home: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, HALFPI_HOME=str(home), PATH=f"{bin_dir}:{os.environ['PATH']}")


class FifoLog:
    """Reads the pipeline's exchange log through a FIFO as it is written, so
    the test reacts to a line the moment it exists (no polling)."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.lines: list[dict] = []  # type: ignore[type-arg]
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with open(self.path) as fifo:
            for line in fifo:
                with self._cond:
                    self.lines.append(json.loads(line))
                    self._cond.notify_all()

    def wait_for(self, predicate, timeout: float) -> dict:  # type: ignore[no-untyped-def,type-arg]
        with self._cond:
            found = self._cond.wait_for(
                lambda: next((m for m in self.lines if predicate(m)), None), timeout
            )
        if found is None:
            raise TimeoutError("no matching line")
        return found

    def close(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)


@pytest.mark.e2e
def test_pipeline_prints_the_final_answer(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        done = subprocess.run(
            [str(ASK), "hello from a pipeline", "--url", mind.url],
            env=_env(home), capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "hello from a pipeline\n"
    finally:
        mind.kill()


@pytest.mark.e2e
def test_pipeline_survives_a_mind_restart_mid_reply(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "exchange.jsonl"
    fifo = FifoLog(log)
    mind = MindProcess(home).start()
    words = " ".join(f"w{i}" for i in range(12))
    try:
        pipeline = subprocess.Popen(
            [str(ASK), f"/pace 150 {words}", "--url", mind.url],
            env=dict(_env(home), HALFPI_ASK_LOG=str(log)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        fifo.wait_for(lambda m: m["type"] == "face.chat.delta", timeout=30)
        mind.restart()  # kill -9, then start again on the same port and home
        out, err = pipeline.communicate(timeout=60)
        assert pipeline.returncode == 0, err
        assert out == words + "\n"
        fifo.close()
        lines = fifo.lines
        # Every line is a protocol message; the first ask ended interrupted
        # (I11: not re-run by the Mind), and the script asked again explicitly.
        assert all(set(m) == {"type", "payload"} for m in lines)
        results = [m["payload"] for m in lines if m["type"] == "face.result"
                   and "content" in m["payload"]]
        assert [r["status"] for r in results] == ["interrupted", "succeeded"]
        assert results[0]["request_id"] != results[1]["request_id"]
        states = [m["payload"]["state"] for m in lines if m["type"] == "face.status"]
        assert "reconnecting" in states
    finally:
        mind.kill()
