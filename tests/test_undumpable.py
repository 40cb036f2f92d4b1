"""The Mind makes itself non-dumpable (issue 23): its commands cannot read
its ``/proc`` entries (tests/e2e/test_hand_process_tree.py proves it end to
end)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")


def test_make_undumpable_makes_the_process_non_dumpable() -> None:
    code = ("from halfpi.undumpable import is_dumpable, make_undumpable; "
            "before = is_dumpable(); made = make_undumpable(); print(before, made, is_dumpable())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False"]
