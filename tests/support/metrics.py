"""What a scrape of a Mind's /metrics would say, read from its collector
(``mind/metrics.py``) in the test's process."""

from __future__ import annotations

from halfpi.mind.metrics import MindCollector
from halfpi.mind.service import Mind


def samples(mind: Mind, prefix: str, label: str) -> dict[tuple[str, str], float]:
    """Every sample whose name starts with ``prefix``: (its name, the value
    of its ``label``, "" without one) → its value."""
    return {(sample.name, sample.labels.get(label, "")): sample.value
            for family in MindCollector(mind).collect()
            for sample in family.samples if sample.name.startswith(prefix)}
