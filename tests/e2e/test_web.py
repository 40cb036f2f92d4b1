"""The web face in a real Chromium (Debian's, driven by Playwright) against a
real ``halfpi mind``: what a person sees when the network or the Mind fails.

The breaks (a cut mid-reply, offline, a revoked token, kill -9, a raced
approval) run on both servers; the page's own logic on the native one only
(both hand HTTP to uvicorn: the transport says nothing more there).

Screenshots of the key states go to ``$HALFPI_WEB_SHOTS`` when it is set
(``docs/images/web`` is where docs/faces.md shows them from), else into the
test's own directory.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.browser import chromium
from tests.support.cli import face_add, face_revoke, halfpi_cli
from tests.support.mind import MindProcess
from tests.support.proxy import FaultProxy
from tests.web.http import fetch

if TYPE_CHECKING:  # playwright is imported only where a browser can run
    from playwright.async_api import Browser, BrowserContext, Page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WAIT_MS = 30_000
TRANSCRIPT = """() => [...document.querySelectorAll('#log > li.message')]
  .filter((li) => !li.classList.contains('pending') && !li.classList.contains('streaming'))
  .map((li) => [li.dataset.role, li.dataset.status,
                 li.querySelector('.body .notext') ? '' : li.querySelector('.body').textContent])"""
STREAMED_WORDS = """(n) => {
  const body = document.querySelector('#log li.streaming .body');
  return body !== null && body.textContent.split('word').length > n;
}"""


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


@pytest.fixture
def mind(tmp_path: Path, server_kind: str) -> Iterator[MindProcess]:
    """A Mind whose scripted agent streams one word every 40 ms."""
    home = tmp_path / "home"
    home.mkdir()
    proc = MindProcess(home, delta_ms=40, server=server_kind)
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("HALFPI_WEB_SHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def base_of(port: int) -> str:
    return f"http://127.0.0.1:{port}"


async def open_face(context: BrowserContext, base: str, token: str, *,
                    on_clock: bool = False) -> Page:
    """A tab signed in with ``token`` (pasted once), connected; ``on_clock``:
    its timers on Playwright's clock, moved by the test."""
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    if on_clock:
        await page.clock.install()
    await page.goto(base + "/")
    await page.fill("#signin-token", token)
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector('#status[data-state="connected"]')
    return page


async def send(page: Page, text: str) -> None:
    await page.fill("#input", text)
    await page.press("#input", "Enter")


async def open_conversation(page: Page) -> str:
    cid = await page.evaluate("() => localStorage.getItem('halfpi.open')")
    assert isinstance(cid, str) and cid.startswith("c_")
    return cid


async def snapshot(base: str, token: str, cid: str) -> dict[str, Any]:
    answer = await fetch(f"{base}/v1/conversations/{cid}", token=token)
    assert answer.status == 200, answer.body
    return dict(answer.json())


def as_shown(snap: dict[str, Any]) -> list[list[str]]:
    return [[m["role"], m["status"] or "", m["content"]] for m in snap["messages"]]


async def test_a_reply_cut_mid_stream_resumes_exactly_and_equals_the_minds_snapshot(
    browser: Browser, mind: MindProcess, shots: Path
) -> None:
    proxy = await FaultProxy(mind.port).start()
    try:
        base = base_of(proxy.port)
        page = await open_face(await browser.new_context(), base, mind.token)
        await send(page, "/repeat 60 word")
        await page.wait_for_function(STREAMED_WORDS, arg=8)
        await shots_of(page, shots, "streaming")

        await proxy.refuse()  # the network goes: every connection cut, none accepted
        await page.wait_for_selector('#status[data-state="reconnecting"]')
        status = await page.inner_text("#status")
        assert "reconnecting (attempt" in status and "next in" in status, status
        await shots_of(page, shots, "reconnecting")
        await proxy.listen_again()

        await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')
        await page.wait_for_selector('#status[data-state="connected"]')
        cid = await open_conversation(page)
        shown = await page.evaluate(TRANSCRIPT)
        assert shown == as_shown(await snapshot(base, mind.token, cid))
        assert shown[-1][2].count("word") == 60
        # Resumed exactly: never rebuilt from a snapshot after the first, and
        # the streamed text was the reply, word for word, no duplicate, no gap.
        assert await page.get_attribute("#log", "data-snapshots") == "1"
        assert await page.get_attribute("#log", "data-mismatches") == "0"
        await shots_of(page, shots, "resumed")
    finally:
        await proxy.stop()


