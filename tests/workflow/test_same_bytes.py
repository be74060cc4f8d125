"""The same inputs give the same bytes however the run is started: the small DAG (a trained and
merged checkpoint, code graded in the sandbox) run with the Makefile's exported environment
(HF_HUB_OFFLINE=1, TOKENIZERS_PARALLELISM=false), from this repository into a working directory of
its own (the session's shared run, the ``done`` fixture, as it was when it ended), and as a plain
`snakemake` without those variables in a checkout at another absolute path, its package imported
through PYTHONPATH, leaves every artifact equal byte for byte. Code is graded in bubblewrap in both
where it runs: a checkout's sandbox probe once looked for the package where the editable install
points, and its run graded code without the OS sandbox.

Not compared, because they record the environment by design: provenance sidecars (`*.prov.json`:
host, paths, environment variables, clock readings), and the `logs/`, `timing/` and `env/` folders
(job logs, wall times, the environment lock). Everything else under results/<experiment>/ is, byte
for byte, but for the clock readings artifacts hold by design, which differ between any two runs:
where a JSONL file's bytes differ, its records must be equal line for line but for the CLOCK keys;
where a table's do, only its wall-time columns may differ (the cost ledger's spent GPU-hours, as
bench/chaos.py's comparison allows them).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stillroom import sandbox

from ..conftest import REPO, as_built, small_config

pytestmark = pytest.mark.slow

# Folders of an experiment that record the environment or the clock, and the sidecar suffix.
ENVIRONMENT_DIRS = ("logs", "timing", "env")
SIDECAR = ".prov.json"
CONFIG = "same-bytes.yaml"  # written into each checkout, passed relative as a user would


# Record keys that read the clock, which no two runs share: when a teacher answered and how long
# it took (generation's records, carried on by grading), how long a program ran in the sandbox
# (code grading's details). Keyed by their dotted path in a record.
CLOCK = {"created_at", "latency_s", "grade.details.seconds"}


def checkout(dest: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked, plus new files not ignored, so
    the test also checks uncommitted work): no results/, .snakemake/ or virtual environment."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        src = REPO / name
        if src.is_symlink() or not src.is_file():  # .venv links to a shared environment
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name)
    return dest


def makefile_exports(makefile: Path) -> dict[str, str]:
    """The variables the Makefile exports to `make run`'s snakemake (PATH aside: both runs get
    this interpreter's bin directory first, as `make run` and an activated venv do)."""
    found = re.findall(r"^export (\w+) :?= (.*)$", makefile.read_text(), re.M)
    return {k: v.strip() for k, v in found if k != "PATH"}


def run(root: Path, env: dict[str, str]) -> int:
    """`snakemake --cores 2 --configfile same-bytes.yaml` in the checkout ``root``, its own
    package imported (what an editable install of that checkout does); its output goes to
    <root>.snakemake.log beside it."""
    env = {
        **env,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", os.defpath),
        "PYTHONPATH": str(root),
    }
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", CONFIG]
    with (root.parent / f"{root.name}.snakemake.log").open("w") as log:
        proc = subprocess.run(
            cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1800
        )
    return proc.returncode


def artifacts(experiment: Path) -> dict[Path, bytes]:
    return {
        p.relative_to(experiment): p.read_bytes()
        for p in sorted(experiment.rglob("*"))
        if p.is_file()
        and p.relative_to(experiment).parts[0] not in ENVIRONMENT_DIRS
        and not p.name.endswith(SIDECAR)
    }


def difference(a: Path, b: Path, chaos) -> str | None:
    """Where two files differ, None when only by their clock readings: the first line and, for
    records, the keys; for a table, its columns."""
    if a.suffix in (".csv", ".md", ".html") and (columns := chaos.table_columns_differing(a, b)):
        if all(chaos.WALL_TIME_COLUMNS.match(c) for c in columns):
            return None
        return f"columns {sorted(columns)}"
    jsonl = a.suffix == ".jsonl"
    la, lb = a.read_bytes().splitlines(), b.read_bytes().splitlines()
    if len(la) != len(lb):
        return f"{len(la)} lines against {len(lb)}"
    for i, (x, y) in enumerate(zip(la, lb, strict=True), 1):
        if x == y:
            continue
        if not jsonl:
            return f"line {i}: {x[:300]!r} != {y[:300]!r}"
        fx, fy = chaos.flatten(json.loads(x)), chaos.flatten(json.loads(y))
        keys = sorted(k for k in fx.keys() | fy.keys() if fx.get(k) != fy.get(k))
        if set(keys) - CLOCK:
            shown = "; ".join(f"{k}: {fx.get(k)!r:.300} != {fy.get(k)!r:.300}" for k in keys)
            return f"line {i}: {shown}"
    return None


def differences(one: Path, two: Path, chaos) -> list[str]:
    """The artifacts of two experiment folders that are not the same bytes, but for clock
    readings: why, for each."""
    a, b = artifacts(one), artifacts(two)
    if a.keys() != b.keys():
        return [f"in one run only: {rel}" for rel in sorted(a.keys() ^ b.keys())]
    return [
        f"{rel}: {why}"
        for rel in a
        if a[rel] != b[rel] and (why := difference(one / rel, two / rel, chaos))
    ]


def test_the_shared_run_and_plain_snakemake_in_a_checkout_write_the_same_bytes(
    done, tmp_path, chaos
):
    workdir, cfg, _ = done
    assert cfg == small_config()
    # the shared run had the Makefile's exports (conftest sets them when pytest runs without make)
    exports = makefile_exports(REPO / "Makefile")
    assert {"HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"} <= exports.keys()
    shared = {k: os.environ.get(k) for k in exports}
    assert shared == exports, f"the shared run's environment {shared}, not the Makefile's {exports}"
    plain = {k: v for k, v in os.environ.items() if k not in exports and k != "PYTHONPATH"}
    root = checkout(tmp_path / "b" / "elsewhere" / "checkout-2")
    assert root.resolve() != REPO and not workdir.is_relative_to(root)
    (root / CONFIG).write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert run(root, plain) == 0, (
        f"snakemake in {root} failed:\n"
        + (root.parent / f"{root.name}.snakemake.log").read_text()[-6000:]
    )

    dirs = [as_built(workdir) / "results" / cfg["experiment"], root / "results" / cfg["experiment"]]
    compared = artifacts(dirs[0])
    # the DAG wrote a checkpoint with its tokenizer and graded code in the sandbox
    assert Path("ckpt/sft/tokenizer_config.json") in compared
    code = [p for p in compared if p.parts[0] == "eval" and "tinycode" in p.parts]
    assert code
    graded = json.loads((dirs[0] / "eval" / "sft" / "tinycode" / "graded.jsonl").open().readline())
    assert graded["grader"]["options"]["bwrap"] is sandbox.bwrap_available()
    differing = differences(*dirs, chaos)
    assert not differing, f"{len(differing)} of {len(compared)} artifacts differ:\n" + "\n".join(
        differing
    )
