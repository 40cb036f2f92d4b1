"""A plain install (``pip install halfpi``, no extras) simulated in a child
process: an import blocker refuses every optional dependency, as a machine
that never installed them would.

:func:`plain_env` writes a ``sitecustomize.py`` that puts a
``sys.meta_path`` finder in front of every other one, and returns the
environment that makes each child Python (the Mind, its local Hand, a
Face) load it first. The finder refuses a blocked package the way a missing
one fails (``ModuleNotFoundError`` naming it), so code that imports an extra
on a path that does not need it fails the test.
"""

from __future__ import annotations

import os
from pathlib import Path

# What `pip install halfpi` does not install (pyproject.toml's extras). Not
# uvicorn: a core dependency, which the native server imports in the
# background once it listens (process.build_http_door_ahead).
BLOCKED = ("redis", "asyncpg", "openai", "textual", "playwright")

_SITECUSTOMIZE = '''\
import sys

BLOCKED = frozenset({blocked!r})


class _Refuse:
    """Finds nothing for a blocked package: its import fails as if missing."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
'''


def plain_env(where: Path, blocked: tuple[str, ...] = BLOCKED) -> dict[str, str]:
    """The environment of a child Python that cannot import ``blocked``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(blocked=tuple(blocked)))
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=f"{where}{os.pathsep}{path}" if path else str(where))