@pytest.mark.servers("native")
async def test_a_reply_with_script_and_img_onerror_markdown_is_shown_as_text(
    browser: Browser, mind: MindProcess, shots: Path
) -> None:
    base = base_of(mind.port)
    page = await open_face(await browser.new_context(), base, mind.token)
    hostile = ('<script>window.pwned=1</script> <img src=x onerror="window.pwned=2"> '
               "[click](javascript:window.pwned=3) **bold**")
    await send(page, hostile)
    await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')
    reply = page.locator('#log li[data-role="assistant"] .body')
    assert "<script>window.pwned=1</script>" in await reply.inner_text()
    assert '<img src=x onerror="window.pwned=2">' in await reply.inner_text()
    for tag in ("script", "img", "a", "iframe"):
        assert await page.locator(f"#log {tag}").count() == 0, tag
    assert await page.locator('#log li[data-role="assistant"] .body strong').inner_text() == "bold"
    assert await page.evaluate("() => window.pwned") is None
    await shots_of(page, shots, "hostile-markdown")


async def test_a_message_sent_while_offline_is_admitted_exactly_once(
    browser: Browser, mind: MindProcess, shots: Path
) -> None:
    base = base_of(mind.port)
    context = await browser.new_context()
    page = await open_face(context, base, mind.token)
    cid = await open_conversation(page)

    await context.set_offline(True)
    await page.wait_for_selector('#status[data-state="offline"]')
    await send(page, "written on the train")
    await page.wait_for_selector('#log li.pending[data-pending="queued"]')
    await shots_of(page, shots, "offline")
    await context.set_offline(False)

    await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')
    await page.wait_for_selector('#status[data-state="connected"]')
    snap = await snapshot(base, mind.token, cid)
    users = [m for m in snap["messages"] if m["role"] == "user"]
    assert [m["content"] for m in users] == ["written on the train"]
    assert await page.evaluate(TRANSCRIPT) == as_shown(snap)
    assert await page.evaluate("() => sessionStorage.getItem('halfpi.outbox')") == "[]"


@pytest.mark.servers("native")
async def test_a_send_whose_answer_was_lost_is_sent_again_and_admitted_once(
    browser: Browser, mind: MindProcess
) -> None:
    base = base_of(mind.port)
    page = await open_face(await browser.new_context(), base, mind.token)
    cid = await open_conversation(page)
    lost: list[str] = []

    async def lose_the_first_answer(route: Any) -> None:
        if lost:
            await route.continue_()
            return
        lost.append(route.request.headers["idempotency-key"])
        await route.fetch()  # it reaches the Mind, which admits it...
        await route.abort("connectionreset")  # ...and the page never hears back

    await page.route("**/v1/commands/face.chat", lose_the_first_answer)
    await send(page, "did this arrive")
    await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')
    snap = await snapshot(base, mind.token, cid)
    users = [m for m in snap["messages"] if m["role"] == "user"]
    assert [(m["content"], m["request_id"]) for m in users] == [("did this arrive", lost[0])]
    assert await page.evaluate(TRANSCRIPT) == as_shown(snap)


async def test_a_revoked_token_signs_the_page_out_with_a_clear_message(
    browser: Browser, mind: MindProcess, shots: Path
) -> None:
    tablet = await face_add(mind.home, "tablet")
    page = await open_face(await browser.new_context(), base_of(mind.port), tablet.token)
    await face_revoke(mind.home, "tablet")
    await page.wait_for_selector("#signin", state="visible")
    message = await page.inner_text("#signin-message")
    assert "no longer valid" in message and "revoked" in message
    assert await page.evaluate("() => localStorage.getItem('halfpi.token')") is None
    await shots_of(page, shots, "revoked")


