"""The two lists a Face keeps that no subscription covers (docs/protocol.md §16).

``LiveLists`` is plain state, no I/O: the client feeds it what it read after a
(re)connect (``face.conversation.list``, ``face.approval.list``) and the
session-level news (``face.conversation.changed``, ``face.approval.pending``,
``face.approval.settled``), and reads the lists back.

Ordering: the Mind answers ``face.approval.list`` synchronously in its own
order with the news, so that answer replaces the approvals and later news
applies on top. ``face.conversation.list`` is read from the store
asynchronously, so news that arrives while that read is on its way is newer
than the read and wins over it.
"""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]

NEWS = frozenset({"face.conversation.changed", "face.approval.pending", "face.approval.settled"})


class LiveLists:
    def __init__(self) -> None:
        # conversation id -> {id, name, created_at}
        self.conversations: dict[str, Row] = {}
        # approval id -> {conversation_id, approval_id, request_id, tool, reason, expires_at}
        self.approvals: dict[str, Row] = {}
        self._news: dict[str, Row] | None = None  # conversation news during a list read

    def conversation_list(self) -> list[Row]:
        """Newest first."""
        return sorted(
            self.conversations.values(),
            key=lambda c: (c.get("created_at") or 0.0, c["id"]),
            reverse=True,
        )

    def reading_conversations(self) -> None:
        """A ``face.conversation.list`` is on its way: remember news meanwhile."""
        self._news = {}

    def conversations_read(self, rows: list[Row] | None) -> None:
        """Its answer (None: it failed). Conversations never vanish, so the
        ones known beyond the first page stay."""
        news, self._news = self._news or {}, None
        if rows is None:
            return
        fresh = {row["id"]: dict(row) for row in rows}
        fresh.update(news)
        for cid, known in self.conversations.items():
            fresh.setdefault(cid, known)
        self.conversations = fresh

    def approvals_read(self, rows: list[Row]) -> None:
        self.approvals = {row["approval_id"]: dict(row) for row in rows}

    def apply(self, type_: str, payload: dict[str, Any]) -> str | None:
        """Fold one session-level message; returns the conversation it is
        about, or None if ``type_`` is not one of them."""
        if type_ not in NEWS:
            return None
        body = {k: v for k, v in payload.items() if k != "event_seq"}
        if type_ == "face.conversation.changed":
            conversation = dict(body["conversation"])
            cid = str(conversation["id"])
            self.conversations[cid] = conversation
            if self._news is not None:
                self._news[cid] = conversation
            return cid
        if type_ == "face.approval.pending":
            self.approvals[body["approval_id"]] = body
        else:
            self.approvals.pop(body["approval_id"], None)
        return str(body["conversation_id"])
