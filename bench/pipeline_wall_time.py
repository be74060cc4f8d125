"""Wall time of each stage and of the whole default run.

Runs the workflow from scratch in a temporary directory (the embedded default unless --configfile
is given) — or reads a finished run with --existing DIR — then reads every provenance sidecar:
jobs per rule, summed and longest job wall time, and the span from the first job's start to the
last job's end. Prints numbers only: each rule's jobs, summed and longest job wall time and its
share (%) of the summed time of all jobs.

    python bench/pipeline_wall_time.py [--configfile my.yaml] [--cores 2] [--existing DIR]
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from stillroom.workflow import snakemake_command, snakemake_env

REPO = Path(__file__).resolve().parent.parent


def run_pipeline(workdir: Path, configfile: str | None, cores: int) -> float:
    cmd = snakemake_command(
        workdir,
        "--cores",
        str(cores),
        "--quiet",
        "all",
        configfiles=[configfile] if configfile else [],
    )
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=snakemake_env(), capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"snakemake failed:\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def job_times(workdir: Path) -> tuple[dict[str, list[float]], float]:
    """Each rule's job wall times, from the sidecars of ``workdir``'s results, and the span from
    the first job's start to the last job's end."""
    per_rule: dict[str, list[float]] = defaultdict(list)
    seen, starts, ends = set(), [], []
    for side in workdir.glob("results/**/*.prov.json"):
        prov = json.loads(side.read_text())
        job = (prov["rule"], prov["started_at"])
        # one job writes a sidecar per output
        if job in seen:
            continue
        seen.add(job)
        per_rule[prov["rule"]].append(prov["metrics"]["wall_s"])
        starts.append(datetime.fromisoformat(prov["started_at"]))
        ends.append(datetime.fromisoformat(prov["ended_at"]))
    if not per_rule:
        sys.exit(f"no provenance sidecars under {workdir / 'results'}: not a finished run")
    return per_rule, (max(ends) - min(starts)).total_seconds()


def summarize(workdir: Path) -> None:
    per_rule, span = job_times(workdir)
    total = sum(map(sum, per_rule.values()))
    print(f"{'rule':<18}{'jobs':>5}{'sum s':>9}{'share':>8}{'max s':>9}")
    for rule, times in sorted(per_rule.items(), key=lambda kv: -sum(kv[1])):
        share = 100 * sum(times) / total if total else 0.0
        print(f"{rule:<18}{len(times):>5}{sum(times):>9.1f}{share:>7.1f}%{max(times):>9.1f}")
    print(f"{'stage time, all jobs':<23}{total:>9.1f}{100:>7.1f}%")
    # the timing files (benchmark:) time each job's whole process: the rest is start-up (imports)
    process = sum(
        float(tsv.read_text().splitlines()[1].split("\t")[0])
        for tsv in workdir.glob("results/*/timing/**/*.tsv")
    )
    print(f"{'job processes, all jobs':<23}{process:>9.1f}   (timing/*.tsv: stage time + start-up)")
    print(f"{'first start to last end':<23}{span:>9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument(
        "--existing", help="summarise a finished run in this directory instead of running"
    )
    args = ap.parse_args()
    if args.existing:
        summarize(Path(args.existing))
        return
    workdir = Path(tempfile.mkdtemp(prefix="stillroom-bench-"))
    try:
        total = run_pipeline(workdir, args.configfile, args.cores)
        summarize(workdir)
        print(
            f"{'whole run (wall)':<23}{total:>9.1f}   "
            f"({args.cores} cores, incl. DAG build and job start-up)"
        )
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