async def test_a_mind_killed_mid_reply_shows_the_reset_and_the_interrupted_partial_reply(
    browser: Browser, mind: MindProcess, shots: Path
) -> None:
    base = base_of(mind.port)
    page = await open_face(await browser.new_context(), base, mind.token)
    cid = await open_conversation(page)
    await send(page, "/repeat 400 word")
    # Long enough for the Mind to have saved part of it (about every second).
    await page.wait_for_function(STREAMED_WORDS, arg=60)
    await asyncio.to_thread(mind.kill)
    await page.wait_for_selector('#status[data-state="reconnecting"]')
    await asyncio.to_thread(mind.start)

    await page.wait_for_selector('#status[data-state="resynced"]')
    assert "resynced from snapshot" in await page.inner_text("#status")
    reply = page.locator('#log li[data-role="assistant"][data-status="interrupted"]')
    await reply.wait_for()
    assert await reply.locator(".reason").count() == 1
    partial = await reply.locator(".body").inner_text()
    assert 0 < partial.count("word") < 400
    await shots_of(page, shots, "interrupted")
    assert await page.evaluate(TRANSCRIPT) == as_shown(await snapshot(base, mind.token, cid))

    await send(page, "still here")  # and it goes on
    await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')
    assert await page.evaluate(TRANSCRIPT) == as_shown(await snapshot(base, mind.token, cid))


async def test_two_tabs_race_an_approval_one_wins_the_other_shows_it_already_resolved(
    browser: Browser, mind: MindProcess, shots: Path
) -> None:
    """The race at its closest: both tabs decide before either has heard of
    the other's decision. The phone's tab reaches the Mind through the fault
    proxy, which holds everything the Mind sends it while the laptop wins;
    then the phone decides, blind, and is told the truth."""
    base = base_of(mind.port)
    proxy = await FaultProxy(mind.port).start()
    try:
        phone = await face_add(mind.home, "phone", "--approve")
        laptop = await open_face(await browser.new_context(), base, mind.token)
        cid = await open_conversation(laptop)
        other = await open_face(await browser.new_context(), base_of(proxy.port), phone.token)
        assert await open_conversation(other) == cid  # the newest conversation: the same
        await send(laptop, '/tool exec_command {"argv": ["echo", "approved"]}')
        allow = '#log .tool[data-state="awaiting approval"] button.allow'
        await laptop.wait_for_selector(allow)
        await other.wait_for_selector(allow)
        await shots_of(other, shots, "approval")

        proxy.pause_to_client()  # the phone hears nothing from now on
        await laptop.click(allow)
        await laptop.locator('#log .tool .outcome[data-outcome="applied"]').wait_for()
        await other.click(allow)  # its tab still shows the approval waiting
        proxy.resume_to_client()
        outcomes = []
        for page in (laptop, other):
            outcome = page.locator("#log .tool .outcome")
            await outcome.wait_for()
            outcomes.append((await outcome.get_attribute("data-outcome"),
                             await outcome.inner_text()))
        assert [o for o, _ in outcomes] == ["applied", "already_resolved"]
        assert "your decision stands: allowed once" in outcomes[0][1]
        assert "already resolved by local: allowed once" in outcomes[1][1]
        # Both end on the same truth: the call ran, allowed by the winner.
        for page in (laptop, other):
            await page.wait_for_selector('#log .tool[data-state="succeeded · allowed by local"]')
            await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')
        await shots_of(other, shots, "already-resolved")
    finally:
        await proxy.stop()


async def shots_of(page: Page, folder: Path, name: str) -> None:
    await page.screenshot(path=str(folder / f"{name}.png"))


