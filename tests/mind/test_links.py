"""One-time sign-in links (``mind/links.py``): stored without the code,
claimed once, expired links refused and forgotten."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from halfpi.errors import Unauthorized
from halfpi.mind.links import LINK_DIR, claim_link, create_link, forget_expired


def test_a_link_is_stored_privately_without_its_code(tmp_path: Path) -> None:
    code = create_link(tmp_path, "tablet", "observer", 1000.0, ttl_s=60)
    (entry,) = (tmp_path / LINK_DIR).iterdir()
    assert code not in entry.name and code not in entry.read_text()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / LINK_DIR).stat().st_mode) == 0o700
    link = claim_link(tmp_path, code, 1059.0)
    assert (link.label, link.profile, link.expires_at) == ("tablet", "observer", 1060.0)
    assert "face:chat" not in link.scopes


def test_of_many_racing_claims_of_one_link_exactly_one_wins(tmp_path: Path) -> None:
    code = create_link(tmp_path, "t", "operator", 0.0)

    def claim(_: int) -> bool:
        try:
            claim_link(tmp_path, code, 1.0)
        except Unauthorized:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(claim, range(16))) == [False] * 15 + [True]


def test_an_expired_link_is_refused_even_once(tmp_path: Path) -> None:
    code = create_link(tmp_path, "t", "operator", 0.0, ttl_s=10)
    with pytest.raises(Unauthorized, match="expired"):
        claim_link(tmp_path, code, 10.0)
    with pytest.raises(Unauthorized, match="already used"):
        claim_link(tmp_path, code, 1.0)


def test_expired_links_are_forgotten_and_live_ones_kept(tmp_path: Path) -> None:
    create_link(tmp_path, "a", "operator", 0.0, ttl_s=10)
    live = create_link(tmp_path, "b", "operator", 0.0, ttl_s=100)
    assert forget_expired(tmp_path, 50.0) == 1
    assert claim_link(tmp_path, live, 50.0).label == "b"


def test_an_unknown_profile_makes_no_link(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown profile"):
        create_link(tmp_path, "t", "admin", 0.0)
    assert not (tmp_path / LINK_DIR).exists()
