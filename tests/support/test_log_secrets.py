"""The log check finds what it looks for (tests/support/log_secrets.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.support.log_secrets import leaks, log_lines, secrets_under


def test_a_token_or_ticket_in_a_line_is_a_leak_whoever_made_it() -> None:
    lines = ["ok: chat c-1 succeeded",
             "hello from hpf_" + "A" * 43,
             "ticket=hps_abcdefghijklmnopqrstuvwxyz012",
             "hand hph_" + "x-y_" * 8]
    assert leaks(lines, set()) == lines[1:]


def test_a_short_prefix_is_not_a_token() -> None:
    assert leaks(["refused: token does not start with hpf_ or hph_"], set()) == []


def test_the_stream_key_and_token_files_of_a_home_are_secrets() -> None:
    # Outside the session's folders: the session-wide check would find these.
    with tempfile.TemporaryDirectory() as folder:
        check_a_home_with_leaks(Path(folder))


def check_a_home_with_leaks(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    key = bytes(range(32))
    (home / "stream.key").write_bytes(key)
    (home / "face.token").write_text("a-token-in-a-file-0123456789\n")
    (home / "mind.log").write_text(f"key {key.hex()}\nfine\ntoken a-token-in-a-file-0123456789\n")
    secrets = secrets_under(tmp_path)
    assert key.hex() in secrets and "a-token-in-a-file-0123456789" in secrets
    assert leaks(log_lines(tmp_path), secrets) == [
        f"mind.log: key {key.hex()}", "mind.log: token a-token-in-a-file-0123456789"]


def test_an_empty_or_short_token_file_is_no_secret(tmp_path: Path) -> None:
    (tmp_path / "empty.token").write_bytes(b"")
    (tmp_path / "short.token").write_text("x\n")
    assert secrets_under(tmp_path) == set()

