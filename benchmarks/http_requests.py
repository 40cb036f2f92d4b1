"""What an authenticated HTTP request costs the Mind, against another tree.

Every request through the HTTP door authenticates its bearer, and a known
token's check reads the credentials version from the Store unless the
Mind's view is fresher than 0.1 s (requests that arrive together share one
read), so that a token revoked by the CLI or on another node is refused
from 0.1 s after on (docs/protocol.md §2 and §18).
This measures that read where it runs: ``GET /v1/welcome`` (authenticate,
then a small JSON body; nothing else touches the Store) sent by 1 and by 16
concurrent keep-alive clients, on this tree's Mind and on a Mind built from
``--against BASE_SRC`` (e.g. a copy of ``src`` with the re-read removed,
put first on PYTHONPATH), rounds alternating, both on the embedded default
(SQLite).

The figure is the server's CPU per request (every thread of the Mind, from
/proc): the clients (httpx, in this process) saturate first, so requests/s
says more about them than about the Mind and is shown only as context.

    python benchmarks/http_requests.py --against /tmp/no-reread/src [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx
from _bench import (
    CpuWindow,
    MindServer,
    figure,
    python_of,
    stop_all,
    summary_table,
    workdir,
    write_json,
)

PATH = "/v1/welcome"


async def round_of(server: MindServer, clients: int, requests: int) -> dict[str, Any]:
    """``requests`` GETs spread over ``clients`` concurrent keep-alive clients."""
    url = f"http://127.0.0.1:{server.ready['port']}{PATH}"
    headers = {"Authorization": f"Bearer {server.token}"}
    each = requests // clients
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as http:

        async def client() -> None:
            for _ in range(each):
                answer = await http.get(url, headers=headers)
                if answer.status_code != 200:
                    raise RuntimeError(f"{PATH} answered {answer.status_code}: {answer.text}")

        await asyncio.gather(*(client() for _ in range(clients)))  # connections warm
        with CpuWindow(server.pid) as window:
            await asyncio.gather(*(client() for _ in range(clients)))
    done = each * clients
    return {
        **window.as_dict(),
        "requests_per_s": done / window.wall,
        "server_us_per_request": window.server / done * 1e6,
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with workdir("halfpi-http-requests-") as tmp:
        ours = MindServer(tmp / "this", delta_ms=0).start()
        base = MindServer(tmp / "against", delta_ms=0,
                          python=python_of(args.against)).start()
        try:
            for clients in args.clients:
                runs: dict[str, list[dict[str, Any]]] = {"this": [], "against": []}
                for index in range(args.rounds):
                    sides = (("this", ours), ("against", base))
                    for name, server in sides if index % 2 == 0 else sides[::-1]:
                        runs[name].append(await round_of(server, clients, args.requests))
                note = (f"{clients} keep-alive client(s), {args.requests:,} GET {PATH} per round; "
                        f"baseline: the Mind from {args.against}")
                rows.append(figure(
                    "http_requests", f"server CPU per authenticated request, {clients} client(s)",
                    "µs", runs["this"], runs["against"], "server_us_per_request",
                    lower_is_better=True, note=note, refuse_when_load_bound=False))
                rows.append(figure(
                    "http_requests", f"requests/s, {clients} client(s) (context: client-bound)",
                    "req/s", runs["this"], runs["against"], "requests_per_s", note=note,
                    refuse_when_load_bound=False))
        finally:
            await stop_all(ours, base)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, metavar="BASE_SRC",
                        help="a src folder whose Mind is the baseline (first on PYTHONPATH)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds; each round's requests as in the full run")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if args.quick:  # fewer rounds only: a round's work is what the figure means
        args.rounds = min(args.rounds, 3)
    rows = asyncio.run(main_async(args))
    print(summary_table(rows, "Authenticated HTTP requests (ratio = this tree / baseline)"))
    write_json(args.json, rows, {"against": args.against})


if __name__ == "__main__":
    main()
