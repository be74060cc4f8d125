"""Kernel validator throughput on CPU (Triton interpreter) and the cost of isolation.

Scores every reference solution of stillroom/kernels with ``stillroom.kernels.evaluate`` in both
isolations: ``fork`` (a child of a warm server that has imported torch and triton; the server is
started before the clock runs) and ``process`` (a fresh interpreter per candidate: start, import
torch and triton, run, compare), both with every generated test case (cases.py); then ``fork`` on
the trials alone (``cases=[]``), for the cost of the cases. Then runs the same check in this
process (import the candidate from its file, run it on the trials' inputs, compare) as the
baseline. Prints candidates per minute for each, their ratios to the baseline, and the bare costs
of starting a worker process and the fork server.

    TRITON_INTERPRET=1 python bench/kernel_validator_throughput.py [--limit 48] [--trials 3]
        [--workers 2]
"""

import argparse
import os

# the in-process baseline interprets kernels too
os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from stillroom.kernels import evaluate, isolation

KERNELS = Path(__file__).resolve().parent.parent / "stillroom" / "kernels"


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_process(problem_path: Path, trials: int) -> bool:
    """The same check without isolation: no worker, no audit, no limits."""
    problem = load(problem_path, f"p_{problem_path.stem}")
    solution = load(KERNELS / "solutions" / problem_path.name, f"s_{problem_path.stem}")
    torch.manual_seed(0)
    init = problem.get_init_inputs()
    ref, new = problem.Model(*init), solution.ModelNew(*init)
    new.load_state_dict(ref.state_dict())
    ok = True
    with torch.no_grad():
        for t in range(trials):
            torch.manual_seed(1 + t)
            inputs = problem.get_inputs()
            ok &= bool(
                torch.allclose(
                    new(*[x.clone() for x in inputs]), ref(*inputs), rtol=1e-4, atol=1e-4
                )
            )
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument(
        "--workers", type=int, default=2, help="candidates scored at once (one process each)"
    )
    args = ap.parse_args()
    problems = sorted((KERNELS / "problems").glob("*.py"))[: args.limit]

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, triton"], check=True, cwd=tmp)
        start_s = time.perf_counter() - t0

    def isolated(how: str, **cases) -> tuple[float, int]:
        def reward(p: Path) -> float:
            return evaluate(
                p.read_text(),
                (KERNELS / "solutions" / p.name).read_text(),
                trials=args.trials,
                isolation=how,
                **cases,
            ).reward

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.workers) as pool:
            rewards = list(pool.map(reward, problems))
        return time.perf_counter() - t0, sum(r == 1.0 for r in rewards)

    t0 = time.perf_counter()
    isolation.fork_server("cpu")
    server_s = time.perf_counter() - t0
    fork_s, fork_ok = isolated("fork")
    process_s, process_ok = isolated("process")
    bare_s, bare_ok = isolated("fork", cases=[])

    t0 = time.perf_counter()
    passed = sum(in_process(p, args.trials) for p in problems)
    inproc_s = time.perf_counter() - t0

    n = len(problems)
    print(f"candidates: {n} reference solutions, {args.trials} trials each, CPU interpreter")
    for name, secs, ok in [
        (f"fork server ({args.workers} at once)", fork_s, f"reward 1: {fork_ok}"),
        (f"fresh process ({args.workers} at once)", process_s, f"reward 1: {process_ok}"),
        (f"fork server, no cases ({args.workers} at once)", bare_s, f"reward 1: {bare_ok}"),
        ("in-process baseline (one at a time)", inproc_s, f"correct: {passed}"),
    ]:
        print(
            f"{name:38s} {secs:7.1f} s  {60 * n / secs:6.1f} per minute  "
            f"{inproc_s / secs:5.2f}x baseline  {ok}/{n}"
        )
    print(f"fork server vs fresh process: {process_s / fork_s:.2f}x the throughput")
    print(
        f"generated test cases: {(fork_s - bare_s) * args.workers / n:5.2f} s more per candidate "
        f"(fork server, {fork_s / bare_s:.2f}x the time of the trials alone)"
    )
    print(
        f"isolation cost per candidate: fork {fork_s * args.workers / n - inproc_s / n:5.2f} s, "
        f"process {process_s * args.workers / n - inproc_s / n:5.2f} s "
        f"(a bare `import torch, triton` process: {start_s:.2f} s; "
        f"starting the fork server: {server_s:.2f} s)"
    )


if __name__ == "__main__":
    main()
