"""``halfpi face|hand add|list|revoke`` as a user meets them: real processes
on a real store, their output and exit status pinned (docs/operations.md,
"Credentials"), and every store problem one ``halfpi:`` line."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from tests.support.cli import CliRun, halfpi_cli

pytestmark = pytest.mark.e2e

EXIT_FAILURE, EXIT_USAGE = 1, 64

HEADER = f"{'LABEL':<20} {'PROFILE':<9} {'STATE':<8} {'PRINCIPAL':<34} SCOPES"
OPERATOR_SCOPES = (
    "face:chat face:hands:read face:runs:write face:sessions:read face:sessions:write"
    " face:tasks:read"
)


def one_line_error(run: CliRun, code: int, *words: str) -> str:
    """The whole of stderr is one ``halfpi: …`` line naming ``words``."""
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    line = lines[0]
    assert line.startswith("halfpi: "), line
    for word in words:
        assert word.lower() in line.lower(), (word, line)
    assert run.returncode == code, (run.returncode, line)
    return line


def details(run: CliRun) -> dict[str, str]:
    found = {}
    for line in run.stderr.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("token"):
            found[key] = value.strip()
    return found


async def test_face_add_prints_the_token_alone_on_stdout_and_the_details_on_stderr(
    tmp_path: Path,
) -> None:
    run = await halfpi_cli("face", "add", "phone", "--home", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"hpf_[A-Za-z0-9_-]{43}\n", run.stdout), run.stdout
    lines = run.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "label", "principal_id", "profile", "scopes", "token (shown once, store it now)",
    ]
    assert details(run) == {
        "label": "phone",
        "principal_id": details(run)["principal_id"],
        "profile": "operator",
        "scopes": OPERATOR_SCOPES,
    }
    assert re.fullmatch(r"p_[0-9a-f]{28}", details(run)["principal_id"])


async def test_hand_add_prints_the_token_alone_on_stdout(tmp_path: Path) -> None:
    run = await halfpi_cli("hand", "add", "pi", "--home", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(r"hph_[A-Za-z0-9_-]{43}\n", run.stdout), run.stdout
    assert [line.split(":")[0] for line in run.stderr.splitlines()] == [
        "hand", "principal_id", "token (shown once, store it now)",
    ]
    assert details(run)["hand"] == "pi"


@pytest.mark.parametrize("kind", ["face", "hand"])
async def test_a_live_label_cannot_be_added_twice(tmp_path: Path, kind: str) -> None:
    assert (await halfpi_cli(kind, "add", "box", "--home", str(tmp_path))).returncode == 0
    again = await halfpi_cli(kind, "add", "box", "--home", str(tmp_path))
    line = one_line_error(again, EXIT_FAILURE)
    assert line == f"halfpi: a live {kind} credential labelled 'box' already exists"
    assert again.stdout == ""


async def test_list_shows_each_kind_live_and_revoked_never_a_token(tmp_path: Path) -> None:
    home = str(tmp_path)
    phone = await halfpi_cli("face", "add", "phone", "--home", home)
    wall = await halfpi_cli("face", "add", "wall", "--profile", "observer", "--home", home)
    pi = await halfpi_cli("hand", "add", "pi", "--home", home)
    revoked = await halfpi_cli("face", "revoke", "phone", "--home", home)
    assert revoked.returncode == 0
    faces = await halfpi_cli("face", "list", "--home", home)
    assert (faces.returncode, faces.stderr) == (0, "")
    assert faces.stdout.splitlines() == [
        HEADER,
        f"{'phone':<20} {'operator':<9} {'revoked':<8} {details(phone)['principal_id']:<34} "
        + OPERATOR_SCOPES.replace(" ", ","),
        f"{'wall':<20} {'observer':<9} {'live':<8} {details(wall)['principal_id']:<34} "
        "face:hands:read,face:sessions:read,face:tasks:read",
    ]
    hands = await halfpi_cli("hand", "list", "--home", home)
    assert (hands.returncode, hands.stderr) == (0, "")
    assert hands.stdout.splitlines() == [
        HEADER,
        f"{'pi':<20} {'hand':<9} {'live':<8} {details(pi)['principal_id']:<34} ",
    ]
    for token in (phone.stdout, wall.stdout, pi.stdout):
        assert token.strip() not in faces.stdout + hands.stdout


@pytest.mark.parametrize("kind", ["face", "hand"])
async def test_revoke_says_so_once_then_finds_no_live_credential(
    tmp_path: Path, kind: str
) -> None:
    home = str(tmp_path)
    assert (await halfpi_cli(kind, "add", "box", "--home", home)).returncode == 0
    first = await halfpi_cli(kind, "revoke", "box", "--home", home)
    assert (first.returncode, first.stdout) == (0, "")
    assert first.stderr == "revoked box; its live connections close within a second\n"
    again = await halfpi_cli(kind, "revoke", "box", "--home", home)
    assert one_line_error(again, EXIT_FAILURE) == (
        f"halfpi: no live {kind} credential labelled 'box'"
    )
    # The label is free again, under a new principal.
    readded = await halfpi_cli(kind, "add", "box", "--home", home)
    assert readded.returncode == 0, readded.stderr


CREDENTIAL_COMMANDS = [
    ("face", "add", "phone"), ("face", "list"), ("face", "revoke", "phone"),
    ("hand", "add", "pi"), ("hand", "list"), ("hand", "revoke", "pi"),
]
COMMAND_IDS = ["_".join(c[:2]) for c in CREDENTIAL_COMMANDS]


@pytest.mark.parametrize("command", CREDENTIAL_COMMANDS, ids=COMMAND_IDS)
async def test_a_database_that_is_not_one_is_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    (tmp_path / "halfpi.db").write_bytes(b"this is not an SQLite database" * 100)
    run = await halfpi_cli(*command, "--home", str(tmp_path))
    line = one_line_error(run, EXIT_FAILURE, str(tmp_path / "halfpi.db"))
    assert "cannot open the database" in line
    assert run.stdout == ""


def newer_database(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE future (x)")
    conn.execute("PRAGMA user_version = 999")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("command", CREDENTIAL_COMMANDS, ids=COMMAND_IDS)
async def test_a_database_of_a_newer_halfpi_is_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    newer_database(tmp_path / "halfpi.db")
    run = await halfpi_cli(*command, "--home", str(tmp_path))
    one_line_error(run, EXIT_FAILURE, str(tmp_path / "halfpi.db"), "schema version 999", "newer")


async def test_the_mind_on_a_database_of_a_newer_halfpi_is_one_line(tmp_path: Path) -> None:
    newer_database(tmp_path / "halfpi.db")
    run = await halfpi_cli("mind", "--port", "0", "--home", str(tmp_path))
    one_line_error(run, EXIT_FAILURE, str(tmp_path / "halfpi.db"), "schema version 999", "newer")
    assert run.stdout == ""


# -- --store: where the credentials live (docs/operations.md, "The store") ---------------


async def test_store_flag_names_the_database_the_commands_use(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "data" / "minds.db"
    url = f"sqlite://{elsewhere}"
    added = await halfpi_cli("face", "add", "phone", "--home", str(home), "--store", url)
    assert added.returncode == 0, added.stderr
    assert elsewhere.exists()
    assert not (home / "halfpi.db").exists()
    there = await halfpi_cli("face", "list", "--home", str(home), "--store", url)
    assert "phone" in there.stdout
    default = await halfpi_cli("face", "list", "--home", str(home))
    assert default.stdout.splitlines() == [HEADER]


@pytest.mark.parametrize("url", ["mysql://db/halfpi", "/just/a/path.db", "sqlite://host/x.db"])
async def test_a_store_url_this_halfpi_cannot_use_is_refused_with_one_line(
    tmp_path: Path, url: str
) -> None:
    run = await halfpi_cli("face", "list", "--home", str(tmp_path), "--store", url)
    one_line_error(run, EXIT_USAGE, "--store", "sqlite:///")