@pytest.mark.servers("native")
async def test_a_conversation_made_or_renamed_in_one_tab_appears_in_the_others_list(
    browser: Browser, mind: MindProcess
) -> None:
    base = base_of(mind.port)
    first = await open_face(await browser.new_context(), base, mind.token)
    second = await open_face(await browser.new_context(), base, mind.token)
    assert await first.locator("#list li").count() == 1
    before = await open_conversation(second)
    await second.click("#new")
    await first.wait_for_function("() => document.querySelectorAll('#list li').length === 2")
    await second.wait_for_function("(c) => localStorage.getItem('halfpi.open') !== c", arg=before)
    cid = await open_conversation(second)
    await second.click("#rename")
    await second.fill("#rename-input", "Lisbon <b>trip</b>")
    await second.press("#rename-input", "Enter")
    await first.locator(f'#list li[data-id="{cid}"]', has_text="Lisbon <b>trip</b>").wait_for()
    await second.locator("#conv-name", has_text="Lisbon <b>trip</b>").wait_for()
    assert await second.inner_text("#conv-name") == "Lisbon <b>trip</b>"


@pytest.mark.servers("native")
async def test_failed_and_cancelled_replies_stay_with_their_reason_and_text(
    browser: Browser, mind: MindProcess, shots: Path
) -> None:
    base = base_of(mind.port)
    page = await open_face(await browser.new_context(), base, mind.token)
    cid = await open_conversation(page)
    await send(page, "/fail")
    failed = page.locator('#log li[data-role="assistant"][data-status="failed"]')
    await failed.wait_for()
    assert "agent_failed" in await failed.locator(".who").inner_text()
    assert await failed.locator(".reason").count() == 1

    await send(page, "/repeat 400 word")
    await page.wait_for_function(STREAMED_WORDS, arg=5)
    await page.click("#log li.streaming button.cancel")
    cancelled = page.locator('#log li[data-role="assistant"][data-status="cancelled"]')
    await cancelled.wait_for()
    assert "cancelled by local" in await cancelled.locator(".reason").inner_text()
    assert 0 < (await cancelled.locator(".body").inner_text()).count("word") < 400
    await shots_of(page, shots, "failed-and-cancelled")
    assert await page.evaluate(TRANSCRIPT) == as_shown(await snapshot(base, mind.token, cid))


@pytest.mark.servers("native")
async def test_a_one_time_link_signs_in_leaves_no_code_in_the_url_and_works_once(
    browser: Browser, mind: MindProcess, shots: Path
) -> None:
    run = await halfpi_cli("face", "link", "--home", str(mind.home), "--label", "tab")
    assert run.returncode == 0, run.stderr
    link = run.stdout.strip()
    page = await browser.new_page()
    page.set_default_timeout(WAIT_MS)
    await page.goto(link)
    await page.wait_for_selector('#status[data-state="connected"]')
    assert page.url == base_of(mind.port) + "/"
    assert "#" not in await page.evaluate("() => location.href")
    token = await page.evaluate("() => localStorage.getItem('halfpi.token')")
    assert isinstance(token, str) and token.startswith("hpf_") and token != mind.token

    again = await browser.new_page()
    await again.goto(link)
    await again.wait_for_selector("#signin", state="visible")
    assert "already used" in await again.inner_text("#signin-message")
    assert again.url == base_of(mind.port) + "/"
    await shots_of(again, shots, "link-used")


@pytest.mark.servers("native")
async def test_a_wrong_token_is_refused_at_sign_in_and_sign_out_forgets_the_token(
    browser: Browser, mind: MindProcess
) -> None:
    page = await browser.new_page()
    page.set_default_timeout(WAIT_MS)
    await page.goto(base_of(mind.port) + "/")
    await page.fill("#signin-token", "hpf_not-a-token")
    await page.click("#signin-form button[type=submit]")
    await page.locator("#signin-message", has_text="not valid").wait_for()
    assert await page.evaluate("() => localStorage.getItem('halfpi.token')") is None
    await page.fill("#signin-token", mind.token)
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector('#status[data-state="connected"]')
    await page.click("#signout")
    await page.locator("#signin-message", has_text="not revoked").wait_for()
    assert await page.evaluate("() => localStorage.getItem('halfpi.token')") is None
    await page.reload()
    await page.wait_for_selector("#signin", state="visible")


