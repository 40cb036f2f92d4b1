"""The Mind's Prometheus metrics (``GET /metrics``, docs/operations.md).

Nothing here runs per delivered event. The Mind's parts count in plain
ints where they already do work — :class:`MindMetrics` (an actor's
publication, a chat's end, a failed handshake, a closed connection), the
request registry, the approvals, the Hand registry, the Store's writer —
and every connection's queue already numbers what it writes. A scrape
reads all of it through :class:`MindCollector`, a custom collector that
builds the metric families then (``prometheus_client``'s
``GaugeMetricFamily``/``CounterMetricFamily``/``HistogramMetricFamily``).

Every name starts ``halfpi_``; the dashboard in docs/operations.md uses
them, and a test scrapes a real Mind for each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from halfpi import __version__
from halfpi.core.metrics import Histogram
from halfpi.mind.connections import profile_of, transport_of
from halfpi.mind.counters import ClusterCounts

if TYPE_CHECKING:
    from halfpi.mind.service import Mind


def _histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=histogram.cumulative(),
                                 sum_value=histogram.sum)


def _by(family: GaugeMetricFamily | CounterMetricFamily,
        counts: dict[str, int] | Counter[str]) -> GaugeMetricFamily | CounterMetricFamily:
    for label, value in sorted(counts.items()):
        family.add_metric([label], value)
    return family


def _counters(*rows: tuple[str, str, int]) -> Iterator[Metric]:
    """Counters without labels: (name, help, value) each."""
    for name, doc, value in rows:
        yield CounterMetricFamily(name, doc, value=value)


def _cluster(part: ClusterCounts) -> Iterator[Metric]:
    """A cluster node's own metrics (docs/cluster.md)."""
    yield GaugeMetricFamily("halfpi_cluster_leases_held",
                            "Conversations this node owns (their leases held)",
                            value=part.leases_held)
    yield GaugeMetricFamily("halfpi_cluster_replicas",
                            "Conversations owned elsewhere that this node follows",
                            value=part.replicas)
    yield _by(CounterMetricFamily("halfpi_cluster_forwards",
                                  "Calls forwarded to a conversation's owner, by outcome "
                                  "(answered, unavailable)", labels=["outcome"]), part.forwards)
    yield from _counters(
        ("halfpi_cluster_takeovers",
         "Conversations taken over from a node whose lease was gone", part.takeovers),
        ("halfpi_cluster_step_downs",
         "Conversations given up: a lease lost or a write fenced out", part.step_downs),
        ("halfpi_cluster_malformed_messages",
         "Messages on the cluster's channels that were not a node's", part.malformed),
    )


