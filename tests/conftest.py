import copy
import os
import random
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from stillroom.data.sources import iter_sources
from stillroom.io import write_jsonl
from stillroom.runtime.student import build_model, train_tokenizer
from stillroom.stages.pool import PoolParams
from stillroom.workflow import snakemake_command, snakemake_env

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
SLURM_ELSEWHERE = "SLURM tests run by make test-slurm (.ci/run)"


def pytest_addoption(parser):
    parser.addoption(
        "--slurm",
        action="store_true",
        help="run the tests marked slurm on the local cluster (make test-slurm); else they skip",
    )


def pytest_configure(config):
    if not config.getoption("slurm"):
        # No test here submits to SLURM, so no snakemake the tests start reads a SLURM config: its
        # SLURM executor plugin asks the controller for one when loaded, seconds where SLURM is
        # installed but stopped (stillroom/plan/slurm.py OFFLINE_ENV does the same).
        os.environ["SLURM_CONF"] = os.devnull


def pytest_collection_modifyitems(config, items):
    # skipped rather than deselected, each by name, so that -rs lists them
    if not config.getoption("slurm"):
        for item in items:
            if item.get_closest_marker("slurm"):
                item.add_marker(pytest.mark.skip(reason=f"{SLURM_ELSEWHERE}: {item.name}"))
    # the tests that wait for an early run go last, in their order (module fixtures stay shared)
    late = [item for item in items if item.get_closest_marker("early_run")]
    items[:] = [item for item in items if not item.get_closest_marker("early_run")] + late


# OpenMP threads that spin for preempted partners slow a run beside a busy core many times over;
# they wait passively in every process the tests start (set before torch loads libgomp).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def default_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def recipe_files(recipe: Path) -> list[Path]:
    """The config files a recipe of config/experiments runs with: itself, or, for an overlay, the
    config its header's usage line puts it over, then itself."""
    text = recipe.read_text()
    if "sources:" in text:
        return [recipe]
    usage = re.search(r"--configfile (\S+) \S*" + re.escape(recipe.name), text)
    assert usage, f"{recipe.name}: an overlay's header shows its --configfile line"
    return [REPO / usage[1], recipe]


def small_config() -> dict:
    """The embedded default shrunk so the whole DAG runs in about a minute."""
    cfg = copy.deepcopy(default_config())
    cfg["experiment"] = "small"
    cfg["sources"] = [
        {"name": "arith", "kind": "arithmetic", "count": 240, "max_operand": 6},
        {"name": "mcq", "kind": "choice", "count": 120, "max_operand": 6},
        {"name": "scraped", "kind": "echo", "benchmark": "tinybench", "count": 6},
    ]
    cfg["heldout"] = {"size": 24, "dev_size": 12}
    cfg["generation"].update(efforts=["low", "medium"], samples_per_prompt=1, shards=2)
    cfg["student"]["tokenizer"]["vocab_size"] = 400
    cfg["student"]["model"].update(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, head_dim=8
    )
    cfg["train"].update(max_steps=8, batch_size=2, max_length=256, logging_steps=4)
    cfg["merge"]["ratios"] = [0.5]
    # request_tokens and the thinking budgets are at most max_new_tokens, the overall limit
    cfg["eval"].update(samples=2, max_new_tokens=24, request_tokens=24, batch_size=48)
    cfg["eval"]["budget_force"]["budgets"] = [8, 16]
    cfg["tables"]["n_resamples"] = 500
    return cfg


