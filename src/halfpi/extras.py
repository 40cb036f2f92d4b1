"""Optional dependencies: what ``pip install halfpi`` leaves out, and the one
line that names the extra to install when a feature needs it.

The embedded default — SQLite, the scripted agent, the native server, the
web face, the headless face — needs only the core dependencies; each
package below is imported only where its feature is used (pyproject.toml
says why each one is optional). A feature calls :func:`need` before it
starts, so a missing package is one line (``halfpi: the terminal face needs
textual: pip install 'halfpi[face]'``) and not a traceback from deep inside.
"""

from __future__ import annotations

import importlib

# Each optional package and the extra that installs it (pyproject.toml).
EXTRA = {
    "textual": "face",
    "openai": "openai",
    "redis": "cluster",
    "asyncpg": "postgresql",
}


class MissingExtra(Exception):
    """A feature's optional package is not installed."""

    def __init__(self, feature: str, package: str) -> None:
        super().__init__(f"{feature} needs {package}: pip install 'halfpi[{EXTRA[package]}]'")
        self.package = package


def need(package: str, feature: str) -> None:
    """Import ``package`` now (the feature is about to), or say which extra
    brings it."""
    try:
        importlib.import_module(package)
    except ImportError:
        raise MissingExtra(feature, package) from None


def missing(exc: ModuleNotFoundError) -> MissingExtra | None:
    """The extra behind an import that failed on a path no :func:`need`
    guarded; None when the missing module is not an optional one."""
    package = (exc.name or "").partition(".")[0]
    return MissingExtra("this command", package) if package in EXTRA else None
