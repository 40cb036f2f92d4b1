"""``halfpi`` on the command line, as a user meets it: real processes.

Every user error is one line on stderr starting ``halfpi: `` and a non-zero
exit (64 for a bad command line, 1 for anything else), never a traceback
(DESIGN §12). The Mind writes its address into its home so that a Face
given ``--home`` dials the port that Mind actually bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from halfpi.core.events import HandPage
from halfpi.face.client import FaceClient as SdkClient
from halfpi.face.client import Result as SdkResult
from tests.support.cli import hand_add
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e

EXIT_FAILURE, EXIT_USAGE = 1, 64


def halfpi(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
           timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "halfpi.cli", *args],
        capture_output=True, text=True, timeout=timeout, env=env,
        input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """The whole of stderr is one ``halfpi: …`` line naming ``words``."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("halfpi: "), line
    for word in words:
        assert word.lower() in line.lower(), (word, line)
    assert done.returncode == code, (done.returncode, line)
    return line


# -- a bad command line: exit 64 -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("mind", "--port", "99999"), ("--port", "99999", "0-65535")),
        (("mind", "--port", "-1"), ("--port", "-1", "0-65535")),
        (("mind", "--port", "http"), ("--port", "http")),
        (("mind", "--log-level", "nonsense"), ("--log-level", "nonsense", "warning")),
        (("mind", "--delta-ms", "-5"), ("--delta-ms", "-5")),
        (("mind", "--allow-origin", "example.com"), ("--allow-origin", "example.com")),
        (("mind", "--bogus"), ("--bogus",)),
        ((), ("mind", "face", "hand", "conformance")),
        (("mind", "--host", "0.0.0.0", "--port", "0"), ("0.0.0.0", "TLS", "--insecure")),
        (("face", "--mode", "headless", "--connect-timeout", "-1"), ("--connect-timeout",)),
        (("face", "--mode", "headless", "--retry-interrupted", "-2"), ("--retry-interrupted",)),
        (("face", "add"), ("label",)),
    ],
    ids=["port_too_big", "port_negative", "port_not_a_number", "log_level", "delta_ms",
         "origin_without_scheme", "unknown_option", "no_command",
         "non_loopback_without_tls", "connect_timeout",
         "retry_interrupted", "missing_label"],
)
def test_a_bad_command_line_is_one_line_and_exit_64(
    tmp_path: Path, args: tuple[str, ...], words: tuple[str, ...]
) -> None:
    done = halfpi(*args, "--home", str(tmp_path / "home")) if args else halfpi()
    one_line_error(done, EXIT_USAGE, *words)
    assert done.stdout == ""


def test_an_unknown_option_before_any_command_is_named() -> None:
    done = halfpi("--bogus")
    one_line_error(done, EXIT_USAGE, "unrecognized", "--bogus")
    assert "required" not in done.stderr


def test_port_in_use_is_one_line_naming_the_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = halfpi("mind", "--port", str(port), "--home", str(tmp_path / "home"))
    line = one_line_error(done, EXIT_FAILURE, f"127.0.0.1:{port}", "in use", "--port")
    assert "Errno" not in line
    assert not (tmp_path / "home" / "mind.json").exists()


def test_an_unknown_host_is_one_line(tmp_path: Path) -> None:
    done = halfpi("mind", "--host", "no-such-host.invalid", "--port", "0", "--insecure",
                  "--home", str(tmp_path / "home"))
    one_line_error(done, EXIT_FAILURE, "no-such-host.invalid", "--host")


@pytest.mark.parametrize(
    "command",
    [("mind", "--port", "0"), ("face", "add", "phone"), ("face", "list"), ("hand", "add", "pi"),
     ("hand", "--id", "pi", "--token", "hph_unused", "--mind", "ws://127.0.0.1:9/v1/hand")],
    ids=["mind", "face_add", "face_list", "hand_add", "hand"],
)
def test_a_home_under_a_file_is_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    done = halfpi(*command, "--home", str(afile / "home"))
    one_line_error(done, EXIT_FAILURE, str(afile), "not a directory")