def run_snakemake(
    workdir: Path, config: dict, *args: str, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the real workflow in ``workdir`` with ``config`` (written to workdir/config.yaml)."""
    return wait_snakemake(start_snakemake(workdir, config, *args, env=env), check=check)


@dataclass
class Started:
    """A workflow run of ``start_snakemake``: its process and the files of its output."""

    proc: subprocess.Popen
    out: Path
    err: Path


def start_snakemake(workdir: Path, config: dict, *args: str, env: dict | None = None) -> Started:
    """``run_snakemake`` started and not waited for (``wait_snakemake``); its output goes to
    files beside ``workdir``."""
    cfg_path = workdir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = snakemake_command(workdir, "--cores", "2", *args, configfiles=[cfg_path])
    out, err = (workdir.with_name(workdir.name + ext) for ext in (".out", ".err"))
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            cmd, stdout=stdout, stderr=stderr, env=snakemake_env({**os.environ, **(env or {})})
        )
    return Started(proc, out, err)


def wait_snakemake(run: Started, check: bool = True) -> subprocess.CompletedProcess:
    """The finished run of ``start_snakemake``, its output read back."""
    try:
        run.proc.wait(timeout=1800)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
    stdout, stderr = run.out.read_text(), run.err.read_text()
    if check and run.proc.returncode != 0:
        raise AssertionError(
            f"snakemake failed ({run.proc.returncode}):\n{stdout[-4000:]}\n{stderr[-6000:]}"
        )
    return subprocess.CompletedProcess(run.proc.args, run.proc.returncode, stdout, stderr)


# Early runs: workflow runs that tests only read, started before the first test and run beside the
# others. A test asks for one with @pytest.mark.early_run.with_args(start) (a lone function argument
# would be taken as what the mark decorates), start(workdir) -> Started, and reads it with
# started(start). They run on the core the other tests leave idle; serially they would add at
# least their length to the suite. At EARLY_NICE a run and its jobs slow the tests least.
EARLY_NICE = 19
_RUNS: dict[Callable, tuple[Path, Started] | BaseException] = {}


@pytest.fixture(scope="session", autouse=True)
def early_runs(request, tmp_path_factory):
    for item in request.session.items:
        for mark in item.iter_markers("early_run"):
            start = mark.args[0]
            if start not in _RUNS:
                workdir = tmp_path_factory.mktemp(start.__name__)
                try:
                    _RUNS[start] = (workdir, start(workdir))
                except Exception as exc:  # raised by the test that reads it, not here
                    _RUNS[start] = exc
    yield
    for run in _RUNS.values():  # an interrupted session: snakemake cancels its jobs
        if isinstance(run, tuple) and run[1].proc.poll() is None:
            run[1].proc.terminate()
            try:
                run[1].proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run[1].proc.kill()


def started(start: Callable) -> tuple[Path, Started]:
    """The working directory and the run ``start`` began there (its test is marked early_run)."""
    run = _RUNS[start]
    if isinstance(run, BaseException):
        raise run
    return run


# What a smoke twin may change: names of things on this machine, never what the recipe does.
# The server entries are its command line and the values filled into it (how a server starts here).
# values that name a model, a file or a server, or say how to talk to the server
IDENTITY = {
    "experiment",
    "path",
    "pretrained",
    "model",
    "model_path",
    "ledger",
    "base_url",
    "stop_by",
}


def structural_differences(recipe, twin, where: str = "") -> list[str]:
    """Where ``twin`` differs from ``recipe`` in more than sizes (numbers, lists of numbers),
    model ids, paths, URLs and server command lines."""
    key = where.rsplit(".", 1)[-1]
    if isinstance(recipe, dict) and isinstance(twin, dict):
        if key == "models":  # figures keyed by model id: compared in order
            return structural_differences(list(recipe.values()), list(twin.values()), where)
        if recipe.keys() != twin.keys():
            return [f"{where or '<top>'}: keys {sorted(recipe.keys() ^ twin.keys())} differ"]
        if key == "server":  # a command template and its values: how to start it here
            return []
        return [
            d
            for k in recipe
            for d in structural_differences(recipe[k], twin[k], f"{where}.{k}".lstrip("."))
        ]
    number = (int, float)
    if isinstance(recipe, list) and isinstance(twin, list):
        if all(isinstance(v, number) and not isinstance(v, bool) for v in recipe + twin):
            return []
        if len(recipe) != len(twin):
            return [f"{where}: {len(recipe)} entries against {len(twin)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(recipe, twin, strict=True))
            for d in structural_differences(a, b, f"{where}.{i}")
        ]
    if recipe == twin or key in IDENTITY:
        return []
    if (
        isinstance(recipe, number)
        and isinstance(twin, number)
        and not isinstance(recipe, bool)
        and not isinstance(twin, bool)
    ):
        return []
    return [f"{where}: {recipe!r} against {twin!r}"]


@pytest.fixture
def small_cfg() -> dict:
    return small_config()


# A tiny dense student and an SFT set, shared by the training, hook, launch and decoding tests.
MODEL = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)

# The smallest student shape, for tests where the model's output does not matter (backends, stops).
TINY = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)


KERNEL_PROBLEMS = ["relu", "softmax_rows", "layer_norm"]


def kernel_records(names=KERNEL_PROBLEMS):
    """Pool records of a ``kind: kernels`` source of the project's problems (all of them for None),
    shared by the kernel track's tests."""
    spec = {"name": "kb", "kind": "kernels", "problems": names}
    return list(
        iter_sources(
            PoolParams.parse({"sources": [spec], "heldout": {"size": 0}}).sources, {}, seed=0
        )
    )


# A tiny Qwen3-MoE (fused experts, a router), shared by the adapter and student tests.
MOE = dict(
    family="qwen3_moe",
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)


def synthetic_rows(n=200, seed=0):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        messages = [{"role": "system", "content": "Think, then answer."}] if i % 3 == 0 else []
        messages += [
            {"role": "user", "content": f"What is {a} + {b}?"},
            {
                "role": "assistant",
                "content": f"<think>{a} + {b} = {a + b}.</think>\n"
                f"The answer is \\boxed{{{a + b}}}.",
            },
        ]
        rows.append(
            {"id": f"ex-{i}", "messages": messages, "teacher": "procedural", "effort": "low"}
        )
    return rows


# Built once per pytest run: every test only reads them (a test that trains writes elsewhere).
@pytest.fixture(scope="session")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    rows = synthetic_rows()
    write_jsonl(root / "train.jsonl", rows)
    texts = [m["content"] for r in rows for m in r["messages"]]
    train_tokenizer(texts, root / "tokenizer", vocab_size=320, min_frequency=2)
    build_model(root / "tokenizer", root / "base", model=MODEL, seed=0)
    return root


@pytest.fixture(scope="session")
def moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    rows = synthetic_rows(120)
    write_jsonl(root / "train.jsonl", rows)
    train_tokenizer(
        [m["content"] for r in rows for m in r["messages"]],
        root / "tok",
        vocab_size=320,
        min_frequency=2,
    )
    m = build_model(root / "tok", root / "base", model=MOE, seed=0)
    return root, m


@pytest.fixture(scope="session")
def done(tmp_path_factory):
    """The small workflow, run for real once per session (the pipeline and audit tests read it; the
    audit tests tamper with a copy). Its results as the run left them are copied beside it
    (``as_built``), since the pipeline tests go on to rerun and add to it."""
    workdir = tmp_path_factory.mktemp("pipeline")
    cfg = small_config()
    proc = run_snakemake(workdir, cfg)
    shutil.copytree(workdir / "results", as_built(workdir) / "results", symlinks=True)
    return workdir, cfg, proc


def as_built(workdir: Path) -> Path:
    """Where the ``done`` fixture keeps its run's results as they were when the run ended."""
    return workdir.with_name(workdir.name + "-as-built")


@pytest.fixture(scope="session")
def chat_students(tmp_path_factory):
    """A Llama-3-style and a Gemma-style tiny student (tests/chat_students.py), by style."""
    from tests.chat_students import STYLES, build

    root = tmp_path_factory.mktemp("chat_students")
    return {style: build(root, style) for style in STYLES}
