"""Kernel validator throughput on CPU (Triton interpreter) and the cost of isolation.

Scores every reference solution of stillroom/kernels with ``stillroom.kernels.evaluate`` in both
isolations: ``fork`` (a child of a warm server that has imported torch and triton; the server is
started before the clock runs) and ``process`` (a fresh interpreter per candidate: start, import
torch and triton, run, compare), each with the OS sandbox (bubblewrap, isolation.py) and without
(``--os-sandbox``), all with every generated test case (cases.py); then ``fork`` on the trials
alone (``cases=[]``), for the cost of the cases. Then runs the same check in this process (import
the candidate from its file, run it on the trials' inputs, compare) as the baseline. Prints
candidates per minute for each, their ratios to the baseline, what the OS sandbox and the cases
cost per candidate, and the bare costs of starting a worker process and the fork servers.

    TRITON_INTERPRET=1 python bench/kernel_validator_throughput.py [--limit 48] [--trials 3]
        [--workers 2] [--os-sandbox both|on|off]
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

from stillroom import sandbox
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
    ap.add_argument(
        "--os-sandbox",
        choices=["both", "on", "off"],
        default="both",
        help="run the candidates inside bubblewrap, outside it, or both ways",
    )
    args = ap.parse_args()
    sandboxes = {"both": [False, True], "on": [True], "off": [False]}[args.os_sandbox]
    if True in sandboxes and not sandbox.bwrap_available():
        sys.exit("--os-sandbox on: bubblewrap cannot run here (warned above)")
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

    runs = {}  # (isolation, sandboxed) -> (seconds, reward-1 count)
    server_s = {}
    for sandboxed in sandboxes:
        isolation.OS_SANDBOX = sandboxed
        t0 = time.perf_counter()
        isolation.fork_server("cpu")
        server_s[sandboxed] = time.perf_counter() - t0
        for how in ("fork", "process"):
            runs[how, sandboxed] = isolated(how)
    # the last sandbox setting's fork server, on the trials alone
    bare_s, bare_ok = isolated("fork", cases=[])

    t0 = time.perf_counter()
    passed = sum(in_process(p, args.trials) for p in problems)
    inproc_s = time.perf_counter() - t0

    n = len(problems)
    print(f"candidates: {n} reference solutions, {args.trials} trials each, CPU interpreter")
    names = {"fork": "fork server", "process": "fresh process"}
    rows = [
        (
            f"{names[how]}{', bwrap' if sandboxed else ''} ({args.workers} at once)",
            secs,
            f"reward 1: {ok}",
        )
        for (how, sandboxed), (secs, ok) in runs.items()
    ]
    for name, secs, ok in [
        *rows,
        (f"fork server, no cases ({args.workers} at once)", bare_s, f"reward 1: {bare_ok}"),
        ("in-process baseline (one at a time)", inproc_s, f"correct: {passed}"),
    ]:
        print(
            f"{name:38s} {secs:7.1f} s  {60 * n / secs:6.1f} per minute  "
            f"{inproc_s / secs:5.2f}x baseline  {ok}/{n}"
        )
    for sandboxed in sandboxes:
        fork_s, process_s = runs["fork", sandboxed][0], runs["process", sandboxed][0]
        label = "with bwrap" if sandboxed else "without bwrap"
        print(f"fork server vs fresh process, {label}: {process_s / fork_s:.2f}x the throughput")
        print(
            f"isolation cost per candidate, {label}: "
            f"fork {fork_s * args.workers / n - inproc_s / n:5.2f} s, "
            f"process {process_s * args.workers / n - inproc_s / n:5.2f} s "
            f"(starting the fork server: {server_s[sandboxed]:.2f} s)"
        )
    if len(sandboxes) == 2:
        for how in ("fork", "process"):
            (off, _), (on, _) = runs[how, False], runs[how, True]
            print(
                f"OS sandbox cost, {names[how]}: {(on - off) * args.workers / n:+.2f} s per "
                f"candidate, {off / on:.2f}x the throughput without it"
            )
    print(f"a bare `import torch, triton` process: {start_s:.2f} s")
    fork_s = runs["fork", sandboxes[-1]][0]
    print(
        f"generated test cases: {(fork_s - bare_s) * args.workers / n:5.2f} s more per candidate "
        f"(fork server, {fork_s / bare_s:.2f}x the time of the trials alone)"
    )


if __name__ == "__main__":
    main()
