"""The Mind serves the web face at ``/`` with headers that keep a page of
untrusted text safe, and a one-time link signs a browser in (both servers)."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import halfpi.web
from halfpi.mind.links import LINK_DIR, create_link
from tests.support.mind import LocalMind, local_mind
from tests.web.http import fetch, http_base

WEB = Path(halfpi.web.__file__).parent


@pytest.fixture(params=["native", "asgi"])
async def lmind(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[LocalMind]:
    async with local_mind(tmp_path / "home", server=request.param) as m:
        yield m


@pytest.mark.parametrize("path", ["/", "/web/app.js", "/web/app.css"])
async def test_the_page_and_its_assets_carry_a_strict_content_security_policy(
    lmind: LocalMind, path: str
) -> None:
    answer = await fetch(http_base(lmind.url) + path)
    assert answer.status == 200
    csp = answer.headers["content-security-policy"]
    assert "default-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "no-referrer"
    assert answer.headers["x-frame-options"] == "DENY"
    assert answer.body == (WEB / {"/": "index.html", "/web/app.js": "app.js",
                                  "/web/app.css": "app.css"}[path]).read_bytes()


def test_the_page_has_no_inline_script_or_style_and_the_script_never_parses_html() -> None:
    html = (WEB / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", html) == ['<script type="module" src="web/app.js">']
    assert " style=" not in html and "<style" not in html
    assert not re.search(r"\son[a-z]+=", html)
    script = (WEB / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "DOMParser", "createContextualFragment"):
        assert sink not in script, sink


async def test_a_link_signs_a_browser_in_once_with_a_new_credential(lmind: LocalMind) -> None:
    home = lmind.config.home
    code = create_link(home, "tablet", "operator", time.time())
    assert code not in "".join(p.read_text() for p in (home / LINK_DIR).iterdir())
    base = http_base(lmind.url)
    first = await fetch(base + "/v1/web/link", "POST", {"code": code})
    assert first.status == 200, first.body
    redeemed = first.json()
    assert redeemed["label"] == "tablet"
    assert redeemed["token"].startswith("hpf_") and redeemed["token"] != lmind.token
    assert first.headers["cache-control"] == "no-store"
    reads = await fetch(base + "/v1/conversations", token=redeemed["token"])
    assert reads.status == 200, reads.body
    again = await fetch(base + "/v1/web/link", "POST", {"code": code})
    assert again.status == 401
    assert again.json()["error"]["code"] == "unauthorized"
    assert list((home / LINK_DIR).iterdir()) == []


async def test_an_expired_link_is_refused_and_used_up(lmind: LocalMind) -> None:
    code = create_link(lmind.config.home, "old", "operator", time.time() - 600)
    answer = await fetch(http_base(lmind.url) + "/v1/web/link", "POST", {"code": code})
    assert answer.status == 401
    assert "expired" in answer.json()["error"]["message"]
    assert list((lmind.config.home / LINK_DIR).iterdir()) == []


async def test_a_link_posted_from_another_origin_is_refused_and_stays_usable(
    lmind: LocalMind,
) -> None:
    code = create_link(lmind.config.home, "x", "operator", time.time())
    url = http_base(lmind.url) + "/v1/web/link"
    answer = await fetch(url, "POST", {"code": code}, headers={"Origin": "http://evil.test"})
    assert answer.status == 403
    assert (await fetch(url, "POST", {"code": code})).status == 200


@pytest.mark.parametrize("body", [{}, {"code": "short"}, {"code": "x" * 20, "more": 1}, [1]])
async def test_a_malformed_link_request_is_invalid_request(lmind: LocalMind, body: object) -> None:
    answer = await fetch(http_base(lmind.url) + "/v1/web/link", "POST", body)
    assert answer.status == 400
    assert answer.json()["error"]["code"] == "invalid_request"


def test_the_page_names_every_url_relative_so_it_works_under_a_mount_path() -> None:
    # docs/asgi.md: the Mind may be mounted at a path of another app.
    for name in ("index.html", "app.js"):
        text = (WEB / name).read_text()
        assert not re.search(r"""["'`]/(v1|web)/""", text), name
