"""A real browser's EventSource (docs/protocol.md §17): chromium, driven by
Playwright, on a page of another origin (allowed with ``--allow-origin``).

The page asks for a stream ticket with its bearer token (a CORS preflight),
opens a native ``EventSource`` with it and shows a long streaming reply.
The network is cut mid-reply (the fault proxy between the browser and the
Mind); EventSource reconnects by itself — the same URL with its spent
ticket, plus ``Last-Event-ID`` — and the reconnect is let in by the grant
sealed in that id. The page's text then equals the Mind's snapshot, and no
seq was shown twice or skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.support.browser import PageServer, chromium, require_browser
from tests.support.client import FaceClient
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy

WORDS = 1000

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>halfpi stream</title></head>
<body><pre id="reply"></pre>
<script>
const q = new URLSearchParams(location.search);
const mind = q.get("mind"), cid = q.get("cid"), token = q.get("token");
window.state = {opens: 0, errors: 0, accepted: [], seqs: [], text: {}, done: {},
                snapshots: 0, resets: 0, failure: null};
async function start() {
  const answer = await fetch(mind + "/v1/stream-tickets", {
    method: "POST",
    headers: {"Authorization": "Bearer " + token, "Content-Type": "application/json"},
    body: JSON.stringify({conversations: [cid]}),
  });
  if (!answer.ok) { state.failure = "ticket: " + answer.status; return; }
  const ticket = (await answer.json()).ticket;
  const es = new EventSource(mind + "/v1/events?conversations=" + encodeURIComponent(cid)
                             + "&ticket=" + encodeURIComponent(ticket));
  es.onopen = () => { state.opens++; };
  es.onerror = () => { state.errors++; if (es.readyState === 2) state.failure = "closed"; };
  es.addEventListener("face.accepted", e => state.accepted.push(JSON.parse(e.data).payload));
  es.addEventListener("face.snapshot", () => { state.snapshots++; });
  es.addEventListener("face.reset", () => { state.resets++; });
  es.addEventListener("face.chat.delta", e => {
    const p = JSON.parse(e.data).payload;
    for (let s = (p.first_seq ?? p.seq); s <= p.seq; s++) state.seqs.push(s);
    state.text[p.request_id] = (state.text[p.request_id] || "") + p.text;
    document.getElementById("reply").textContent = state.text[p.request_id];
  });
  es.addEventListener("face.event", e => {
    const p = JSON.parse(e.data).payload;
    state.seqs.push(p.seq);
    if (p.type === "chat.completed") state.done[p.data.request_id] = p.data.content;
  });
}
start().catch(err => { state.failure = String(err); });
</script></body></html>
"""


@pytest.fixture
def page_server() -> Iterator[PageServer]:
    require_browser()  # fails (CI) or skips before any process starts
    server = PageServer(PAGE)
    yield server


async def state_of(page: Any) -> dict[str, Any]:
    return await page.evaluate("window.state")  # type: ignore[no-any-return]


async def wait_page(page: Any, predicate: Any, timeout: float = 20.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        state = await state_of(page)
        assert state is None or state["failure"] is None, state
        if state is not None and predicate(state):
            return state
        assert loop.time() < deadline, f"the page never got there: {state}"
        await asyncio.sleep(0.05)  # polling the page, with a deadline


@pytest.mark.e2e
async def test_a_browser_eventsource_resumes_a_cut_stream_by_itself(
    tmp_path: Path, server_kind: str, page_server: PageServer
) -> None:
    await page_server.start()
    home = tmp_path / "home"
    home.mkdir()
    mind = MindProcess(home, delta_ms=5.0, server=server_kind,
                       extra_args=("--allow-origin", page_server.origin)).start()
    proxy = await FaultProxy(mind.port).start()
    face = await FaceClient.connect(mind.url, mind.token)
    try:
        cid = await face.create_conversation()
        async with chromium() as browser:
            page = await browser.new_page()
            query = urlencode({"mind": f"http://127.0.0.1:{proxy.port}", "cid": cid,
                               "token": mind.token})
            await page.goto(f"{page_server.origin}/?{query}")
            await wait_page(page, lambda s: s["snapshots"] == 1)
            await face.command("face.chat", "browser", conversation_id=cid,
                               content=f"/repeat {WORDS} word")
            await wait_page(page, lambda s: len(s["seqs"]) >= 40)
            proxy.cut_all()  # the network goes, mid-reply
            state = await wait_page(page, lambda s: "browser" in s["done"], timeout=40)
            shown = await page.inner_text("#reply")

        assert state["opens"] >= 2 and state["errors"] >= 1, state
        # The reconnect came with Last-Event-ID (its spent ticket alone is refused).
        assert [a["replay"] for a in state["accepted"]][:2] == ["live", "exact"]
        assert state["resets"] == 0
        seqs = state["seqs"]
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), "a seq shown twice or skipped"
        request_id = await face.command("face.conversation.snapshot", conversation_id=cid)
        snapshot = (await face.reply(request_id))["payload"]
        truth = next(m["content"] for m in snapshot["messages"]
                     if m["role"] == "assistant" and m["request_id"] == "browser")
        assert shown == truth == state["done"]["browser"] == " ".join(["word"] * WORDS)
    finally:
        await face.close()
        await proxy.stop()
        await page_server.stop()
        mind.kill()
