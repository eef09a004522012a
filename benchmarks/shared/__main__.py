"""``python -m benchmarks.shared [--loop uvloop] [--seconds 3] [--clients 1,2,4] [--callers 64] [--only ...]``."""

from __future__ import annotations

import argparse
import platform

from benchmarks.shared import throughput, transfer
from benchmarks.shared.common import address

SIZES = [1024, 16 * 1024, 256 * 1024, 4 * 1024 * 1024, 64 * 1024 * 1024]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shared")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", default="1,2,4")
    parser.add_argument("--callers", type=int, default=64, help="callers per client process")
    parser.add_argument("--calls", type=int, default=5000, help="round trips of the latency measure")
    parser.add_argument("--repeat", type=int, default=9, help="round trips per size of the transfer measure")
    parser.add_argument("--only", choices=["throughput", "latency", "transfer"], default=None)
    args = parser.parse_args()
    print(f"# shared batcher, {args.loop}, Python {platform.python_version()}, {platform.machine()}")
    if args.only in (None, "throughput"):
        print("\n| clients | callers each | items/s | owner CPU µs/item | owner CPU busy |\n|---|---|---|---|---|")
        for n in [int(x) for x in args.clients.split(",")]:
            with address() as where:
                r = throughput.measure(where, args.loop, n, args.callers, args.seconds)
            print(
                f"| {n} | {args.callers} | {r['items_per_s']:,.0f} | {r['owner_cpu_us_per_item']:.1f} "
                f"| {100 * r['owner_cpu_share']:.0f} % |",
                flush=True,
            )
    if args.only in (None, "latency"):
        with address() as where:
            r = throughput.latency(where, args.loop, args.calls)
        print("\n| one caller | p50 µs | p99 µs |\n|---|---|---|")
        print(f"| the owner's own (no hop) | {r['local_p50_us']:.0f} | {r['local_p99_us']:.0f} |")
        print(f"| a client's (the hop) | {r['client_p50_us']:.0f} | {r['client_p99_us']:.0f} |")
        print(f"| the hop adds (p50) | {r['hop_p50_us']:.0f} | |", flush=True)
    if args.only in (None, "transfer"):
        with address() as where:
            results = transfer.measure(where, args.loop, SIZES, args.repeat)
        print("\n| array | pickle 5 out of band, ms | shared memory, ms | ratio |\n|---|---|---|---|")
        for size, (pickled, shm) in results.items():
            print(f"| {_size(size)} | {1e3 * pickled:.3f} | {1e3 * shm:.3f} | {pickled / shm:.2f} |")


def _size(n: int) -> str:
    return f"{n // 1024 // 1024} MB" if n >= 1024 * 1024 else f"{n // 1024} KB"


if __name__ == "__main__":
    main()
