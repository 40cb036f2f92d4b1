"""The project's own source, parsed for the tests that read it (layering,
purity, private names).

CPython 3.11 (before 3.11.8) can leave ``ast.parse``'s recursion counter
wrong when a finalizer runs in the middle of a parse and raises — a garbage
collection that meets an object left by an earlier test, e.g. an event
loop's subprocess transport whose loop is closed. The parse then fails with
``SystemError: AST constructor recursion depth mismatch``, and so does every
later one in the process (pytest's own tracebacks included). Collect first,
and parse with the collector held off, so that no finalizer runs inside.
"""

from __future__ import annotations

import ast
import gc


def parse(source: str) -> ast.Module:
    gc.collect()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        gc.enable()
