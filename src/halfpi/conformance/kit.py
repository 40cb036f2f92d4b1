"""The checks of the conformance kit and the table they print.

Every check opens its own connections through the kit's proxy, runs one
promise of the session contract against the target and ends within its
time bound. The target is assumed to run the scripted agent (``/pace``,
``/tool``: docs/agent.md), as ``halfpi mind`` does without a model.

No check depends on the target's own pace between deltas (20 ms by
default, or whatever ``--delta-ms`` says): every reply a check waits for
names its pace (``/pace MS TEXT``), and the load the slow-consumer check
needs comes from many conversations at once, waited for while the target
shows progress rather than against a fixed clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from websockets.exceptions import ConnectionClosed

from halfpi.conformance.link import CheckFailed, Face, Frame, expect_that, face_url, user_messages
from halfpi.conformance.proxy import KitProxy

CHAT_ENDS = ("chat.completed", "chat.failed", "chat.cancelled", "chat.interrupted")
CHECK_TIMEOUT_S = 15.0
PING_ROUNDS = 20
# The slow consumer's load: FILLER_CHATS conversations answer at once, each
# FILLER_WORDS words of FILLER_WORD_CHARS at pace 0 (one chat carries at most
# 256 KiB): 6 MB in all, far more than the socket buffers on the way.
FILLER_CHATS = 25
FILLER_WORDS = 24
FILLER_WORD_CHARS = 9_999
# How long the reader that keeps up may see nothing new while the filler
# replies are still owed: the deadline moves with every frame it receives.
QUIET_S = 5.0
REVOKE_COMMAND_S = 10.0
# A revocation takes effect on every server within a second (docs/protocol.md
# §2); the kit allows as much again for a loaded machine.
REVOKED_WITHIN_S = 2.0
# How long a connection the server must close (evicted, revoked) may take.
CLOSE_WITHIN_S = 8.0
# Checks whose own steps may take longer than CHECK_TIMEOUT_S: the revocation
# (its command, the close, the hellos after it).
EXTRA_TIME_S = {"revocation": REVOKE_COMMAND_S + CLOSE_WITHIN_S + REVOKED_WITHIN_S}


class Skipped(Exception):
    """The check cannot run against this target (the message says why)."""


@dataclass(frozen=True)
class Revocation:
    """What the revocation check needs: a Face token it may lose, and the
    command that revokes its credential on the target's own store."""

    token: str = field(repr=False)
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    name: str
    result: str  # pass | fail | skip
    why: str


