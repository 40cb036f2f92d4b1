"""The reconnect plan, pure: which URL next, how long to wait, what to say.

A client of the Mind (a Face, a Hand) dials its URLs in turn, forever,
waiting between attempts with full-jitter exponential backoff
(:func:`halfpi.core.backoff.backoff`, DESIGN §11: 0.25 s * 2^n, cap 30 s).
After a welcomed session the backoff starts over, so a Mind that comes back
after a restart is found again within the first short delays.

**Decision:** when every URL is on this machine (a loopback host) the cap is
2 s: a local Mind that went away is restarting, and its clients should be
back within two seconds of it, not thirty.

**Decision:** a client that found its Mind through the address file of the
Mind's home (``--home``: ``HOME/mind.json``) asks again before every dial
(``locate``): a Mind restarted with ``--port 0`` listens on a new port, and
its clients must follow it there instead of dialling the old one forever.

No asyncio and no clock here: time is an argument (``now``), the random
source is injectable, so every decision is tested without waiting.
:class:`~halfpi.client.reconnect.Reconnect` is the asyncio loop that follows
the plan.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from halfpi.core.backoff import backoff

# Backoff ceilings: DESIGN §11's 30 s for a Mind across a network; a Mind on
# this machine that went away is restarting, so it is tried every 2 s at most.
REMOTE_CAP_S = 30.0
LOCAL_CAP_S = 2.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

Delays = Callable[[], Iterator[float]]
# Where the Mind says it is now (its address file), or None: nothing to say.
Locate = Callable[[], list[str] | None]


def is_local(url: str) -> bool:
    """True if ``url`` names this machine (a loopback host)."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    return host is not None and (host in LOCAL_HOSTS or host.startswith("127."))


def default_cap(urls: Iterable[str]) -> float:
    """The backoff ceiling for these URLs: 2 s if all are local, else 30 s."""
    urls = list(urls)
    return LOCAL_CAP_S if urls and all(is_local(url) for url in urls) else REMOTE_CAP_S


@dataclass(frozen=True, slots=True)
class Retry:
    """One wait before the next attempt: what failed, why, and until when.

    ``lost`` tells a welcomed session that ended from an attempt that never
    got that far; ``next_at`` is ``now + delay`` on the caller's clock.
    """

    url: str
    attempt: int
    delay: float
    next_at: float
    why: str
    lost: bool = False


class Redial:
    """The plan of one client: feed it what happened, it says what comes next."""

    def __init__(
        self,
        urls: str | Iterable[str],
        *,
        delays: Delays | None = None,
        rng: random.Random | None = None,
        max_delay_s: float | None = None,
        locate: Locate | None = None,
    ) -> None:
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls:
            raise ValueError("no URL to dial")
        self.max_delay_s = default_cap(self.urls) if max_delay_s is None else max_delay_s
        rng = rng or random.Random()
        self._fresh: Delays = delays or (lambda: backoff(cap=self.max_delay_s, rng=rng))
        self._delays = self._fresh()
        self._turn = itertools.cycle(self.urls)
        self.url = self.urls[0]  # the one being dialed, or connected to
        self.attempt = 0  # failures since the last welcomed session
        self._welcomed = False
        self._locate = locate
        self._located: list[str] | None = None

    def next_url(self) -> str:
        """The URL to dial now: the next one in turn (of where the Mind says
        it is now, when it can be asked)."""
        located = self._locate() if self._locate is not None else None
        if located and located != self._located:
            self._located = located
            self._turn = itertools.cycle(located)
        self.url = next(self._turn)
        return self.url

    def welcomed(self) -> None:
        """The Mind said welcome: the backoff starts over."""
        self.attempt = 0
        self._delays = self._fresh()
        self._welcomed = True

    def failed(self, why: str, now: float) -> Retry:
        """The attempt on :attr:`url` failed (or its session ended) ``why``."""
        self.attempt += 1
        delay = next(self._delays)
        lost, self._welcomed = self._welcomed, False
        return Retry(self.url, self.attempt, delay, now + delay, why, lost)


class Narrator:
    """What a log says about reconnecting: one line per change of reason.

    A client that cannot reach the Mind for an hour must not write a line
    per attempt; it says why once, again when the reason (or the URL's
    reason) changes, and once when it is back.
    """

    def __init__(self, what: str = "the Mind") -> None:
        self.what = what
        self._said: dict[str, str] = {}  # url -> the reason last said

    def failed(self, retry: Retry) -> str | None:
        if self._said.get(retry.url) == retry.why:
            return None
        self._said[retry.url] = retry.why
        if retry.lost:
            return (
                f"lost the connection to {self.what} at {retry.url}: {retry.why};"
                f" reconnecting in {retry.delay:.1f} s"
            )
        return (
            f"cannot reach {self.what} at {retry.url}: {retry.why};"
            f" retrying in {retry.delay:.1f} s (attempt {retry.attempt})"
        )

    def connected(self, url: str) -> str | None:
        """Back: one line, if a failure was said since the last success."""
        if not self._said:
            return None
        self._said.clear()
        return f"connected to {self.what} at {url}"