@pytest.mark.servers("native")
async def test_a_tab_in_the_background_lets_its_stream_go_and_resumes_when_shown(
    browser: Browser, mind: MindProcess
) -> None:
    base = base_of(mind.port)
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(WAIT_MS)
    await page.clock.install()  # the page's timers on a clock the test moves
    await page.goto(base + "/")
    await page.fill("#signin-token", mind.token)
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector('#status[data-state="connected"]')
    cid = await open_conversation(page)
    hide = """(hidden) => {
      Object.defineProperty(document, 'hidden', {configurable: true, get: () => hidden});
      document.dispatchEvent(new Event('visibilitychange'));
    }"""
    await page.evaluate(hide, True)
    await page.clock.run_for(29_000)
    assert await page.get_attribute("#status", "data-state") == "connected"
    await page.clock.run_for(2_000)
    await page.wait_for_selector('#status[data-state="paused"]')

    # Meanwhile another Face chats here; shown again, the tab catches up exactly.
    other = await fetch(f"{base}/v1/commands/face.chat?wait=10", "POST",
                        {"conversation_id": cid, "content": "while you were away"},
                        headers={"Idempotency-Key": "away-1"}, token=mind.token)
    assert other.status == 200, other.body
    await page.evaluate(hide, False)
    await page.wait_for_selector('#status[data-state="connected"]')
    await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')
    assert await page.evaluate(TRANSCRIPT) == as_shown(await snapshot(base, mind.token, cid))
    assert await page.get_attribute("#log", "data-snapshots") == "1"


@pytest.mark.servers("native")
async def test_older_messages_than_the_snapshot_are_read_on_demand(
    browser: Browser, mind: MindProcess
) -> None:
    base = base_of(mind.port)
    page = await open_face(await browser.new_context(), base, mind.token)
    cid = await open_conversation(page)
    for n in range(26):  # 52 messages: more than the snapshot's last 50
        sent = await fetch(f"{base}/v1/commands/face.chat?wait=10", "POST",
                           {"conversation_id": cid, "content": f"m{n}"},
                           headers={"Idempotency-Key": f"old-{n}"}, token=mind.token)
        assert sent.status == 200, sent.body
    await page.reload()
    await page.wait_for_selector('#status[data-state="connected"]')
    await page.wait_for_function("() => document.querySelectorAll('#log li.message').length === 50")
    await page.click("#older")
    await page.wait_for_function("() => document.querySelectorAll('#log li.message').length === 52")
    assert await page.locator("#older").count() == 0
    every = await fetch(f"{base}/v1/conversations/{cid}/messages?limit=500", token=mind.token)
    assert await page.evaluate(TRANSCRIPT) == as_shown(every.json())


@pytest.mark.servers("native")
async def test_a_page_that_could_not_read_its_lists_keeps_trying_until_it_can(
    browser: Browser, mind: MindProcess
) -> None:
    page = await (await browser.new_context()).new_page()
    page.set_default_timeout(WAIT_MS)
    failed: list[str] = []

    async def fail_twice(route: Any) -> None:
        if len(failed) < 2:
            failed.append(route.request.url)
            await route.abort("connectionrefused")
        else:
            await route.continue_()

    await page.route("**/v1/conversations?limit=200", fail_twice)
    await page.goto(base_of(mind.port) + "/")
    await page.fill("#signin-token", mind.token)
    await page.click("#signin-form button[type=submit]")
    await page.wait_for_selector('#status[data-state="reconnecting"]')
    await page.wait_for_selector('#status[data-state="connected"]')
    assert len(failed) == 2
    await send(page, "hello")
    await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')