def target_of(url: str) -> tuple[str, int]:
    """``ws://HOST:PORT/v1/face`` or ``http://HOST:PORT`` → (host, port)."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "http") or not parts.hostname:
        raise ValueError(f"not a ws:// or http:// URL: {url!r} (the kit speaks plain "
                         "WebSocket only: point it at a plain listener, e.g. behind the TLS proxy)")
    return parts.hostname, parts.port or (80 if parts.scheme == "http" else 15707)


class Kit:
    """One check's connections: through ``proxy`` (in front of the target),
    straight to the target, or — for the two checks a proxy in the way
    spoils — to one server (``node_proxy``'s target: the target itself,
    or a node behind the target's load balancer)."""

    def __init__(self, proxy: KitProxy, token: str, node_proxy: KitProxy | None = None,
                 revocation: Revocation | None = None) -> None:
        self.proxy = proxy
        self.revocation_of = revocation
        self.node_proxy = node_proxy or proxy
        self.direct_url = face_url(proxy.host, proxy.port_target)
        self.node_url = face_url(self.node_proxy.host, self.node_proxy.port_target)
        self.token = token
        self.faces: list[Face] = []

    @property
    def url(self) -> str:
        return face_url("127.0.0.1", self.proxy.port)

    async def face(self, proxy: KitProxy | None = None) -> Face:
        face = await Face.open(face_url("127.0.0.1", (proxy or self.proxy).port), self.token)
        self.faces.append(face)
        return face

    async def close_all(self) -> None:
        for face in self.faces:
            with contextlib.suppress(Exception):  # a broken face is closed enough
                await face.close()
        self.faces.clear()

    # 1 -----------------------------------------------------------------
    async def request_replay(self) -> str:
        face = await self.face()
        cid = await face.conversation()
        rid = face.rid("chat")
        chat = {"request_id": rid, "conversation_id": cid, "content": "/pace 0 replay me"}
        await face.send("face.chat", chat)
        first = await face.answer(rid, ("face.result",))
        await face.send("face.chat", chat)
        second = await face.answer(rid, ("face.result", "face.error"))
        expect_that(second["type"] == "face.result", f"the replay got {second['payload']}")
        one, two = dict(first["payload"]), dict(second["payload"])
        one.pop("event_seq"), two.pop("event_seq")
        expect_that(one == two, "the replay's face.result differs from the first")
        expect_that(await user_messages(face, cid, rid) == 1, "the chat was admitted twice")
        await face.send("face.chat", {**chat, "content": "another payload"})
        third = await face.answer(rid, ("face.result", "face.error"))
        code = third["payload"].get("code")
        expect_that(code == "request_conflict", f"another payload got {code or third['type']}")
        return "same id: one admission, same result; another payload: request_conflict"

    # 2 -----------------------------------------------------------------
    async def break_before_answer(self) -> str:
        face = await self.face()
        cid = await face.conversation()
        rid = face.rid("chat")
        chat = {"request_id": rid, "conversation_id": cid,
                "content": "/pace 0 cut right after"}
        await face.send("face.chat", chat)
        self.proxy.cut_all()
        again = await self.face()
        await again.send("face.chat", chat)
        result = await again.answer(rid, ("face.result", "face.error"))
        expect_that(result["type"] == "face.result"
                    and result["payload"]["status"] == "succeeded",
                    f"the retry got {result['payload']}")
        expect_that(await user_messages(again, cid, rid) == 1, "the chat was admitted twice")
        return "link cut after face.chat; the retry was admitted once"

    # 3 -----------------------------------------------------------------
    async def resume_mid_reply(self) -> str:
        face = await self.face()
        cid = await face.conversation()
        sub = await face.command("face.subscribe", "sub", conversation_ids=[cid])
        expect_that(sub["type"] != "face.error", f"subscribe refused: {sub['payload']}")
        rid = face.rid("chat")
        words = [f"w{i}" for i in range(40)]
        await face.send("face.chat", {"request_id": rid, "conversation_id": cid,
                                      "content": "/pace 40 " + " ".join(words)})
        await face.expect(lambda f: f["type"] == "face.chat.delta"
                          and f["payload"]["request_id"] == rid)
        await face.expect(lambda f: f["type"] == "face.chat.delta"
                          and f["payload"]["request_id"] == rid)
        self.proxy.cut_all()
        await asyncio.wait_for(asyncio.shield(face.reader), 2)
        before = [f for f in face.frames if f["payload"].get("conversation_id") == cid
                  and "seq" in f["payload"]]
        expect_that(bool(before), "nothing positioned arrived before the cut")
        expect_that(not any(f["type"] == "face.event" and f["payload"]["type"] in CHAT_ENDS
                            for f in before), "the reply ended before the cut: not mid-reply")
        again = await self.face()
        rid2 = again.rid("sub")
        await again.send("face.subscribe", {"request_id": rid2, "conversation_ids": [cid],
                                            "since": {cid: before[-1]["payload"]["cursor"]}})
        accepted = await again.answer(rid2, ("face.accepted", "face.error"))
        replay = accepted["payload"].get("replay")
        expect_that(replay == "exact", f"resume answered replay={replay!r}")
        end = await again.expect(lambda f: f["type"] == "face.event"
                                 and f["payload"]["type"] in CHAT_ENDS
                                 and f["payload"]["data"].get("request_id") == rid, 8)
        after = [f for f in again.frames if f["payload"].get("conversation_id") == cid
                 and "seq" in f["payload"]]
        after = after[:after.index(end) + 1]
        seen: list[int] = []
        for f in before + after:
            p = f["payload"]
            seen.extend(range(p.get("first_seq", p["seq"]), p["seq"] + 1))
        expect_that(len(seen) == len(set(seen)), "a seq was delivered twice")
        expect_that(seen == list(range(seen[0], seen[0] + len(seen))),
                    f"seqs not contiguous: {seen}")
        text = "".join(f["payload"]["text"] for f in before + after
                       if f["type"] == "face.chat.delta" and f["payload"]["request_id"] == rid)
        expect_that(text == end["payload"]["data"].get("content"),
                    "the deltas' text differs from chat.completed content")
        return f"cut after {len(before)} frames; replay exact, seqs {seen[0]}..{seen[-1]}"

    # 4 -----------------------------------------------------------------
    async def reset_unknown_epoch(self) -> str:
        face = await self.face()
        cid = await face.conversation()
        snap = await face.command("face.conversation.snapshot", "snap", conversation_id=cid)
        epoch = str(snap["payload"]["epoch"])
        other = "".join("b" if c == "a" else "a" for c in epoch)
        rid = face.rid("sub")
        await face.send("face.subscribe", {"request_id": rid, "conversation_ids": [cid],
                                           "since": {cid: f"{other}.1"}})
        accepted = await face.answer(rid, ("face.accepted", "face.error"))
        expect_that(accepted["type"] == "face.accepted", f"subscribe got {accepted['payload']}")
        reset = await face.expect(lambda f: f["type"] == "face.reset")
        p = reset["payload"]
        expect_that(p["conversation_id"] == cid and p["reason"] == "epoch_changed",
                    f"reset reason {p.get('reason')!r}")
        expect_that(isinstance(p.get("snapshot"), dict) and p["snapshot"].get("epoch") == epoch,
                    "the reset carries no snapshot of the current epoch")
        return "foreign epoch → face.reset{epoch_changed} with a snapshot"

    # 5 -----------------------------------------------------------------
    async def bad_input(self) -> str:
        face = await self.face()
        await face.ws.send("{not json")
        error = await face.expect(lambda f: f["type"] == "face.error")
        code = error["payload"].get("code")
        expect_that(code == "invalid_request", f"a non-JSON frame got {code!r}")
        await face.ws.send(json.dumps({"type": "face.conversation.list",
                                       "payload": {"request_id": "conf-bad", "colour": 1}}))
        error = await face.expect(lambda f: f["type"] == "face.error")
        p = error["payload"]
        expect_that(p.get("code") == "invalid_request" and p.get("field") == "colour",
                    f"an unknown field got {p.get('code')!r} field={p.get('field')!r}")
        await face.send("face.ping", {"request_id": "conf-ping"})
        await face.expect(lambda f: f["type"] == "face.pong")
        # Straight to one server: a proxy cannot relay this close (the server
        # resets the link while the client still sends, and the reset drops it).
        big = await Face.open(self.node_url, self.token)
        self.faces.append(big)
        try:
            await big.ws.send("x" * (5 * 1024 * 1024))
        except ConnectionClosed as exc:  # closed while the frame was still going out
            code = exc.rcvd.code if exc.rcvd is not None else None
        else:
            code = await big.close_code(5, "a 5 MiB frame did not close the connection")
        expect_that(code == 1009, f"a 5 MiB frame closed with {code}, not 1009")
        return f"garbage → invalid_request (field {p['field']}), still open; 5 MiB → 1009"

    # 6 -----------------------------------------------------------------
    async def approvals_race(self) -> str:
        op = await self.face()
        cid = await op.conversation()
        phone, laptop = await self.face(), await self.face()
        for f in (phone, laptop):
            sub = await f.command("face.subscribe", "sub", conversation_ids=[cid])
            expect_that(sub["type"] != "face.error", f"subscribe refused: {sub['payload']}")
        rid = op.rid("chat")
        content = "/tool exec_command " + json.dumps({"command": "echo conformance"})
        await op.send("face.chat", {"request_id": rid, "conversation_id": cid, "content": content})

        def asked(f: Frame) -> bool:
            return bool(f["type"] == "face.event" and f["payload"]["type"] == "approval.requested"
                    and f["payload"]["data"].get("request_id") == rid)

        try:
            approval = await phone.expect(asked)
        except CheckFailed:
            raise Skipped("no approval was asked (no Hand with exec_command approval)") from None
        aid = approval["payload"]["data"]["approval_id"]
        await laptop.expect(asked)
        await asyncio.gather(
            phone.send("face.approval.resolve", {"request_id": phone.rid("a"),
                       "approval_id": aid, "decision": "allow_once"}),
            laptop.send("face.approval.resolve", {"request_id": laptop.rid("d"),
                        "approval_id": aid, "decision": "deny_once"}),
        )
        answers = [await f.expect(lambda fr: fr["type"] in ("face.result", "face.error")
                                  and str(fr["payload"].get("request_id", "")).startswith(
                                      "conf-"), 5) for f in (phone, laptop)]
        datas = [a["payload"].get("data") or {} for a in answers]
        outcomes = sorted(str(d.get("outcome")) for d in datas)
        expect_that(outcomes == ["already_resolved", "applied"], f"outcomes {outcomes}")
        expect_that(datas[0].get("resolution") == datas[1].get("resolution"),
                    "the loser was told another resolution than the winner's")
        return "one applied, one already_resolved, same resolution"

    # 7 -----------------------------------------------------------------
    async def slow_consumer(self) -> str:
        # The reader and the requester dial the target; the stalled Face goes
        # to one server through a proxy that stops forwarding to it (with
        # nothing else in the way: a load balancer's buffers would hide it).
        op = await Face.open(self.direct_url, self.token)
        peer = await Face.open(self.direct_url, self.token)
        self.faces += [op, peer]
        cids = [await op.conversation() for _ in range(FILLER_CHATS)]
        sub = await peer.command("face.subscribe", "sub", conversation_ids=cids,
                                 transient_types=[])
        expect_that(sub["type"] == "face.accepted", f"subscribe refused: {sub['payload']}")
        stalling = self.node_proxy
        slow = await self.face(stalling)
        sub = await slow.command("face.subscribe", "sub", conversation_ids=cids,
                                 transient_types=[])
        expect_that(sub["type"] == "face.accepted", f"subscribe refused: {sub['payload']}")
        stalling.flowing.clear()
        text = " ".join(["p" * FILLER_WORD_CHARS] * FILLER_WORDS)
        owed: set[str] = set()
        for cid in cids:  # at pace 0, whatever the target's own pace
            rid = op.rid("filler")
            owed.add(rid)
            await op.send("face.chat", {"request_id": rid, "conversation_id": cid,
                                        "content": f"/pace 0 {text}"})
        while owed:
            done = await peer.expect(lambda f: f["type"] == "face.event"
                                     and f["payload"]["type"] in CHAT_ENDS
                                     and f["payload"]["data"].get("request_id") in owed,
                                     QUIET_S, quiet=True)
            data = done["payload"]["data"]
            owed.discard(data["request_id"])
            why = data.get("error_code") or "content differs"
            expect_that(data.get("content") == text, "the reader that kept up did not get "
                        f"the whole reply ({done['payload']['type']}: {why})")
        # Its own unread answers pile up until they no longer fit its queue.
        # Under ASGI the target feels a full buffer only at its next send, so
        # the pings come in rounds, each a chance for it to notice.
        for batch in range(PING_ROUNDS):
            with contextlib.suppress(ConnectionClosed):  # evicted meanwhile: fine
                for i in range(50):
                    await slow.send("face.ping", {"request_id": f"conf-p{batch}-{i}"})
            if slow.reader.done():
                break
            await asyncio.sleep(0.05)  # pacing the rounds, not waiting for anything
        stalling.flowing.set()
        code = await slow.close_code(CLOSE_WITHIN_S,
                                     "the reader that stopped reading was not evicted")
        expect_that(code == 4008, f"the stalled reader was closed with {code}, not 4008")
        expect_that(slow.frames[-1]["type"] == "face.evicted",
                    f"its last frame was {slow.frames[-1]['type']}, not face.evicted")
        return (f"the stalled reader got face.evicted + 4008; the other got all "
                f"{FILLER_CHATS} replies")

    # 8 -----------------------------------------------------------------
    async def revocation(self) -> str:
        given = self.revocation_of
        if given is None:
            raise Skipped("give --revocable-token and --revoke-command (which revokes that "
                          "token's credential on the target's store) to run it")
        op = await self.face()
        cid = await op.conversation()
        victim = await Face.open(self.url, given.token)
        self.faces.append(victim)
        sub = await victim.command("face.subscribe", "sub", conversation_ids=[cid])
        expect_that(sub["type"] == "face.accepted", f"subscribe refused: {sub['payload']}")
        try:
            revoke = await asyncio.create_subprocess_exec(
                *given.argv, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            raise CheckFailed(f"the revoke command did not start: {exc}") from None
        try:
            _, err = await asyncio.wait_for(revoke.communicate(), REVOKE_COMMAND_S)
        except TimeoutError:
            raise CheckFailed(f"the revoke command did not finish within "
                              f"{REVOKE_COMMAND_S:g} s") from None
        finally:
            if revoke.returncode is None:  # timed out, or the check was cancelled
                revoke.kill()
                await revoke.wait()
        revoked_at = asyncio.get_running_loop().time()
        expect_that(revoke.returncode == 0, f"the revoke command exited {revoke.returncode}: "
                    f"{err.decode(errors='replace').strip()[-160:]}")
        code = await victim.close_code(CLOSE_WITHIN_S,
                                       "the revoked credential's connection stayed open")
        expect_that(code == 4003, f"the revoked credential's connection closed with {code}, "
                    "not 4003")
        # Each server learns of it within a second (docs/protocol.md §2): a
        # hello that reaches another node of a cluster first may still be
        # welcomed in that window, never after it.
        loop = asyncio.get_running_loop()
        deadline = revoked_at + REVOKED_WITHIN_S
        welcomed = 0
        while True:
            try:
                again = await Face.open(self.url, given.token)
            except CheckFailed as exc:
                expect_that(str(exc) == "hello refused: unauthorized", f"its next hello: {exc}")
                break
            self.faces.append(again)
            welcomed += 1
            if loop.time() > deadline:
                raise CheckFailed(f"the revoked token was still welcomed {REVOKED_WITHIN_S:g} s "
                                  "after the revocation")
            await asyncio.sleep(0.05)  # pacing the hellos, not waiting for anything
        late = f" ({welcomed} welcomed first, within {REVOKED_WITHIN_S:g} s)" if welcomed else ""
        return f"revoked while subscribed: closed 4003; its hellos: unauthorized{late}"


CHECKS: tuple[tuple[str, Callable[[Kit], Awaitable[str]]], ...] = (
    ("request replay and conflict", Kit.request_replay),
    ("break before the answer", Kit.break_before_answer),
    ("resume mid-reply", Kit.resume_mid_reply),
    ("reset on an unknown epoch", Kit.reset_unknown_epoch),
    ("bad input", Kit.bad_input),
    ("approvals race", Kit.approvals_race),
    ("slow consumer", Kit.slow_consumer),
    ("revocation", Kit.revocation),
)


async def run_checks(url: str, token: str, *, node: str | None = None,
                     revocation: Revocation | None = None,
                     timeout_s: float = CHECK_TIMEOUT_S) -> list[Outcome]:
    """Every check against ``url``; ``node``: one server behind ``url``'s
    load balancer, for the checks a proxy in the way spoils; ``revocation``:
    what the revocation check needs (else it is skipped)."""
    proxy = await KitProxy(*target_of(url)).start()
    node_proxy = await KitProxy(*target_of(node)).start() if node else None
    outcomes: list[Outcome] = []
    try:
        for name, check in CHECKS:
            kit = Kit(proxy, token, node_proxy, revocation)
            bound = timeout_s + EXTRA_TIME_S.get(name, 0.0)
            try:
                why = await asyncio.wait_for(check(kit), bound)
                outcomes.append(Outcome(name, "pass", why))
            except Skipped as exc:
                outcomes.append(Outcome(name, "skip", str(exc)))
            except CheckFailed as exc:
                outcomes.append(Outcome(name, "fail", str(exc)))
            except TimeoutError:
                outcomes.append(Outcome(name, "fail", f"did not finish within {bound:g} s"))
            except (OSError, ConnectionClosed) as exc:
                outcomes.append(Outcome(name, "fail", f"connection: {exc}"))
            except Exception as exc:  # a target's odd answer is a failed check
                outcomes.append(Outcome(name, "fail", f"{type(exc).__name__}: {exc}"[:200]))
            finally:
                await kit.close_all()
                for used in {proxy, kit.node_proxy}:
                    used.cut_all()
                    used.flowing.set()
    finally:
        await proxy.stop()
        if node_proxy is not None:
            await node_proxy.stop()
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    width = max(len(o.name) for o in outcomes)
    lines = [f"{'check':<{width}}  result  why"]
    lines += [f"{o.name:<{width}}  {o.result:<6}  {o.why}" for o in outcomes]
    counts = {r: sum(o.result == r for o in outcomes) for r in ("pass", "fail", "skip")}
    lines.append(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    return "\n".join(lines)
