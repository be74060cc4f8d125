"""Kernel validator throughput: today's tree against a baseline from git, side by side in one run,
at the settings GRPO grades with (the kernels: section's defaults, trials and generated cases),
idle and with one core kept busy by a spinning process, cold start and steady state.

Each tree's validator is imported in a process of its own (the baseline's ``stillroom/`` is taken
from git into a temporary directory and put first on PYTHONPATH), which times its first
evaluation (cold: the fork server's start and the first candidate) and then scores the reference
solution ``--n`` times on ``--workers`` threads (steady: rewards per minute). The two trees run one
after the other under each condition, so both see the same load; the load average is printed
with every row, since a shared machine's load moves the numbers more than anything measured.
Both run inside bubblewrap unless ``--os-sandbox off``.

    TRITON_INTERPRET=1 python bench/kernel_validator_throughput.py [--problem relu] [--n 60]
        [--workers 2] [--baseline 2df2390] [--conditions idle,busy] [--os-sandbox on|off]
        [--trials N] [--cases mixed_sign,...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from stillroom.config import ValidatorOptions  # noqa: E402 - today's tree, after the path

BASELINE = "2df2390"  # the tree issue 41 started from: the replayed-program design before it
CONDITIONS = ("idle", "busy")

MEASURE = """
import inspect, json, os, sys, time
os.environ.setdefault("TRITON_INTERPRET", "1")
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import stillroom
from stillroom.kernels import evaluate, isolation
problem, n, workers, sandboxed, trials = sys.argv[1:6]
n, workers, trials = int(n), int(workers), int(trials)
cases = [c for c in sys.argv[6].split(",") if c]
isolation.OS_SANDBOX = sandboxed == "on"
settings = {"trials": trials}
if "cases" in inspect.signature(evaluate).parameters:  # a tree before generated cases has none
    settings["cases"] = cases
kernels = Path(stillroom.__file__).parent / "kernels"
src = (kernels / "problems" / f"{problem}.py").read_text()
sol = (kernels / "solutions" / f"{problem}.py").read_text()
t0 = time.perf_counter()
first = evaluate(src, sol, **settings)
cold = time.perf_counter() - t0
t0 = time.perf_counter()
with ThreadPoolExecutor(workers) as pool:
    rewards = list(pool.map(lambda _: evaluate(src, sol, **settings).reward, range(n)))
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "ones": sum(r == 1.0 for r in rewards), "n": n,
                  "first": first.reward, "cold_s": cold, "load": os.getloadavg()[0],
                  "cases": settings.get("cases"), "root": str(Path(stillroom.__file__).parent)}))
"""


def baseline_tree(rev: str, into: Path) -> Path:
    """``stillroom/`` of ``rev``, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "stillroom"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(root: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "TRITON_INTERPRET": "1"}
    out = subprocess.run(
        [sys.executable, "-P", "-c", MEASURE, args.problem, str(args.n), str(args.workers),
         args.os_sandbox, str(args.trials), ",".join(args.cases)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    if out.returncode:
        sys.exit(f"measuring {root} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["root"].startswith(str(root)):
        sys.exit(f"measured the validator at {result['root']}, not {root}")
    return result


@contextlib.contextmanager
def condition(name: str):
    """``busy``: one process spinning on a core for the duration; ``idle``: nothing added."""
    spinner = None
    if name == "busy":
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()


def main() -> None:
    grpo = ValidatorOptions()  # the kernels: section's defaults, which GRPO grades with
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="relu")
    ap.add_argument("--n", type=int, default=60, help="candidates scored, after the cold one")
    ap.add_argument("--workers", type=int, default=2, help="candidates scored at once")
    ap.add_argument("--baseline", "--baseline-rev", dest="baseline", default=BASELINE)
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help="idle, busy or both")
    ap.add_argument("--trials", type=int, default=grpo.trials)
    ap.add_argument("--cases", default=",".join(grpo.cases), help="generated cases, by name")
    ap.add_argument("--os-sandbox", choices=["on", "off"], default="on")
    args = ap.parse_args()
    args.cases = [c for c in args.cases.split(",") if c]
    conditions = [c for c in args.conditions.split(",") if c]
    if not conditions or set(conditions) - set(CONDITIONS):
        ap.error(f"--conditions: some of {', '.join(CONDITIONS)}, got {args.conditions!r}")

    trees = {f"baseline {args.baseline}": None, "today": REPO}
    rows = []
    with tempfile.TemporaryDirectory(prefix="validator-baseline-") as tmp:
        trees[f"baseline {args.baseline}"] = baseline_tree(args.baseline, Path(tmp))
        for cond in conditions:
            with condition(cond):
                for name, root in trees.items():
                    rows.append((cond, name, measure(root, args)))
    print(
        f"{args.problem}: {args.n} candidates after a cold one, {args.trials} trials and cases "
        f"{','.join(args.cases) or 'none'} each, {args.workers} at once, OS sandbox "
        f"{args.os_sandbox}, CPU interpreter, {os.cpu_count()} cores"
    )
    print(
        f"{'condition':9s} {'tree':22s} {'cold s':>7s} {'rewards/min':>11s} {'reward 1':>8s} load"
    )
    rates: dict[tuple[str, str], float] = {}
    for cond, name, r in rows:
        rates[cond, name] = 60 * r["n"] / r["seconds"]
        note = "" if r["cases"] is not None else "  (this tree has no generated cases)"
        print(
            f"{cond:9s} {name:22s} {r['cold_s']:7.1f} {rates[cond, name]:11.1f} "
            f"{r['ones']:>4d}/{r['n']:<3d} {r['load']:.1f}{note}"
        )
    for cond in conditions:
        base, today = (rates[cond, name] for name in trees)
        print(f"{cond}: today / baseline: {today / base:.2f}x the rewards per minute")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"bench wall time {time.perf_counter() - t0:.0f} s")
