"""The ``halfpi face …`` credential commands, run as real processes.

Credentials are created and revoked by a process other than the Mind (the
CLI writes the store; the Mind notices by polling), which is exactly the
path a user takes, so tests go through it too. Run without blocking the
event loop: an in-process Mind in the same loop keeps serving meanwhile.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AddedFace:
    label: str
    token: str
    principal_id: str


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


async def halfpi_cli(*args: str, timeout: float = 30.0) -> CliRun:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "halfpi.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return CliRun(proc.returncode, out.decode(), err.decode())


async def face_add(home: Path, label: str, *extra: str) -> AddedFace:
    """``halfpi face add LABEL``: the token is the only line on stdout."""
    run = await halfpi_cli("face", "add", label, "--home", str(home), *extra)
    assert run.returncode == 0, run.stderr
    token = run.stdout.strip()
    principal = ""
    for line in run.stderr.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "principal_id":
            principal = value.strip()
    assert token and principal, (run.stdout, run.stderr)
    return AddedFace(label, token, principal)


async def face_revoke(home: Path, label: str) -> None:
    run = await halfpi_cli("face", "revoke", label, "--home", str(home))
    assert run.returncode == 0, run.stderr


@dataclass(frozen=True)
class AddedHand:
    label: str
    token: str
    principal_id: str


async def hand_add(home: Path, label: str) -> AddedHand:
    """``halfpi hand add LABEL``: the Hand token is the only line on stdout."""
    run = await halfpi_cli("hand", "add", label, "--home", str(home))
    assert run.returncode == 0, run.stderr
    token = run.stdout.strip()
    principal = ""
    for line in run.stderr.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "principal_id":
            principal = value.strip()
    assert token.startswith("hph_") and principal, (run.stdout, run.stderr)
    return AddedHand(label, token, principal)
