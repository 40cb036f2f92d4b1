"""Every path argument of every ``halfpi`` subcommand takes a relative path
as well as an absolute one (``halfpi restore ../bk1 --home …`` once ended
in a traceback: a relative path cannot be a ``file:`` URI).

Each case runs the real command line from a working directory of its own
(``tmp_path/work``), once with every path relative to it and once absolute.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme

pytestmark = pytest.mark.e2e

FORMS = ("relative", "absolute")


class Place:
    """Paths under ``tmp_path``, spelt as the case's form asks, for commands
    run in ``tmp_path/work`` (a relative path climbs out of it: ``../x``)."""

    def __init__(self, root: Path, form: str) -> None:
        self.root = root
        self.work = root / "work"
        self.work.mkdir()
        self.form = form

    def __call__(self, name: str) -> str:
        return f"../{name}" if self.form == "relative" else str(self.root / name)

    def run(self, *args: str, stdin: str | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "halfpi.cli", *args], cwd=self.work,
                              capture_output=True, text=True, timeout=timeout, input=stdin,
                              stdin=None if stdin is not None else subprocess.DEVNULL)
        assert "Traceback" not in done.stderr, done.stderr
        return done


@pytest.fixture(params=FORMS)
def at(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    return Place(tmp_path, request.param)


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, (done.returncode, done.stderr)
    return done


# -- the credential commands, backup and restore: no Mind needed ------------------------


@pytest.mark.parametrize("command", [
    ("face", "add", "phone"), ("face", "list"), ("hand", "add", "pi"), ("hand", "list"),
])
def test_credential_commands_take_the_home_both_ways(at: Place,
                                                     command: tuple[str, ...]) -> None:
    ok(at.run(*command, "--home", at("home")))
    assert (at.root / "home" / "halfpi.db").is_file()


@pytest.mark.parametrize("kind", ["face", "hand"])
def test_revoke_takes_the_home_both_ways(at: Place, kind: str) -> None:
    ok(at.run(kind, "add", "gone", "--home", at("home")))
    ok(at.run(kind, "revoke", "gone", "--home", at("home")))
    assert "revoked" in ok(at.run(kind, "list", "--home", at("home"))).stdout


def test_a_sqlite_store_url_takes_a_relative_file(at: Place) -> None:
    store = "sqlite:../elsewhere.db" if at.form == "relative" else \
        f"sqlite:///{at.root / 'elsewhere.db'}"
    ok(at.run("face", "add", "phone", "--home", at("home"), "--store", store))
    assert (at.root / "elsewhere.db").is_file()


def test_backup_and_restore_take_their_folders_both_ways(at: Place) -> None:
    ok(at.run("face", "add", "phone", "--home", at("home")))
    ok(at.run("backup", at("bk1"), "--home", at("home")))
    assert (at.root / "bk1" / "halfpi.db").is_file()
    ok(at.run("restore", at("bk1"), "--home", at("restored")))
    listed = ok(at.run("face", "list", "--home", at("restored"))).stdout
    assert "phone" in listed


# -- the Mind's own path arguments ------------------------------------------------------


def tls_files(root: Path) -> None:
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1", "localhost")
    authority.cert_pem.write_to_path(str(root / "ca.pem"))
    for index, blob in enumerate(issued.cert_chain_pems):
        blob.write_to_path(str(root / "mind.crt"), append=index > 0)
    issued.private_key_pem.write_to_path(str(root / "mind.key"))


MIND_ARGS: dict[str, Callable[[Place], tuple[str, ...]]] = {
    "home": lambda at: (),
    "hand_root": lambda at: ("--hand-root", at("files")),
    "metrics_token_file": lambda at: ("--metrics-token-file", at("metrics.token")),
    "tls": lambda at: ("--tls-cert", at("mind.crt"), "--tls-key", at("mind.key")),
}


class RunningMind:
    def __init__(self, at: Place, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "halfpi.cli", "mind", "--port", "0", "--home", at("home"),
             *extra], cwd=at.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            assert self.proc.stderr is not None
            pytest.fail(f"the Mind did not start: {self.proc.stderr.read()[-2000:]}")
        self.ready = json.loads(line)

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        return err


@pytest.mark.parametrize("arg", sorted(MIND_ARGS))
def test_the_mind_takes_its_paths_both_ways(at: Place, arg: str) -> None:
    (at.root / "files").mkdir()
    (at.root / "metrics.token").write_text("hpm_" + "m" * 40 + "\n")
    tls_files(at.root)
    mind = RunningMind(at, *MIND_ARGS[arg](at))
    try:
        assert mind.ready["home"] == str(at.root / "home")  # said as a full path
        assert (at.root / "home" / "mind.json").is_file()
    finally:
        err = mind.stop()
    assert "Traceback" not in err, err


# -- a Face and a Hand dialling a Mind: --home, --token-file, --ca-file, --root ----------


def test_the_headless_face_takes_home_and_token_file_both_ways(at: Place) -> None:
    mind = RunningMind(at)
    try:
        token = (at.root / "home" / "face.token").read_text()
        (at.root / "my.token").write_text(token)
        chat = json.dumps({"type": "face.chat", "payload": {"content": "hello"}}) + "\n"
        done = ok(at.run("face", "--mode", "headless", "--home", at("home"),
                         "--token-file", at("my.token"), "--new-conversation", "paths",
                         "--connect-timeout", "20", stdin=chat))
        assert '"chat.completed"' in done.stdout, done.stdout
    finally:
        mind.stop()


def test_the_face_takes_a_ca_file_both_ways(at: Place) -> None:
    tls_files(at.root)
    mind = RunningMind(at, "--tls-cert", at("mind.crt"), "--tls-key", at("mind.key"))
    try:
        chat = json.dumps({"type": "face.chat", "payload": {"content": "hello"}}) + "\n"
        done = ok(at.run("face", "--mode", "headless", "--url", mind.ready["url"],
                         "--token-file", at("home/face.token"), "--ca-file", at("ca.pem"),
                         "--new-conversation", "paths", "--connect-timeout", "20", stdin=chat))
        assert '"chat.completed"' in done.stdout, done.stdout
    finally:
        mind.stop()


def test_a_hand_takes_token_file_root_and_ca_file_both_ways(at: Place) -> None:
    tls_files(at.root)
    (at.root / "files").mkdir()
    mind = RunningMind(at, "--tls-cert", at("mind.crt"), "--tls-key", at("mind.key"))
    hand: subprocess.Popen[str] | None = None
    try:
        added = ok(at.run("hand", "add", "pi", "--home", at("home")))
        (at.root / "pi.token").write_text(added.stdout)
        hand_url = mind.ready["url"].replace("/v1/face", "/v1/hand")
        hand = subprocess.Popen(
            [sys.executable, "-m", "halfpi.cli", "hand", "--mind", hand_url, "--id", "pi",
             "--token-file", at("pi.token"), "--root", at("files"), "--ca-file", at("ca.pem"),
             "--log-level", "debug"],
            cwd=at.work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert hand.stderr is not None
        give_up = threading.Timer(30, hand.kill)  # a Hand that never connects ends the loop
        give_up.start()
        try:
            for line in hand.stderr:  # its log says when the Mind welcomed it
                assert "Traceback" not in line, line
                if "connected to the Mind" in line:
                    break
            else:
                pytest.fail("the Hand ended without connecting")
        finally:
            give_up.cancel()
    finally:
        if hand is not None:
            hand.terminate()
            hand.communicate(timeout=30)
        mind.stop()
