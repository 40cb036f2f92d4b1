"""The web face's Markdown renderer (``parseMarkdown`` / ``toDom`` in
``src/halfpi/web/app.js``), run in node with a recording document.

Why node and not a browser test page: the renderer is plain JavaScript with
the document passed in, so node runs every case in one process in well
under a second, each case is a named pytest test, and the recording
document shows every element and attribute the renderer creates — which is
the property under test (only allowed tags, only ``href``/``rel``/``target``
on links, text always as text nodes). The real browser is exercised by the
end-to-end tests (``tests/e2e/test_web.py``: a reply with ``<script>`` and
``<img onerror>`` shown as text in Chromium).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import halfpi.web
from tests.support import programs

APP = Path(halfpi.web.__file__).with_name("app.js")
RUNNER = Path(__file__).with_name("markdown_runner.mjs")
ALLOWED = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "code", "strong", "em", "a",
           "ul", "ol", "li", "blockquote", "hr", "br"}



@pytest.fixture(autouse=True)
def _node() -> None:
    programs.require("node")  # CI (HALFPI_NODE=required): the web face's tests must run


def render(*texts: str) -> list[dict[str, Any]]:
    run = subprocess.run(
        ["node", str(RUNNER), str(APP)], input=json.dumps(texts), capture_output=True,
        text=True, timeout=30, check=False,
    )
    assert run.returncode == 0, run.stderr
    return list(json.loads(run.stdout))


def dom(text: str) -> list[dict[str, Any]]:
    return list(render(text)[0]["dom"])


def elements(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for node in nodes:
        if "tag" in node:
            found.append(node)
            found.extend(elements(node["children"]))
    return found


def text_of(nodes: list[dict[str, Any]]) -> str:
    return "".join(n["text"] if "text" in n else text_of(n["children"]) for n in nodes)


HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    '<a href="javascript:alert(1)">x</a>',
    "**<iframe src=//evil>**",
    "```\n</code><script>alert(1)</script>\n```",
    '<svg onload="alert(1)">',
    "[a](http://x.test/\"onmouseover=\"alert(1))",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_markdown_creates_only_allowed_tags_and_no_event_attributes(text: str) -> None:
    for node in elements(dom(text)):
        assert node["tag"] in ALLOWED
        for name in node["attrs"]:
            assert name in {"href", "rel", "target"}, (text, node)
            assert not name.lower().startswith("on")


def test_raw_html_is_shown_as_its_own_text() -> None:
    text = '<script>alert(1)</script> and <img src=x onerror="alert(1)">'
    nodes = dom(text)
    assert [n["tag"] for n in elements(nodes)] == ["p"]
    assert text_of(nodes) == text


def test_only_http_and_https_links_become_links() -> None:
    rendered = render(
        "[a](https://example.org/x?y=1)", "[b](http://example.org)", "[c](javascript:alert(1))",
        "[d](/relative)", "[e](mailto:x@y.z)", "[f](data:text/html,hi)",
    )
    links = [[n for n in elements(r["dom"]) if n["tag"] == "a"] for r in rendered]
    assert [len(found) for found in links] == [1, 1, 0, 0, 0, 0]
    assert links[0][0]["attrs"] == {
        "href": "https://example.org/x?y=1", "rel": "noopener noreferrer", "target": "_blank",
    }
    assert text_of(rendered[2]["dom"]) == "[c](javascript:alert(1))"


def test_a_link_tree_with_a_bad_href_is_dropped_to_text_by_todom_too() -> None:
    # toDom checks again: a tree made by anything else cannot smuggle a scheme.
    nodes = render("[ok](https://example.org)")[0]["tree"]
    assert nodes[0]["c"][0]["href"] == "https://example.org/"


def test_emphasis_code_headings_lists_quotes_and_fences() -> None:
    nodes = dom(
        "# Title\n\nSome **bold**, *em*, `code` and snake_case_name.\n\n"
        "- one\n- two\n\n1. first\n2. second\n\n> quoted\n\n```\nx = <b>1</b>\n```\n\n---"
    )
    tags = [n["tag"] for n in nodes]
    assert tags == ["h1", "p", "ul", "ol", "blockquote", "pre", "hr"]
    para = nodes[1]
    assert [n["tag"] for n in elements(para["children"])] == ["strong", "em", "code"]
    assert "snake_case_name" in text_of([para])
    assert text_of([nodes[5]]) == "x = <b>1</b>"


def test_plain_text_keeps_its_words_and_line_breaks() -> None:
    nodes = dom("hello big world\nsecond line")
    text = {"text": "hello big world\nsecond line"}
    assert nodes == [{"tag": "p", "attrs": {}, "children": [text]}]


def test_an_unclosed_fence_keeps_the_rest_as_code() -> None:
    nodes = dom("```\n<script>\nstill code")
    assert [n["tag"] for n in nodes] == ["pre"]
    assert text_of(nodes) == "<script>\nstill code"
