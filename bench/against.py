"""``python -m bench --against REV``: this checkout's server against commit REV's, interleaved in one run.

REV is checked out with ``git worktree add --detach`` into a temporary
directory (removed afterwards); its server runs from there with PYTHONPATH
pointing at it, in the same virtualenv. The load generator is always this
checkout's (``bench.load``, the same instrument for both sides). Every round
measures each door on both sides, back to back, on fresh servers; the order
of the two sides alternates from round to round, so a machine that slows
down or speeds up during the run weighs on both alike.
"""

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.doors import DoorResult, episodes_per_second, measure_door, median_round
from bench.floors import FLOOR_DOORS, print_shares
from bench.servers import REPO_ROOT
from bench.stats import fmt_ms

THIS = "this"


def git(*args: str, cwd: Path = REPO_ROOT) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """A detached worktree of `rev` in a temporary directory, removed on exit."""
    parent = Path(tempfile.mkdtemp(prefix="ors-bench-against-"))
    tree = parent / "tree"
    try:
        git("worktree", "add", "--detach", "--quiet", str(tree), rev)
        yield tree
    finally:
        with contextlib.suppress(RuntimeError):
            git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(parent, ignore_errors=True)
        with contextlib.suppress(RuntimeError):
            git("worktree", "prune")


def check_imports_from(tree: Path) -> None:
    """Fails unless a process started as the servers are imports ``ors_grpc`` from `tree`
    (an editable install of this checkout must not shadow it)."""
    done = subprocess.run(
        [sys.executable, "-c", "import ors_grpc; print(ors_grpc.__file__)"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
    )
    found = done.stdout.strip()
    if done.returncode != 0 or not Path(found).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the checkout's server would import ors_grpc from {found or done.stderr[-500:]}")


def describe(rev: str, cwd: Path = REPO_ROOT) -> str:
    """Short hash and subject of `rev` (HEAD, with '+ changes' when the work tree is dirty)."""
    line = git("log", "-1", "--format=%h %s", rev, cwd=cwd)[:80]
    if rev == "HEAD" and git("status", "--porcelain", "--untracked-files=no", cwd=cwd):
        line += " (+ uncommitted changes)"
    return line


def run(args: argparse.Namespace) -> int:
    sides = (args.against, THIS)
    with checkout(args.against) as tree:
        for code in (tree, REPO_ROOT):  # this checkout's too: its own code, whatever the venv installed
            check_imports_from(code)
        print(f"# ors-grpc benchmark: this checkout against {args.against}")
        print(f"{args.against}: {describe('HEAD', tree)} (checked out in {tree})")
        print(f"{THIS}: {describe('HEAD')}")
        if args.serve_args:
            print(f"both sides serve with: {args.serve_args}")
        print("note: both servers run in this virtualenv and are loaded by this checkout's load generator;"
              " the two sides alternate order every round.")
        rounds: list[dict[tuple[str, str], DoorResult]] = []
        for n in range(args.rounds):
            order = sides if n % 2 == 0 else sides[::-1]
            measured: dict[tuple[str, str], DoorResult] = {}
            for door in args.doors:
                if door == "reference" or door in FLOOR_DOORS:  # neither side's code
                    measured[door, ""] = measure_door(door, args, with_image=False)
                    continue
                for side in order:
                    measured[door, side] = measure_door(door, args, with_image=False,
                                                        tree=tree if side == args.against else REPO_ROOT)
            rounds.append(measured)
    print_against(rounds, args)
    return 0


def print_against(rounds: list[dict[tuple[str, str], DoorResult]], args: argparse.Namespace) -> None:
    print(f"\n## Closed loop: {args.workers} workers, {args.duration:g} s (after {args.warmup:g} s warm-up),"
          f" {args.rounds} rounds")
    print(f"{'door':<10} {'code':<10} {'episodes/s':>10} {'min':>7} {'max':>7} {'p50 ms':>7} {'p99 ms':>7}"
          f" {'CPU ms/ep':>9} {'server CPU':>10} {'loadgen CPU':>11} {'errors':>6}")
    medians: dict[tuple[str, str], DoorResult] = {}
    for key in rounds[0]:
        per_round = [r[key] for r in rounds]
        skipped = next((r.skipped for r in per_round if r.skipped), None)
        door, side = key
        if skipped:
            print(f"{door:<10} {side:<10} skipped: {skipped}")
            continue
        median = medians[key] = median_round(per_round)
        load, eps = median.load, episodes_per_second(median)
        cpu_ms = statistics.median(r.load["server_cpu"] / episodes_per_second(r) * 1000 for r in per_round
                                   if episodes_per_second(r))
        print(f"{door:<10} {side:<10} {eps:>10.1f} {min(median.rounds):>7.1f} {max(median.rounds):>7.1f}"
              f" {fmt_ms(load['tool_calls']['p50']):>7} {fmt_ms(load['tool_calls']['p99']):>7} {cpu_ms:>9.2f}"
              f" {load['server_cpu']:>10.0%} {load['loadgen_cpu']:>11.0%} {sum(r.load['errors'] for r in per_round):>6}")
        if load["first_error"]:
            print(f"{'':<21} first error: {load['first_error']}")
    print(f"episodes/s of {THIS} over {args.against}: the median rounds' ratio (each round's ratio)")
    for door in dict.fromkeys(door for door, side in rounds[0] if side):
        if (door, THIS) not in medians or (door, args.against) not in medians:
            continue
        each = [episodes_per_second(r[door, THIS]) / episodes_per_second(r[door, args.against]) for r in rounds
                if episodes_per_second(r[door, args.against])]
        overall = episodes_per_second(medians[door, THIS]) / episodes_per_second(medians[door, args.against])
        print(f"{door:<10} {overall:.2f}x ({', '.join(f'{x:.2f}' for x in each)})")
    floors = {door: episodes_per_second(medians[door, ""]) for door in FLOOR_DOORS if (door, "") in medians}
    if floors:
        print("episodes/s as a share of the floor's (bench/floors.py; median rounds):")
        for side in (args.against, THIS):
            print_shares({**floors, **{door: episodes_per_second(result) for (door, code), result in medians.items()
                                       if code == side}}, f"{side:<10} ")
    reference = medians.get(("reference", ""))
    if reference and episodes_per_second(reference):
        print("episodes/s over the reference's (median rounds):")
        for (door, side), result in medians.items():
            if side:
                print(f"{door:<10} {side:<10} {episodes_per_second(result) / episodes_per_second(reference):.2f}x")
