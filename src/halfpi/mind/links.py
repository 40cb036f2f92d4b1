"""One-time sign-in links for the web face (``halfpi face link``, docs/faces.md).

A link is ``http://HOST:PORT/#link=CODE``. The code is 128 random bits,
lives ``ttl_s`` (5 minutes by default) and works once: the page posts it to
``POST /v1/web/link`` and gets back the token of a **new** Face credential,
minted at that moment with the label, profile and scopes the link was made
for. So:

- nothing secret is at rest: ``HOME/links/<sha256(code)>`` (0600, in a 0700
  directory) holds only what the credential will be and when the link
  expires; the code itself is printed once and never stored;
- the code travels in the URL's *fragment*, which a browser never sends to
  a server (no access log, no ``Referer`` holds it), and the page removes it
  from the address bar before it posts it;
- a link is claimed by renaming its file (atomic: of two redemptions racing,
  one gets it), then deleted whatever happens next, so it never works twice;
- every browser gets its own credential (``halfpi face list`` shows it,
  ``halfpi face revoke LABEL`` closes that browser alone).

The file is written by the CLI (another process) and read by the Mind on
the same home, like the credential table.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halfpi.core.scopes import scopes_for
from halfpi.errors import InvalidRequest, LabelInUse, Unauthorized
from halfpi.mind.auth import make_credential
from halfpi.private import private_dir, write_private

if TYPE_CHECKING:
    from halfpi.mind.service import Mind

LINK_DIR = "links"
DEFAULT_TTL_S = 300.0
CODE_BYTES = 16  # 128 bits: guessing one in its five minutes is hopeless
LINK_CODE_PATTERN = "^[A-Za-z0-9_-]{16,64}$"
_CODE = re.compile(LINK_CODE_PATTERN)


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


@dataclass(frozen=True)
class Link:
    """What a redeemed link makes: a Face credential like ``halfpi face add``'s."""

    label: str
    profile: str
    scopes: frozenset[str]
    expires_at: float


def create_link(
    home: Path,
    label: str,
    profile: str,
    now: float,
    *,
    ttl_s: float = DEFAULT_TTL_S,
    extra_scopes: tuple[str, ...] = (),
    approve: bool = False,
) -> str:
    """Record a link on ``home`` and return its code (shown once). Raises
    ValueError for an unknown profile or scope."""
    scopes = scopes_for(profile, extra_scopes, approve=approve)
    forget_expired(home, now)  # links nobody used do not pile up
    code = secrets.token_urlsafe(CODE_BYTES)
    record = {
        "label": label,
        "profile": profile,
        "scopes": sorted(scopes),
        "expires_at": now + ttl_s,
    }
    write_private(private_dir(home / LINK_DIR) / code_hash(code), json.dumps(record).encode())
    return code


def claim_link(home: Path, code: str, now: float) -> Link:
    """Take the link of ``code`` off ``home`` (it never works again) and say
    what it makes. Unauthorized when there is no such link (never made,
    already used) or it has expired."""
    if not _CODE.match(code):
        raise InvalidRequest("a link code is 16-64 URL-safe characters", field="code")
    path = home / LINK_DIR / code_hash(code)
    claimed = path.with_name(path.name + f".claimed.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        os.rename(path, claimed)  # atomic: one redemption wins
    except FileNotFoundError:
        raise Unauthorized("this sign-in link was already used or never existed") from None
    try:
        record = json.loads(claimed.read_text())
    finally:
        with contextlib.suppress(OSError):
            claimed.unlink()
    link = Link(
        label=str(record["label"]),
        profile=str(record["profile"]),
        scopes=frozenset(record["scopes"]),
        expires_at=float(record["expires_at"]),
    )
    if now >= link.expires_at:
        raise Unauthorized("this sign-in link has expired; make a new one with halfpi face link")
    return link


def forget_expired(home: Path, now: float) -> int:
    """Delete the links on ``home`` that expired unused; how many."""
    gone = 0
    folder = home / LINK_DIR
    if not folder.is_dir():
        return 0
    for path in folder.iterdir():
        with contextlib.suppress(OSError, ValueError, KeyError):
            if float(json.loads(path.read_text())["expires_at"]) <= now:
                path.unlink()
                gone += 1
    return gone


@dataclass(frozen=True)
class Redeemed:
    token: str
    label: str
    principal_id: str


async def redeem_link(mind: Mind, code: str) -> Redeemed:
    """Redeem ``code`` on this Mind's home: a new Face credential, its token
    returned once (only its hash is stored, as for ``halfpi face add``)."""
    link = claim_link(mind.config.home, code, mind.wall())
    credential, token = make_credential("face", link.label, link.profile, link.scopes, mind.wall())
    try:
        await mind.store.add_credential(credential)
    except LabelInUse:
        raise Unauthorized(
            f"a live credential is already labelled {link.label!r}; make a new link "
            "with another --label"
        ) from None
    await mind.refresh_credentials()
    return Redeemed(token=token, label=credential.label, principal_id=credential.principal_id)