class MindCollector(Collector):
    """Reads one Mind when scraped."""

    def __init__(self, mind: Mind) -> None:
        self.mind = mind

    def collect(self) -> Iterator[Metric]:
        mind = self.mind
        metrics = mind.env.metrics
        info = GaugeMetricFamily("halfpi_info", "This Mind: its halfpi version and node",
                                 labels=["version", "node_id"])
        info.add_metric([__version__, str(mind.node_id)], 1)
        yield info

        connections: Counter[tuple[str, str]] = Counter()
        subscriptions = delivered = coalesced = shed = 0
        depth: Counter[str] = Counter()
        depth_bytes: Counter[str] = Counter()
        for conn in mind.connections:
            connections[(transport_of(conn), profile_of(conn))] += 1
            subscriptions += len(conn.subscriptions.by_conversation)
            queue = conn.queue
            delivered += queue.event_seq
            coalesced += queue.coalesced
            shed += queue.shed
            depth["reliable"] += queue.reliable_count
            depth["transient"] += queue.transient_count
            depth_bytes["reliable"] += queue.reliable_bytes
            depth_bytes["transient"] += queue.transient_bytes
        family = GaugeMetricFamily("halfpi_connections", "Open connections",
                                   labels=["transport", "profile"])
        for (transport, profile), count in sorted(connections.items()):
            family.add_metric([transport, profile], count)
        yield family
        yield GaugeMetricFamily("halfpi_subscriptions",
                                "Conversation subscriptions of open connections",
                                value=subscriptions)
        yield GaugeMetricFamily("halfpi_conversations_loaded",
                                "Conversations with an actor in memory", value=mind.loaded())
        yield CounterMetricFamily("halfpi_events_published",
                                  "Messages published by conversations (once each)",
                                  value=metrics.published)
        yield CounterMetricFamily("halfpi_messages_delivered",
                                  "Messages written to connections (each subscriber counts)",
                                  value=delivered + metrics.closed_delivered)
        yield _by(GaugeMetricFamily("halfpi_queue_messages",
                                    "Messages waiting in connection queues, by class",
                                    labels=["class"]), depth)
        yield _by(GaugeMetricFamily("halfpi_queue_bytes",
                                    "Bytes waiting in connection queues, by class",
                                    labels=["class"]), depth_bytes)
        yield CounterMetricFamily("halfpi_deltas_coalesced",
                                  "Reply deltas merged into a queued one under pressure",
                                  value=coalesced + metrics.closed_coalesced)
        yield CounterMetricFamily("halfpi_progress_shed",
                                  "Tool progress messages dropped from full queues",
                                  value=shed + metrics.closed_shed)
        yield _by(CounterMetricFamily("halfpi_resets",
                                      "face.reset sent to a Face, by reason",
                                      labels=["reason"]), metrics.resets)
        yield _by(CounterMetricFamily("halfpi_evictions",
                                      "Connections closed as slow consumers, by transport",
                                      labels=["transport"]), metrics.evictions)
        registry = mind.registry
        requests = CounterMetricFamily("halfpi_requests",
                                       "Requests by what the registry did with them",
                                       labels=["outcome"])
        requests.add_metric(["admitted"], registry.admitted)
        requests.add_metric(["replayed"], registry.replayed)
        requests.add_metric(["conflict"], registry.conflicts)
        yield requests
        store = mind.store
        commit = getattr(store, "commit_seconds", None)
        if isinstance(commit, Histogram):
            yield _histogram("halfpi_store_commit_seconds",
                             "Time of one group commit (its transaction and fsync)", commit)
        yield _by(CounterMetricFamily("halfpi_chats", "Chats ended, by status",
                                      labels=["status"]), metrics.chats)
        yield _histogram("halfpi_chat_seconds", "Chats from admission to their end",
                         metrics.chat_seconds)
        yield _by(CounterMetricFamily("halfpi_approvals", "Approvals settled, by status",
                                      labels=["status"]), mind.approvals.settled)
        yield GaugeMetricFamily("halfpi_approvals_waiting", "Approvals waiting for a decision",
                                value=len(mind.approvals.live))
        running: Counter[str] = Counter(run.state for run in list(mind.hands.runs.values()))
        yield _by(GaugeMetricFamily("halfpi_hand_runs", "Tool runs on Hands now, by state",
                                    labels=["state"]), running)
        yield _by(CounterMetricFamily("halfpi_hand_runs_ended", "Tool runs ended, by state",
                                      labels=["state"]), mind.hands.finished)
        yield GaugeMetricFamily("halfpi_hands_connected", "Hands connected now",
                                value=sum(1 for h in mind.hands.hands.values()
                                          if h.link is not None))
        yield _by(CounterMetricFamily("halfpi_provider_tokens",
                                      "Model tokens reported for ended replies, by kind",
                                      labels=["kind"]), metrics.tokens)
        yield _by(CounterMetricFamily("halfpi_chat_errors",
                                      "Replies that ended with an error code (provider_error "
                                      "is the model provider's), by code",
                                      labels=["code"]), metrics.chat_errors)
        journal_bytes = getattr(mind.journal, "total_bytes", None)
        if isinstance(journal_bytes, int):
            yield GaugeMetricFamily("halfpi_journal_bytes",
                                    "Bytes the in-process journal keeps", value=journal_bytes)
        written = getattr(mind.journal, "written_bytes", None)
        if isinstance(written, int):
            yield CounterMetricFamily("halfpi_journal_written_bytes",
                                      "Bytes of encoded entries sent to the Redis journal",
                                      value=written)
        if mind.cluster is not None:
            yield from _cluster(mind.cluster.counts())
        tasks = mind.tasks
        yield from _counters(
            ("halfpi_tasks_admitted", "Background tasks admitted", tasks.admitted),
            ("halfpi_task_deliveries", "hand.task.deliver messages sent (first ones and retries)",
             tasks.deliveries),
        )
        yield _by(CounterMetricFamily("halfpi_tasks_ended",
                                      "Background tasks that ended here, by state",
                                      labels=["state"]), tasks.ended)
        yield _by(CounterMetricFamily("halfpi_handshakes_failed",
                                      "Handshakes refused for their token, by kind",
                                      labels=["kind"]), metrics.handshakes_failed)
        yield CounterMetricFamily("halfpi_handshakes_throttled",
                                  "Handshakes refused unchecked while their address waits",
                                  value=metrics.handshakes_throttled)
        yield _by(CounterMetricFamily("halfpi_tool_output_redactions",
                                      "Secrets redacted from tool output before it was stored "
                                      "or shown (by the Mind or its Hand), by kind",
                                      labels=["kind"]), mind.redaction.counts)
