"""Run a benchmark on two commits, alternately, and print each figure's median on both and their ratio.

A restructuring must not slow the service down; measured one after the other, the machine's drift (other
load, a warm or cold cache) would show up as a difference. So the base commit is checked out in a
temporary git worktree and the same benchmark command runs in the base tree and in this one by turns,
``--rounds`` times each, base first. Every line a benchmark prints is read as a template (its numbers
taken out) with its numbers: a figure is one number of one template line, matched across the runs by
the template and its place among equal templates; a figure equal in every run is a label and not
shown. For each figure the table shows the median on the
base, on this tree, and ``this / base`` (a time above 1.10 is a regression of more than 10%).

    python bench/alternate.py --base 8db62fb --rounds 3 -- bench/plan.py --repeat 3
    python bench/alternate.py --base 8db62fb --grep "p99|/s" -- bench/reserve.py --seconds 3 --no-10k

Only the lines matching ``--grep`` (a regular expression; default every line with a number) are shown.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

Figures = dict[tuple[str, int, int], float]  # (template, occurrence, index in line) -> value


def figures(output: str) -> tuple[Figures, dict[tuple[str, int], str]]:
    """The figures of one run's output, and each template line's first text (for the table)."""
    found: Figures = {}
    lines: dict[tuple[str, int], str] = {}
    seen: dict[str, int] = defaultdict(int)
    for line in output.splitlines():
        numbers = NUMBER.findall(line)
        if not numbers:
            continue
        template = " ".join(NUMBER.sub("#", line).split())  # column widths vary with the numbers
        occurrence = seen[template]
        seen[template] += 1
        lines[(template, occurrence)] = line.strip()
        for i, n in enumerate(numbers):
            found[(template, occurrence, i)] = float(n.replace(",", ""))
    return found, lines


def run(tree: Path, command: list[str]) -> str:
    """One run of ``command`` (a script path relative to the repository root and its arguments) in
    ``tree``, with that tree's ``app`` first on the import path; its standard output."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, *command], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
        raise SystemExit(f"{command[0]} failed in {tree} (exit {done.returncode})")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=3, help="runs on each tree, alternately")
    parser.add_argument("--grep", default="", help="show only lines matching this regular expression")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [arguments]")
    args = parser.parse_args()
    command = [c for c in args.command if c != "--"]
    if not command:
        parser.error("name the benchmark after --")
    shown = re.compile(args.grep) if args.grep else None
    with tempfile.TemporaryDirectory(prefix="bc-base-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base_tree), args.base],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            runs: dict[str, list[Figures]] = {"base": [], "this": []}
            text: dict[tuple[str, int], str] = {}
            for r in range(1, args.rounds + 1):
                for name, tree in (("base", base_tree), ("this", ROOT)):
                    print(f"round {r}: {name}", file=sys.stderr, flush=True)
                    found, lines = figures(run(tree, command))
                    runs[name].append(found)
                    text.update(lines)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
    print(f"{'base':>10} {'this':>10} {'this/base':>9}  figure (median of {args.rounds} alternate runs)")
    for key in sorted(
        set(runs["base"][0]) & set(runs["this"][0]), key=lambda k: (list(text).index(k[:2]), k[2])
    ):
        line = text[key[:2]]
        if shown is not None and not shown.search(line):
            continue
        values = [f[key] for f in runs["base"] + runs["this"] if key in f]
        if len(set(values)) == 1:
            continue  # a label (a node count, a percentile's name), not a measurement
        base = statistics.median(f[key] for f in runs["base"] if key in f)
        this = statistics.median(f[key] for f in runs["this"] if key in f)
        ratio = f"{this / base:9.2f}" if base else f"{'-':>9}"
        print(f"{base:10.2f} {this:10.2f} {ratio}  #{key[2] + 1} of: {line[:90]}")


if __name__ == "__main__":
    main()
