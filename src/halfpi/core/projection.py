"""Tool visibility (DESIGN §6, revision 3): what a Face may see of a tool call.

Pure functions. The full arguments of a tool call exist only in memory on
their way to a Hand; what is stored and shown is their *projection*:

- per-field rules of the tool (``show`` | ``mask`` | ``hide`` | ``preview``),
- the central rule: any key named like a secret (``password``, ``token``,
  ``api_key``, ``application_key``, ``private_key``, ``secret``) is masked at
  any depth (``config.token``, ``items[0].password``),
- scanners that look for secret-shaped values only *warn* (the warning names
  the path, never the value),
- and a size bound (256 KiB) on the projected JSON.

A ``summary`` admission stores no projection at all, only the digest; a
transparent projection is downgraded for summary viewers, never the reverse
(I9): each event's ``summary()`` in ``core/events.py``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

MASK = "***"
PREVIEW_CHARS = 256
MAX_PROJECTED_BYTES = 256 * 1024
MAX_DISPLAY_OUTPUT = 1024 * 1024

SECRET_KEYS = frozenset(
    {"password", "token", "api_key", "application_key", "private_key", "secret"}
)

_SCANNERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private_key_block", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("aws_access_key", re.compile(r"\bAKIA[0-9A-Z]{16}\b")),
    ("bearer_token", re.compile(r"\b[Bb]earer\s+[A-Za-z0-9._~+/-]{20,}")),
    ("github_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b")),
)

_encode = msgspec.json.Encoder(order="sorted")


def canonical_digest(value: Any) -> str:
    """sha256 over canonical JSON: the same arguments always give the same digest."""
    return "sha256:" + hashlib.sha256(_encode.encode(value)).hexdigest()


_SECRET_SUFFIXES = tuple(k.replace("_", "") for k in SECRET_KEYS)


def is_secret_key(key: str) -> bool:
    """A key names a secret if, ignoring case and separators, it is or ends
    with one of the secret names: ``token``, ``access_token``, ``apiKey``,
    ``client-secret``, ``DB_PASSWORD``."""
    folded = "".join(ch for ch in key.lower() if ch.isalnum())
    return folded.endswith(_SECRET_SUFFIXES)


@dataclass(frozen=True, slots=True)
class Projection:
    args: Any  # the projected arguments (JSON-able), or None when hidden entirely
    digest: str  # over the full, unprojected arguments
    warnings: tuple[str, ...]  # scanner findings: "<path>: <kind>"
    truncated: bool


def project_args(args: Mapping[str, Any], rules: Mapping[str, str] | None = None) -> Projection:
    """Project a tool call's arguments for display and storage."""
    rules = rules or {}
    warnings: list[str] = []
    projected: dict[str, Any] = {}
    for key, value in args.items():
        rule = "mask" if is_secret_key(key) else rules.get(key, "show")
        if rule == "hide":
            continue
        if rule == "mask":
            projected[key] = MASK
            continue
        shown = _mask_deep(value, key, warnings)
        if rule == "preview":
            shown = _preview(shown)
        projected[key] = shown
    truncated = False
    if len(_encode.encode(projected)) > MAX_PROJECTED_BYTES:
        projected = {
            "_truncated": _preview(_encode.encode(projected).decode(), MAX_PROJECTED_BYTES // 2)
        }
        truncated = True
    return Projection(projected, canonical_digest(dict(args)), tuple(warnings), truncated)


def _mask_deep(value: Any, path: str, warnings: list[str]) -> Any:
    if isinstance(value, Mapping):
        return {
            str(k): MASK if is_secret_key(str(k)) else _mask_deep(v, f"{path}.{k}", warnings)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_mask_deep(v, f"{path}[{i}]", warnings) for i, v in enumerate(value)]
    if isinstance(value, str):
        for kind, pattern in _SCANNERS:
            if pattern.search(value):
                warnings.append(f"{path}: {kind}")
    return value


def _preview(value: Any, limit: int = PREVIEW_CHARS) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    if not isinstance(value, str):
        text = _encode.encode(value).decode()
        return text if len(text) <= limit else text[:limit] + "…"
    return value


def truncate_output(data: bytes, limit: int = MAX_DISPLAY_OUTPUT) -> tuple[str, bool]:
    """Decode output for display, at most ``limit`` bytes; lengths and digests
    are always computed over the full output elsewhere."""
    truncated = len(data) > limit
    return data[:limit].decode("utf-8", errors="replace"), truncated
