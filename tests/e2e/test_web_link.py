"""``halfpi face link``: a one-time link to the running Mind's web face."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cli import halfpi_cli
from tests.support.mind import MindProcess
from tests.web.http import fetch, http_base


async def test_face_link_prints_the_running_minds_address_with_a_one_time_code(
    mind_proc: MindProcess,
) -> None:
    run = await halfpi_cli("face", "link", "--home", str(mind_proc.home), "--label", "tab")
    assert run.returncode == 0, run.stderr
    base = http_base(mind_proc.url)
    match = re.fullmatch(re.escape(base) + r"/#link=([A-Za-z0-9_-]{16,64})\n", run.stdout)
    assert match, run.stdout
    assert "'tab'" in run.stderr and "once" in run.stderr
    answer = await fetch(base + "/v1/web/link", "POST", {"code": match[1]})
    assert answer.status == 200
    assert answer.json()["label"] == "tab"


async def test_face_link_with_an_unknown_profile_is_one_line(tmp_path: Path) -> None:
    run = await halfpi_cli("face", "link", "--home", str(tmp_path / "h"), "--profile", "root")
    assert run.returncode == 64 and run.stdout == ""
    assert "invalid choice" in run.stderr
