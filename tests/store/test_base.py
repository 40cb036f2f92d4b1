"""The Store seam's value objects (``store/base.py``)."""

from __future__ import annotations

import dataclasses

import pytest

from halfpi.store.base import StoredEvent, WriteTx

WRITE_FIELDS = [f.name for f in dataclasses.fields(WriteTx)]


def test_a_plain_event_append_is_only_events() -> None:
    assert WriteTx(events=[StoredEvent("c_1", 1, "chat.message", b"{}", 1.0)]).only_events
    assert WriteTx().only_events  # nothing at all: nothing but events


@pytest.mark.parametrize("name", [n for n in WRITE_FIELDS if n != "events"])
def test_a_write_carrying_anything_but_events_is_not_only_events(name: str) -> None:
    """Every field of WriteTx, today's and any added later: the writer merges
    only-events writes into one insert and applies nothing else of them, so
    a new kind of write mistaken for an append would be silently lost."""
    carrying = WriteTx(**{name: [object()]})  # type: ignore[arg-type]
    assert not carrying.only_events
    with_events = WriteTx(  # type: ignore[arg-type]
        events=[StoredEvent("c_1", 1, "chat.message", b"{}", 1.0)], **{name: [object()]}
    )
    assert not with_events.only_events