@pytest.fixture
def immutable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody (root included) may write into."""
    path = tmp_path / "frozen"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(stat.S_IRUSR | stat.S_IXUSR)
        yield path
        path.chmod(stat.S_IRWXU)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root without chattr +i: cannot make a directory immutable")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.parametrize("below", [False, True], ids=["home_itself", "home_below_it"])
def test_an_unwritable_home_is_one_line(immutable_dir: Path, below: bool) -> None:
    home = immutable_dir / "home" if below else immutable_dir
    done = halfpi("mind", "--port", "0", "--home", str(home))
    one_line_error(done, EXIT_FAILURE, str(immutable_dir))


def test_a_home_whose_database_is_not_one_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "halfpi.db").write_bytes(b"this is not an SQLite database" * 100)
    done = halfpi("mind", "--port", "0", "--home", str(home))
    one_line_error(done, EXIT_FAILURE, str(home / "halfpi.db"))


# -- the address file (DESIGN §12) ------------------------------------------------------


def _interruptible() -> None:
    """In the child, before exec: Ctrl-C as a terminal delivers it. A child
    inherits its parent's blocked signals, and after a full suite the test
    process may run with SIGINT blocked or ignored (then the Face never hears
    it: the test waited 20 s in vain)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _face_env(tmp_path: Path) -> dict[str, str]:
    """No HALFPI_* from the caller, and a default home that is not the Mind's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALFPI_")}
    env["HOME"] = str(tmp_path / "elsewhere")
    return env


CHAT = json.dumps({"type": "face.chat", "payload": {"content": "found you"}}) + "\n"


def test_the_mind_writes_its_address_and_a_face_given_home_dials_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()  # --port 0: a port no default would guess
    try:
        address_file = home / "mind.json"
        address = json.loads(address_file.read_text())
        assert stat.S_IMODE(address_file.stat().st_mode) == 0o600
        assert address["pid"] == mind.proc.pid  # type: ignore[union-attr]
        assert address["face_url"] == f"ws://127.0.0.1:{mind.port}/v1/face" == mind.url
        assert address["hand_url"] == f"ws://127.0.0.1:{mind.port}/v1/hand"
        assert isinstance(address["started_at"], float)
        done = halfpi("face", "--mode", "headless", "--home", str(home),
                      "--new-conversation", "x", "--connect-timeout", "20",
                      env=_face_env(tmp_path), stdin=CHAT)
        assert done.returncode == 0, done.stderr
        results = [json.loads(line)["payload"] for line in done.stdout.splitlines()
                   if json.loads(line)["type"] == "face.result"]
        assert results[-1]["content"] == "found you"
        assert mind.terminate() == 0
        assert not address_file.exists()  # a clean exit takes its address with it
    finally:
        mind.kill()


def test_a_stale_address_file_is_ignored_with_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # No local Hand: its "connected" line may come at any time after the start.
    mind = MindProcess(home, extra_args=("--no-local-hand",)).start()
    try:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        # The URL is a live Mind's, but the pid that wrote it is gone: the
        # file proves nothing about who listens there now.
        (home / "mind.json").write_text(json.dumps(
            {"pid": dead.pid, "face_url": mind.url, "hand_url": "", "started_at": 0.0}))
        log_before = mind.log()
        done = halfpi("face", "--mode", "headless", "--home", str(home),
                      "--connect-timeout", "1", env=_face_env(tmp_path), stdin="")
        assert "Traceback" not in done.stderr
        first = done.stderr.splitlines()[0]
        assert first.startswith("halfpi: ") and str(home / "mind.json") in first, done.stderr
        assert f"pid {dead.pid}" in first and "not running" in first, first
        assert mind.url not in done.stderr
        assert done.returncode != 0
        assert mind.log() == log_before
    finally:
        mind.kill()


def test_face_url_flag_wins_over_the_address_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home).start()
    try:
        (home / "mind.json").write_text(json.dumps(
            {"pid": os.getpid(), "face_url": "ws://127.0.0.1:9/v1/face", "hand_url": "",
             "started_at": 0.0}))
        done = halfpi("face", "--mode", "headless", "--home", str(home), "--url", mind.url,
                      "--new-conversation", "x", env=_face_env(tmp_path), stdin=CHAT)
        assert done.returncode == 0, done.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            mind.kill()


def test_ctrl_c_on_a_waiting_headless_face_is_quiet(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "halfpi.cli", "face", "--mode", "headless",
         "--url", f"ws://127.0.0.1:{port}/v1/face", "--token", "hpf_x"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_face_env(tmp_path), preexec_fn=_interruptible,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # it says what it tries before we interrupt it
    assert first.startswith("halfpi: "), first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err, err
    assert proc.returncode == 130


async def test_a_hand_given_home_dials_the_mind_that_home_names(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, extra_args=("--no-local-hand",)).start()
    added = await hand_add(home, "pi")
    hand = subprocess.Popen(
        [sys.executable, "-m", "halfpi.cli", "hand", "--id", "pi", "--home", str(home)],
        env=dict(_face_env(tmp_path), HALFPI_HAND_TOKEN=added.token),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    face = await SdkClient(mind.url, mind.token).connect()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while True:  # poll the Mind's own view with a deadline
            listed = await face.request("face.hand.list")
            assert isinstance(listed, SdkResult) and isinstance(listed.data, HandPage)
            hands = listed.data.hands
            if any(h["hand_id"] == "pi" and h["connected"] for h in hands):
                break
            assert hand.poll() is None, hand.communicate()[1]
            assert loop.time() < deadline, hands
            await asyncio.sleep(0.05)
    finally:
        await face.close()
        hand.kill()
        hand.wait()
        mind.kill()


def test_the_listening_line_names_the_web_face_and_it_is_served_there(
    mind_proc: MindProcess,
) -> None:
    import httpx

    web = mind_proc.ready["web"]
    assert web == f"http://127.0.0.1:{mind_proc.port}/"
    page = httpx.get(web, timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
