"""The Hand's token is taken out of its process listing (``/proc/<pid>/environ``
and ``cmdline``), where any process of the same user could read it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import Marks

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

TOKEN = "hph_" + "k" * 40

PROGRAM = """
import sys
from halfpi.hand.conceal import conceal
print("ready", flush=True)
sys.stdin.readline()
print(conceal(sys.argv[2]), flush=True)
sys.stdin.readline()
"""


def listing(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes() + Path(f"/proc/{pid}/cmdline").read_bytes()


def test_conceal_overwrites_the_token_in_environ_and_cmdline(marks: Marks) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, "--token", TOKEN],
        env=marks.env("hand") | {"HALFPI_HAND_TOKEN": TOKEN},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert listing(proc.pid).count(TOKEN.encode()) == 2  # readable before
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "2"
        after = listing(proc.pid)
        assert TOKEN.encode() not in after
        assert b"HALFPI_HAND_TOKEN=" + b"*" * len(TOKEN) in after
    finally:
        proc.kill()
        proc.wait()
