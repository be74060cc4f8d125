"""Every bench/ script runs at tiny sizes, exits 0 and prints its numbers, so that a rename in
stillroom/ cannot break one unseen; a script added without a run here fails. Times are printed by
the scripts, never asserted."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import small_config

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
CONFIG = "{config}"  # a tiny workflow config (conftest.small_config), written for the run
DONE = "{done}"  # the session's finished run of that config (conftest's done fixture)

# script -> its runs: (arguments at tiny sizes, a line of numbers the run prints)
SMOKE: dict[str, list[tuple[list[str], str]]] = {
    "bootstrap_speed.py": [
        (
            ["--problems", "50", "--samples", "4", "--resamples", "200", "--repeat", "1"],
            r"scipy.stats.bootstrap \(d,\) +\d+\.\d+ +\d+\.\d+x",
        )
    ],
    "chaos.py": [
        (
            # the session's run is the uninterrupted one the chaos run is compared with
            ["--configfile", CONFIG, "--baseline", DONE, "--kills", "1", "--cores", "2"],
            r"chaos run wall +\d+\.\d+ s \(cost x\d+\.\d+\)",
        )
    ],
    "server_starts.py": [
        (
            ["--configfile", str(REPO / "config" / "experiments" / "beam-distill.yaml")],
            r"beam-distill +\d+ +\d+ +\d+\.\d +\d+\.\d\d",
        )
    ],
    "code_grading.py": [(["--rounds", "1"], r"no bubblewrap +all +\d+ +\d+")],
    "dag_build_time.py": [
        (
            ["--stress-shards", "4", "--repeats", "1"],
            r"stress \(4 shards x 4 efforts\) +slurm +\d+ +\d+\.\d+",
        )
    ],
    "decontam_throughput.py": [
        (
            ["--prompts", "300", "--benchmarks", "2", "--items", "20", "--repeat", "1"],
            r"NgramIndex.scan +\d+\.\d+ +\d+\.\d+ +\d+ +\d+ +\d+\.\d+x",
        )
    ],
    "grading_throughput.py": [
        (["--items", "40"], r"2 worker processes +\d+\.\d+ +\d+\.\d+ +\d+\.\d+x")
    ],
    "kernel_corpus.py": [
        (
            ["--only", "tutorial_01_vector_add"],
            r"1 kernels over 1 problems: 1 earned 1, 0 earned 0; 1 as the corpus expects",
        )
    ],
    "kernel_validator_sizes.py": [
        (
            ["--relu-rows", "1", "--diag", "16", "--trials", "1", "--cases", "mixed_sign"],
            r'"problem": "diag", "size": 16, "reward": 1.0, .*"seconds": \d',
        )
    ],
    "kernel_validator_throughput.py": [
        (
            ["--n", "2", "--workers", "1", "--os-sandbox", "off", "--conditions", "idle"]
            + ["--trials", "1", "--cases", "mixed_sign"],
            r"idle: today / baseline: \d+\.\d+x the rewards per minute",
        )
    ],
    "merge_memory.py": [
        (["--sizes", "1"], r"load/stream +\d+\.\d+ +\d+\.\d+ +\d+\.\d+"),
        (
            ["--adapter", "--moe-gb", "0", "--experts", "4", "--hidden", "128", "--shard-mb", "5"],
            r"streaming +\d+\.\d+ +\d+ +\d+ +\d+ +\d+\.\d+ +\d+\.\d+",
        ),
    ],
    "moe_qlora_memory.py": [
        (
            ["--depths", "1,2", "--experts", "4", "--hidden", "256", "--moe-intermediate", "64"],
            r"\n +2 \| +\d+ \| +\d+\.\d+ \| +1 \| +\d+ \| +\d+ \| +\d+ \| +\d+ \|",
        )
    ],
    "packing_efficiency.py": [(["--docs", "300"], r"BFD packing into 16384 .* +0\.\d+ +\d+")],
    "pipeline_wall_time.py": [
        (["--existing", DONE], r"first start to last end +\d+\.\d+"),
    ],
    "slurm_plan_time.py": [
        (["--repeats", "1"], r"beam-distill +\d+\.\d+ +\d+\.\d+"),
    ],
    "staged_load.py": [
        (
            ["--layers", "2", "--experts", "4", "--hidden", "256", "--moe-intermediate", "128"],
            r"this checkout \| 1 \| yes \| \d+\.\dM \| \d+\.\d \| \d+\.\d \| \d+\.\d+ \| \d+\.\d",
        )
    ],
    "stop_sets.py": [
        (
            ["--problems", "2", "--samples", "1", "--max-new-tokens", "8"],
            r'"student": "gemma", "before": .*"tokens_per_answer": \d+\.\d+',
        )
    ],
    "structure_metrics.py": [([], r"ruff findings \(E,W,F,I,B,UP\) in stillroom/ +\d+")],
    "teacher_client_throughput.py": [
        (["--requests", "20"], r"fsync per record +64 +\d+ +\d+\.\d+ +\d+\.\d+x")
    ],
    "train_throughput.py": [
        (
            ["--steps", "2", "--examples", "60", "--vocab-size", "300", "--batch-size", "2"],
            r"moe lora +[\d,]+ +[\d,]+ +2 +\d+\.\d+ +\d+\.\d+ +\d+",
        )
    ],
}
# The scripts that take more than ~10 s at these sizes (on 2 cores), or run the workflow.
SLOW = {
    "chaos.py",
    "dag_build_time.py",
    "kernel_validator_sizes.py",
    "kernel_validator_throughput.py",
    "merge_memory.py",
    "moe_qlora_memory.py",
    "packing_efficiency.py",
    "pipeline_wall_time.py",
    "slurm_plan_time.py",
    "staged_load.py",
    "stop_sets.py",
    "structure_metrics.py",
    "train_throughput.py",
}


def test_every_bench_script_has_a_smoke_run():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted(SMOKE)
    assert SLOW <= set(SMOKE)


@pytest.mark.parametrize(
    "script",
    [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in sorted(SMOKE)],
)
def test_a_bench_script_runs_at_tiny_sizes_and_prints_its_numbers(script, tmp_path, request):
    if script == "code_grading.py":
        from stillroom import sandbox

        if not sandbox.bwrap_available():
            pytest.skip("bubblewrap cannot run here: code_grading compares it with no sandbox")
    config = tmp_path / "config.yaml"
    # as the done fixture writes it: a reordered mapping changes the pool's params (the benchmarks)
    config.write_text(yaml.safe_dump(small_config(), sort_keys=False))
    # this checkout's stillroom, and Triton's CPU interpreter (the kernel benches' documented run)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1"}
    for args, numbers in SMOKE[script]:
        if DONE in args:
            done = str(request.getfixturevalue("done")[0])
        args = [str(config) if a == CONFIG else done if a == DONE else a for a in args]
        proc = subprocess.run(
            [sys.executable, str(BENCH / script), *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert proc.returncode == 0, (
            f"{script} {args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
        assert re.search(numbers, proc.stdout), f"{script} {args}:\n{proc.stdout[-4000:]}"
