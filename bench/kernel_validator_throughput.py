"""Kernel validator throughput: rewards per minute of today's validator (extract in a sandbox,
check, replay in a trusted sandboxed process, a namespace per job) against the validator at a
baseline git revision (before the replay: one fork-server worker ran the candidate and judged it
in process), on the same machine in the same run.

Each validator is imported from its own tree in a process of its own (the baseline's
``stillroom/`` is taken from git into a temporary directory), starts its fork server, scores one
candidate to warm up, then scores the same reference solution ``--n`` times on ``--workers``
threads. Both run inside bubblewrap unless ``--os-sandbox off``. Prints rewards per minute, the
count that earned 1, the load average, and the ratio of today's rate to the baseline's.

    TRITON_INTERPRET=1 python bench/kernel_validator_throughput.py [--problem relu] [--n 60]
        [--workers 2] [--baseline-rev 427bc7d] [--os-sandbox on|off]
"""

from __future__ import annotations

import argparse
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
BASELINE = "427bc7d"  # the last commit whose validator ran candidates and judged them in process

MEASURE = """
import json, os, sys, time
os.environ.setdefault("TRITON_INTERPRET", "1")
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import stillroom
from stillroom.kernels import evaluate, isolation
problem, n, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sandboxed = sys.argv[4] == "on"
isolation.OS_SANDBOX = sandboxed
kernels = Path(stillroom.__file__).parent / "kernels"
src = (kernels / "problems" / f"{problem}.py").read_text()
sol = (kernels / "solutions" / f"{problem}.py").read_text()
t0 = time.perf_counter()
first = evaluate(src, sol, trials=3)
warm = time.perf_counter() - t0
t0 = time.perf_counter()
with ThreadPoolExecutor(workers) as pool:
    rewards = list(pool.map(lambda _: evaluate(src, sol, trials=3).reward, range(n)))
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "ones": sum(r == 1.0 for r in rewards), "n": n,
                  "first": first.reward, "warm_s": warm, "load": os.getloadavg()[0],
                  "root": str(Path(stillroom.__file__).parent)}))
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
         args.os_sandbox],
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="relu")
    ap.add_argument("--n", type=int, default=60, help="candidates scored, after one to warm up")
    ap.add_argument("--workers", type=int, default=2, help="candidates scored at once")
    ap.add_argument("--baseline-rev", default=BASELINE)
    ap.add_argument("--os-sandbox", choices=["on", "off"], default="on")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="validator-baseline-") as tmp:
        runs = {
            f"baseline ({args.baseline_rev}: in-process judge)": measure(
                baseline_tree(args.baseline_rev, Path(tmp)), args
            ),
            "today (extract, check, replay)": measure(REPO, args),
        }
    print(
        f"{args.problem}: {args.n} candidates, 3 trials and every generated case each, "
        f"{args.workers} at once, OS sandbox {args.os_sandbox}, CPU interpreter"
    )
    rates = {}
    for name, r in runs.items():
        rates[name] = 60 * r["n"] / r["seconds"]
        print(
            f"{name:40s} {r['seconds']:7.1f} s  {rates[name]:6.1f} rewards/min  "
            f"reward 1: {r['ones']}/{r['n']}  load {r['load']:.1f}  (first, with the server's "
            f"start: {r['warm_s']:.1f} s)"
        )
    base, today = rates.values()
    print(f"today / baseline: {today / base:.2f}x the rewards per minute")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"bench wall time {time.perf_counter() - t0:.0f} s")
