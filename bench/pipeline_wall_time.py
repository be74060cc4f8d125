"""Wall time of each stage and of the whole default run.

Runs the workflow from scratch in a temporary directory (the embedded default unless --configfile
is given), then reads every provenance sidecar: jobs per rule, summed and longest job wall time.
Prints numbers only.

    python bench/pipeline_wall_time.py [--configfile my.yaml] [--cores 2] [--keep DIR]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--keep", help="run in this directory and keep it")
    args = ap.parse_args()
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="stillroom-bench-"))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--cores", str(args.cores), "--quiet", "all"]
    if args.configfile:
        cmd += ["--configfile", str(Path(args.configfile).resolve())]
    env_path = str(Path(sys.executable).parent)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env={**os.environ, "PATH": env_path + os.pathsep + os.environ["PATH"]},
                          capture_output=True, text=True)
    total = time.monotonic() - t0
    if proc.returncode:
        sys.exit(f"snakemake failed:\n{proc.stderr[-3000:]}")
    per_rule: dict[str, list[float]] = defaultdict(list)
    seen = set()
    for side in workdir.glob("results/**/*.prov.json"):
        prov = json.loads(side.read_text())
        job = (prov["rule"], prov["started_at"])
        if job in seen:  # one job writes a sidecar per output
            continue
        seen.add(job)
        per_rule[prov["rule"]].append(prov["metrics"]["wall_s"])
    print(f"{'rule':<18}{'jobs':>5}{'sum s':>9}{'max s':>9}")
    for rule, times in sorted(per_rule.items(), key=lambda kv: -sum(kv[1])):
        print(f"{rule:<18}{len(times):>5}{sum(times):>9.1f}{max(times):>9.1f}")
    print(f"{'stage time (sum)':<23}{sum(map(sum, per_rule.values())):>9.1f}")
    print(f"{'whole run (wall)':<23}{total:>9.1f}   ({args.cores} cores, includes job start-up)")
    if not args.keep:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