@pytest.mark.servers("native")
async def test_an_approval_waiting_survives_a_reload_and_a_deny_is_shown_to_both_tabs(
    browser: Browser, mind: MindProcess
) -> None:
    base = base_of(mind.port)
    phone = await face_add(mind.home, "phone", "--approve")
    laptop = await open_face(await browser.new_context(), base, mind.token)
    other = await open_face(await browser.new_context(), base, phone.token)
    await send(laptop, '/tool exec_command {"argv": ["echo", "never"]}')
    deny = '#log .tool[data-state="awaiting approval"] button.deny'
    await other.wait_for_selector(deny)
    await other.reload()  # from the snapshot now: pending_approvals
    await other.wait_for_selector('#status[data-state="connected"]')
    await other.click(deny)
    mine = other.locator("#log .tool .outcome")
    await mine.wait_for()
    assert await mine.get_attribute("data-outcome") == "applied"
    assert "denied once" in await mine.inner_text()
    for page in (laptop, other):
        await page.wait_for_selector('#log .tool[data-state="denied by phone"]')
    assert await laptop.locator("#log .tool button").count() == 0


@pytest.mark.servers("native")
async def test_a_mind_that_answers_nothing_is_said_so_not_waited_for_in_silence(
    browser: Browser, mind: MindProcess
) -> None:
    proxy = await FaultProxy(mind.port).start()
    try:
        page = await open_face(await browser.new_context(), base_of(proxy.port), mind.token,
                               on_clock=True)
        proxy.blackhole = True  # connections are taken, nothing comes back
        proxy.cut_all()
        await page.locator("#status", has_text="trying now").wait_for()
        await page.clock.run_for(16_000)
        await page.locator("#status", has_text="no answer from the Mind within 15 s").wait_for()
        assert await page.get_attribute("#status", "data-state") == "reconnecting"
        proxy.blackhole = False
        proxy.cut_all()
        await page.clock.run_for(3_000)
        await page.wait_for_selector('#status[data-state="connected"]')
    finally:
        await proxy.stop()


async def test_a_stream_gone_silent_is_said_dead_and_reconnected_not_shown_connected(
    browser: Browser, mind: MindProcess
) -> None:
    proxy = await FaultProxy(mind.port).start()
    try:
        page = await open_face(await browser.new_context(), base_of(proxy.port), mind.token,
                               on_clock=True)
        # A half-open connection: the socket stays up, nothing comes through
        # (not even the heartbeat events), and the browser is told nothing.
        proxy.blackhole = True
        await page.clock.run_for(34_000)
        assert await page.get_attribute("#status", "data-state") == "connected"
        await page.clock.run_for(2_000)  # two heartbeats and the grace: 35 s
        await page.locator("#status", has_text="no heartbeat from the Mind for 35 s").wait_for()
        assert await page.get_attribute("#status", "data-state") == "reconnecting"
        proxy.blackhole = False
        proxy.cut_all()
        await page.clock.run_for(3_000)
        await page.wait_for_selector('#status[data-state="connected"]')
    finally:
        await proxy.stop()


@pytest.mark.servers("native")
async def test_an_observer_sees_the_conversation_read_only_and_cannot_decide(
    browser: Browser, mind: MindProcess
) -> None:
    base = base_of(mind.port)
    owner = await open_face(await browser.new_context(), base, mind.token)
    cid = await open_conversation(owner)
    await send(owner, '/tool exec_command {"argv": ["echo", "watched"]}')
    await owner.wait_for_selector('#log .tool[data-state="awaiting approval"] button.allow')
    watcher = await face_add(mind.home, "watcher", "--profile", "observer")
    page = await open_face(await browser.new_context(), base, watcher.token)
    assert await open_conversation(page) == cid
    assert await page.inner_text("#who") == "watcher · observer"
    assert await page.is_disabled("#input") and await page.is_disabled("#send")
    assert await page.is_hidden("#new") and await page.is_hidden("#rename")
    card = page.locator('#log .tool[data-state="awaiting approval"]')
    await card.locator(".why", has_text="this credential may not decide").wait_for()
    assert await card.locator("button").count() == 0
    await owner.click('#log .tool[data-state="awaiting approval"] button.allow')
    await page.wait_for_selector('#log li[data-role="assistant"][data-status="succeeded"]')
