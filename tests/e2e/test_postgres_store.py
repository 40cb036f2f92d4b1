"""``halfpi mind --store postgresql://…``: a single node on PostgreSQL, end
to end. A real Mind process chats through a real PostgreSQL, its truth
outlives the process, and ``halfpi face add|list|revoke --store
postgresql://…`` manage the credentials it serves from another process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import face_add, halfpi_cli
from tests.support.client import FaceClient
from tests.support.mind import MindProcess
from tests.support.postgres import pg_url  # noqa: F401  (a fixture)

pytestmark = pytest.mark.e2e


def status_of(listing: str, label: str) -> str | None:
    """A label's status column in ``halfpi face list``."""
    for line in listing.splitlines()[1:]:
        columns = line.split()
        if columns[0] == label:
            return columns[2]
    return None


@pytest.fixture
def pg_mind(tmp_path: Path, pg_url: str) -> Iterator[MindProcess]:  # noqa: F811
    home = tmp_path / "home"
    home.mkdir()
    proc = MindProcess(home, extra_args=("--store", pg_url))
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


async def test_a_mind_on_postgresql_chats_and_its_history_outlives_the_process(
    pg_mind: MindProcess,
    pg_url: str,  # noqa: F811
) -> None:
    face = await FaceClient.connect(pg_mind.url, pg_mind.token)
    cid = await face.create_conversation("on postgres")
    result = await face.chat_to_end(cid, "hello postgres", "q-pg-1")
    assert result["payload"]["status"] == "succeeded", result
    assert result["payload"]["content"] == "hello postgres"
    await face.close()

    pg_mind.restart()  # kill -9, then a new process on the same database
    again = await FaceClient.connect(pg_mind.url, pg_mind.token)
    request_id = await again.command("face.conversation.list")
    listed = await again.reply(request_id)
    assert cid in [c["id"] for c in listed["payload"]["data"]["conversations"]]
    # The same request retried after the restart is the same admission (I5).
    replayed = await again.chat_to_end(cid, "hello postgres", "q-pg-1")
    assert replayed["payload"]["status"] == "succeeded"
    assert replayed["payload"]["content"] == "hello postgres"
    later = await again.chat_to_end(cid, "and again", "q-pg-2")
    assert later["payload"]["content"] == "and again"
    await again.close()


async def test_face_add_list_revoke_work_on_postgresql_while_the_mind_serves(
    pg_mind: MindProcess,
    pg_url: str,  # noqa: F811
) -> None:
    added = await face_add(pg_mind.home, "phone", "--store", pg_url)
    phone = await FaceClient.connect(pg_mind.url, added.token)
    assert phone.welcome is not None
    assert phone.welcome["payload"]["principal_id"] == added.principal_id

    listed = await halfpi_cli("face", "list", "--home", str(pg_mind.home), "--store", pg_url)
    assert listed.returncode == 0, listed.stderr
    assert status_of(listed.stdout, "phone") == "live", listed

    closing = asyncio.create_task(phone.closed_with(10))
    revoked = await halfpi_cli(
        "face", "revoke", "phone", "--home", str(pg_mind.home), "--store", pg_url
    )
    assert revoked.returncode == 0, revoked.stderr
    assert await closing == 4003  # the Mind saw the version move in PostgreSQL

    gone = await halfpi_cli("face", "list", "--home", str(pg_mind.home), "--store", pg_url)
    assert status_of(gone.stdout, "phone") == "revoked", gone


@pytest.mark.parametrize(
    "command",
    [("mind", "--port", "0"), ("face", "add", "phone"), ("face", "list"), ("hand", "revoke", "pi")],
    ids=["mind", "face_add", "face_list", "hand_revoke"],
)
async def test_an_unreachable_postgresql_is_one_line_without_the_password(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    url = "postgresql://me:secret@127.0.0.1:1/halfpi"  # nothing listens on port 1
    run = await halfpi_cli(*command, "--home", str(tmp_path), "--store", url)
    assert run.returncode == 1, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("halfpi: "), run.stderr
    assert "127.0.0.1:1/halfpi" in lines[0]
    assert "secret" not in run.stderr + run.stdout
