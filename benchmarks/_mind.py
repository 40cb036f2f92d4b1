"""``halfpi mind`` with Config fields the command line does not expose.

    python benchmarks/_mind.py '{"heartbeat_s": 3600}'

Runs the same ``serve()`` as ``halfpi mind --port 0`` (home from
``HALFPI_HOME``, pace from ``HALFPI_SCRIPTED_DELTA_MS``) with the given
overrides; used by the idle benchmark to hold heartbeats off.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys

from halfpi.config import Config, default_home, env_delta_ms
from halfpi.process import serve

try:  # the loop `halfpi mind` runs on (HALFPI_LOOP); a tree before it: asyncio's
    from halfpi.loop import run
except ImportError:
    run = asyncio.run


def main() -> None:
    overrides = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    config = Config(home=default_home(), port=0, scripted_delta_ms=env_delta_ms(),
                    max_connections_per_principal=0)  # benchmarks open 10,000 with one token
    config = dataclasses.replace(config, **overrides)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):
        run(serve(config))


if __name__ == "__main__":
    main()
