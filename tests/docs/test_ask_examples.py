"""The ``examples/ask.sh`` examples of the docs, run against a real
``halfpi mind`` with the scripted agent, so what a newcomer types first
answers as shown.

In a ```sh block of docs/*.md or README.md, a line running
``examples/ask.sh`` is an example; the ``# `` lines right after it are its
output (a ``# (…)`` line is narration, not output). Other lines of the
block that write a file (``echo … > FILE``) are run first, in the folder
the Mind was started in, as the docs say. Blocks that start a Mind of
their own (a real model: docs/agent.md, "Models") are left to
tests/e2e/test_real_model.py.

A ```sh block that starts ``$ COMMAND`` running ``halfpi face --mode
headless`` is a transcript: the command runs, and every JSON line the
block shows must be printed, compared by ``type`` (and a ``face.event``'s
own ``type``), since the docs elide the rest with ``…``.

The Mind runs with ``--hand-approval exec_command=never`` (nobody is there
to allow the examples narrated "waits until another Face allows it") and
``--approval-ttl 2``: an example the docs show answering at once that
asks for approval instead expires in 2 s and fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.mind import MindProcess

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)
ASK = "examples/ask.sh"


@dataclass(frozen=True)
class Example:
    where: str  # page:line
    setup: tuple[str, ...]
    command: str
    output: tuple[str, ...]


def examples_in(page: Path) -> Iterator[Example]:
    text = page.read_text()
    for block in BLOCK.finditer(text):
        lines = block.group(1).splitlines()
        if not any(ASK in line for line in lines):
            continue
        if any(line.lstrip().startswith(("halfpi mind", "pip ")) for line in lines):
            continue  # a Mind with a model of its own
        first = text[: block.start(1)].count("\n") + 1
        setup = tuple(line for line in lines if line.startswith("echo ") and ">" in line)
        for index, line in enumerate(lines):
            if ASK not in line or line.startswith("#"):
                continue
            output: list[str] = []
            for after in lines[index + 1:]:
                if not after.startswith("# "):
                    break
                if not after.startswith("# ("):
                    output.append(after[2:])
            yield Example(f"{page.name}:{first + index}", setup, line, tuple(output))


EXAMPLES = [example for page in PAGES for example in examples_in(page)]


def test_the_docs_have_ask_examples_to_run() -> None:
    assert {e.where.split(":")[0] for e in EXAMPLES} >= {"agent.md", "README.md"}


@pytest.fixture(scope="module")
def mind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MindProcess]:
    home = tmp_path_factory.mktemp("docs") / "home"
    home.mkdir()
    process = MindProcess(home, extra_args=(
        "--hand-approval", "exec_command=never", "--approval-ttl", "2")).start()
    yield process
    process.kill()


@pytest.mark.e2e
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.where for e in EXAMPLES])
def test_an_ask_example_answers_as_the_docs_show(mind: MindProcess, example: Example) -> None:
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, HALFPI_HOME=str(mind.home), PATH=f"{bin_dir}:{os.environ['PATH']}")
    for line in example.setup:  # where the Mind was started: its local Hand's root
        subprocess.run(["bash", "-c", line], cwd=mind.home.parent, check=True, timeout=30)
    done = subprocess.run(["bash", "-c", example.command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (example.where, done.returncode, done.stderr)
    shown = [line.rstrip() for line in done.stdout.strip().splitlines()]
    if example.output:
        assert shown == list(example.output), (example.where, done.stdout)


# -- a transcript: `$ COMMAND` and the JSON lines it prints ------------------------------

PROMPT = re.compile(r"^\$ (.*?)$", re.MULTILINE)


@dataclass(frozen=True)
class Transcript:
    where: str
    command: str
    shown: tuple[tuple[str, str | None], ...]  # (type, its face.event's type) per line


def shape(line: str) -> tuple[str, str | None] | None:
    """A printed JSON line as (type, face.event's type); documented lines
    elide fields with ``…``, so only those two are read from them."""
    types = re.findall(r'"type":"([a-z_.]+)"', line)
    if not line.startswith('{"type":') or not types:
        return None
    return types[0], types[1] if types[0] == "face.event" and len(types) > 1 else None


def transcripts_in(page: Path) -> Iterator[Transcript]:
    text = page.read_text()
    for block in BLOCK.finditer(text):
        lines = block.group(1).splitlines()
        if not lines or not lines[0].startswith("$ ") or "halfpi face --mode headless" not in \
                block.group(1):
            continue
        command, rest = [lines[0][2:]], iter(lines[1:])
        for line in rest:  # a command continued with "\"
            if not command[-1].endswith("\\"):
                break
            command.append(line.strip())
        else:
            line = ""
        body = [line, *rest]
        shown = tuple(s for s in map(shape, body) if s is not None)
        where = f"{page.name}:{text[: block.start(1)].count(chr(10)) + 1}"
        yield Transcript(where, "\n".join(command), shown)


TRANSCRIPTS = [t for page in PAGES for t in transcripts_in(page)]


def test_the_docs_have_a_headless_transcript_to_run() -> None:
    assert any(t.where.startswith("faces.md") for t in TRANSCRIPTS)


@pytest.mark.e2e
@pytest.mark.parametrize("transcript", TRANSCRIPTS, ids=[t.where for t in TRANSCRIPTS])
def test_a_headless_transcript_prints_what_the_docs_show(mind: MindProcess,
                                                          transcript: Transcript) -> None:
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, HALFPI_HOME=str(mind.home), PATH=f"{bin_dir}:{os.environ['PATH']}")
    done = subprocess.run(["bash", "-c", transcript.command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (transcript.where, done.stderr)
    printed = [s for s in map(shape, done.stdout.replace('": ', '":').replace(", ", ",")
                              .splitlines()) if s is not None]
    missing = [s for s in transcript.shown if s not in printed]
    assert not missing, (transcript.where, missing, done.stdout[-2000:])
