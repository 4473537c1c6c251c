"""CPU time of starting the ``better-compute`` command (docs/cli.md, "Start-up").

Runs, interleaved, ``--repeat`` times each:

- ``python -c pass`` (the baseline: the interpreter's own start-up on this machine),
- ``python -m app.cli --help``,
- ``python -m app.cli get pools --help``,
- ``python -m app.cli get pools`` against a service this script starts (``better-compute serve`` on
  ``DATABASE_URL``, an admin key of its own; or ``--server URL --key KEY`` of a running one),

and prints each one's CPU time (user + system of the child, from ``resource.getrusage(RUSAGE_CHILDREN)``
before and after) as p50 and max in milliseconds, and its p50 over the baseline's p50. The target is
under 300 ms of CPU for ``--help`` and every client command; the ratio is what to compare between
machines. Nothing is asserted: speed is measured here, never in the tests.

    python bench/cli.py [--repeat 20] [--server URL --key KEY]

The commands run from this checkout (``PYTHONPATH`` is set to it), so the code beside the script is
what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.reserve import DEFAULT_URL, start_service  # noqa: E402 (the checkout's bench/ first)

CASES: list[tuple[str, list[str]]] = [
    ("python -c pass", ["-c", "pass"]),
    ("--help", ["-m", "app.cli", "--help"]),
    ("get pools --help", ["-m", "app.cli", "get", "pools", "--help"]),
    ("get pools", ["-m", "app.cli", "get", "pools"]),
]


def child_cpu_ms(arguments: list[str], env: dict[str, str]) -> float:
    """CPU milliseconds (user + system) of one ``python ARGUMENTS`` run; it must exit 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, *arguments], cwd=ROOT, env=env, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{arguments} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return spent * 1000


def measure(repeat: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Every case ``repeat`` times, interleaved (a busy moment of the machine hits every case alike)."""
    samples: dict[str, list[float]] = {name: [] for name, _ in CASES}
    for _name, arguments in CASES:  # one warm-up each: the file cache, compiled bytecode
        child_cpu_ms(arguments, env)
    for _ in range(repeat):
        for name, arguments in CASES:
            samples[name].append(child_cpu_ms(arguments, env))
    return samples


def report(samples: dict[str, list[float]]) -> None:
    baseline = statistics.median(samples[CASES[0][0]])
    print(f"{'command':<20} {'p50 ms':>8} {'max ms':>8} {'p50 / python -c pass':>22}")
    for name, values in samples.items():
        p50 = statistics.median(values)
        print(f"{name:<20} {p50:>8.0f} {max(values):>8.0f} {p50 / baseline:>22.2f}")


async def run(args: argparse.Namespace) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if args.server:
        env.update(BC_SERVER=args.server, BC_API_KEY=args.key or os.environ.get("BC_API_KEY", ""))
        report(measure(args.repeat, env))
        return
    key = f"bck_bench_{secrets.token_hex(16)}"
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as logs:
        service = await start_service(args.database_url, key, 1, Path(logs))
        try:
            env.update(BC_SERVER=service.url, BC_API_KEY=key)
            report(measure(args.repeat, env))
        finally:
            service.stop()


def main() -> None:
    """Parse arguments and run the benchmark."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=20, help="runs of each command")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_URL)
    parser.add_argument("--server", help="a running service (default: start one on DATABASE_URL)")
    parser.add_argument("--key", help="its API key (default: BC_API_KEY)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
