"""Time of the SLURM plan (`stillroom plan --configfile ...`) on the beam-distill recipe and the
embedded default, wall and CPU seconds per run.

The plan is offline, but the SLURM executor plugin asks the controller for its config
(`scontrol show config`) when it is imported; where SLURM is installed and its controller is down,
each such call waits ~9 s. --controller-down runs the plan with a copy of the SLURM config in effect
whose controller port has no listener, to measure that case on a machine whose cluster is up.
--entry module times `python -m stillroom.plan.slurm`, the entry older checkouts have too (give one
on PYTHONPATH to time it).

    python bench/slurm_plan_time.py [--repeats 3] [--controller-down] [--entry cli|module]
"""

import argparse
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stillroom.workflow import REPO, snakemake_env

CONFIGS = {
    "beam-distill": REPO / "config" / "experiments" / "beam-distill.yaml",
    "default": REPO / "config" / "config.yaml",
}
ENTRIES = {
    "cli": [sys.executable, "-m", "stillroom", "plan"],
    "module": [sys.executable, "-m", "stillroom.plan.slurm"],
}


def down_controller_conf(tmp: Path) -> Path:
    """A copy of the SLURM config in effect whose controller listens on a port nothing binds."""
    source = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    if not source.exists():
        sys.exit(f"--controller-down: no SLURM config at {source} (set SLURM_CONF)")
    with socket.socket() as s:  # a free port: bound, then released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = re.sub(r"(?im)^SlurmctldPort=.*\n?", "", source.read_text())
    conf = tmp / "slurm.conf"
    conf.write_text(f"{text.rstrip()}\nSlurmctldPort={port}\n")
    return conf


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, of every process it started) of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--controller-down", action="store_true")
    ap.add_argument("--entry", choices=sorted(ENTRIES), default="cli")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="stillroom-plan-bench-") as tmp:
        env = snakemake_env()
        if args.controller_down:
            env["SLURM_CONF"] = str(down_controller_conf(Path(tmp)))
        print(
            f"entry: {' '.join(ENTRIES[args.entry][2:])}; controller down: {args.controller_down}"
        )
        print(f"{'config':<14}{'wall s per run':<30}cpu s per run")
        for name, path in CONFIGS.items():
            runs = [
                timed([*ENTRIES[args.entry], "--configfile", str(path)], env)
                for _ in range(args.repeats)
            ]
            walls = " ".join(f"{w:6.2f}" for w, _ in runs)
            cpus = " ".join(f"{c:6.2f}" for _, c in runs)
            print(f"{name:<14}{walls:<30}{cpus}")


if __name__ == "__main__":
    main()
