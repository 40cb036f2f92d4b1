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

import msgspec

from halfpi.core.events import (
    ApprovalPending,
    ApprovalSettled,
    ConversationInfo,
    ConversationNews,
)

# The session-level messages the lists fold (docs/protocol.md §16).
News = ConversationNews | ApprovalPending | ApprovalSettled
NEWS: dict[str, type[News]] = {
    "face.conversation.changed": ConversationNews,
    "face.approval.pending": ApprovalPending,
    "face.approval.settled": ApprovalSettled,
}


class LiveLists:
    def __init__(self) -> None:
        # conversation id -> the conversation, newest first (created_at, then id)
        self.conversations: dict[str, ConversationInfo] = {}
        # approval id -> its summary (never its arguments)
        self.approvals: dict[str, ApprovalPending] = {}
        self._news: dict[str, ConversationInfo] | None = None  # news during a list read

    def reading_conversations(self) -> None:
        """A ``face.conversation.list`` is on its way: remember news meanwhile."""
        self._news = {}

    def conversations_read(self, rows: list[ConversationInfo] | None) -> None:
        """Its answer (None: it failed). Conversations never vanish, so the
        ones known beyond the first page stay."""
        news, self._news = self._news or {}, None
        if rows is None:
            return
        fresh = {row.id: _named(row, self.conversations.get(row.id)) for row in rows}
        fresh.update(news)
        for cid, known in self.conversations.items():
            fresh.setdefault(cid, known)
        self._keep(fresh)

    def approvals_read(self, rows: list[ApprovalPending]) -> None:
        self.approvals = {row.approval_id: row for row in rows}

    def apply(self, news: News) -> str:
        """Fold one session-level message; returns the conversation it is about."""
        if isinstance(news, ConversationNews):
            conversation = _named(news.conversation, self.conversations.get(news.conversation.id))
            cid = conversation.id
            self._keep({**self.conversations, cid: conversation})
            if self._news is not None:
                self._news[cid] = conversation
            return cid
        if isinstance(news, ApprovalPending):
            self.approvals[news.approval_id] = news
        else:
            self.approvals.pop(news.approval_id, None)
        return news.conversation_id

    def _keep(self, conversations: dict[str, ConversationInfo]) -> None:
        newest = sorted(conversations.values(), key=lambda c: (c.created_at, c.id), reverse=True)
        self.conversations = {c.id: c for c in newest}


def _named(row: ConversationInfo, known: ConversationInfo | None) -> ConversationInfo:
    """``row``, its name kept from ``known`` when it does not say one."""
    if row.name is not msgspec.UNSET:
        return row
    return msgspec.structs.replace(row, name=None if known is None else known.name)
