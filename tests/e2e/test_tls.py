"""TLS: the Mind serves ``wss://`` itself; Faces and Hands verify it.

A real certificate from a throw-away CA (``trustme``); real processes. A
client that does not trust the CA is refused, plain ``ws://`` to the TLS
port fails cleanly, and the Mind refuses to listen beyond loopback without
TLS unless told ``--insecure``.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
import websockets

from halfpi.face.client import FaceClient as SdkClient
from tests.support.cli import halfpi_cli, hand_add
from tests.support.client import FaceClient
from tests.support.mind import MindProcess

pytestmark = pytest.mark.e2e


@dataclass(frozen=True)
class Tls:
    ca: Path
    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls(tmp_path: Path, authority: trustme.CA) -> Tls:
    issued = authority.issue_cert("127.0.0.1", "localhost")
    files = Tls(tmp_path / "ca.pem", tmp_path / "mind.crt", tmp_path / "mind.key")
    authority.cert_pem.write_to_path(str(files.ca))
    for index, blob in enumerate(issued.cert_chain_pems):
        blob.write_to_path(str(files.cert), append=index > 0)
    issued.private_key_pem.write_to_path(str(files.key))
    return files


@pytest.fixture
def tls_mind(tmp_path: Path, tls: Tls, server_kind: str) -> Iterator[MindProcess]:
    home = tmp_path / "home"
    home.mkdir()
    proc = MindProcess(home, extra_args=("--tls-cert", str(tls.cert), "--tls-key", str(tls.key)),
                       server=server_kind)
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


def write_secret(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
    return path


async def hands_connected(face: FaceClient, names: set[str], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        request_id = await face.command("face.hand.list")
        reply = await face.reply(request_id)
        connected = {h["hand_id"] for h in reply["payload"]["data"]["hands"] if h["connected"]}
        if names <= connected:
            return
        assert loop.time() < deadline, f"hands connected: {connected}"
        await asyncio.sleep(0.1)  # poll interval of a condition with a deadline


async def test_a_wss_face_and_a_wss_hand_work_end_to_end(
    tmp_path: Path, tls: Tls, tls_mind: MindProcess
) -> None:
    assert tls_mind.url.startswith("wss://127.0.0.1:")
    face = await FaceClient.connect(tls_mind.url, tls_mind.token, ssl=tls.context())
    assert face.welcome is not None
    cid = await face.create_conversation()

    added = await hand_add(tls_mind.home, "laptop")
    token_file = write_secret(tmp_path / "laptop.token", added.token)
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text("over tls\n")
    hand_url = tls_mind.url.replace("/v1/face", "/v1/hand")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALFPI_")}
    env["HALFPI_HOME"] = str(tmp_path / "hand-home")
    with open(tmp_path / "hand.log", "ab") as log:
        hand = subprocess.Popen(
            [sys.executable, "-m", "halfpi.cli", "hand", "--mind", hand_url, "--id", "laptop",
             "--token-file", str(token_file), "--ca-file", str(tls.ca)],
            env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )
    try:
        # The in-process local Hand dialled its own Mind over TLS too.
        await hands_connected(face, {"local", "laptop"})
        content = "/tool read_file " + json.dumps({"path": str(work / "note.txt"),
                                                   "hand": "laptop"})
        result = await face.chat_to_end(cid, content, "read-over-tls", timeout=30)
        assert result["payload"]["status"] == "succeeded", result
        assert "over tls" in result["payload"]["content"], result
    finally:
        hand.kill()
        hand.wait(10)
    assert "hph_" not in (tmp_path / "hand.log").read_text()
    await face.close()


async def test_the_sdk_takes_a_ca_path_or_a_context(tls: Tls, tls_mind: MindProcess) -> None:
    for trust in (str(tls.ca), tls.ca, tls.context()):
        client = SdkClient(tls_mind.url, tls_mind.token, ssl=trust)
        await client.connect(timeout=20)
        assert client.welcome.principal_id
        await client.close()


async def test_a_client_that_does_not_trust_the_ca_is_refused(tls_mind: MindProcess) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await websockets.connect(tls_mind.url, ssl=ssl.create_default_context(), open_timeout=10)


async def test_plain_ws_to_the_tls_port_fails_cleanly(
    tls: Tls, tls_mind: MindProcess
) -> None:
    plain = tls_mind.url.replace("wss://", "ws://")
    with pytest.raises((websockets.InvalidHandshake, OSError, EOFError)):
        await websockets.connect(plain, open_timeout=10)
    # The Mind serves on, and said nothing alarming about it.
    face = await FaceClient.connect(tls_mind.url, tls_mind.token, ssl=tls.context())
    assert face.welcome is not None
    await face.close()
    assert "Traceback" not in tls_mind.log()


async def test_mind_refuses_a_non_loopback_address_without_tls(tmp_path: Path) -> None:
    run = await halfpi_cli("mind", "--host", "0.0.0.0", "--port", "0", "--home",
                           str(tmp_path / "home"), timeout=30)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "TLS" in lines[0] and "--insecure" in lines[0], lines[0]
    assert "Traceback" not in run.stderr


def test_mind_listens_beyond_loopback_when_told_insecure(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = MindProcess(home, extra_args=("--host", "0.0.0.0", "--insecure", "--no-local-hand"))
    proc.start()
    try:
        assert proc.ready["url"].startswith("ws://")
    finally:
        proc.kill()


@pytest.mark.parametrize("case", ["cert_without_key", "unreadable_cert", "not_a_cert"])
async def test_bad_tls_arguments_are_one_clear_line(tmp_path: Path, tls: Tls, case: str) -> None:
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate\n")
    args = {
        "cert_without_key": ["--tls-cert", str(tls.cert)],
        "unreadable_cert": ["--tls-cert", str(tmp_path / "missing.crt"), "--tls-key",
                            str(tls.key)],
        "not_a_cert": ["--tls-cert", str(bogus), "--tls-key", str(tls.key)],
    }[case]
    run = await halfpi_cli("mind", "--port", "0", "--home", str(tmp_path / "home"), *args)
    assert run.returncode == 64, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("halfpi: "), run.stderr
