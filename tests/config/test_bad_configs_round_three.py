"""Issue 43's configs that `snakemake -n` and `stillroom estimate` accepted and that failed later
or ran wrong: each is refused by ``stillroom.plan.checks.resolve`` (what both run before any job)
in one line naming the key and the reason. A sample goes through the real `snakemake -n` and
`stillroom estimate`."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from stillroom.config import ConfigError
from stillroom.plan.checks import resolve
from stillroom.workflow import snakemake_command, snakemake_env

from .test_broken_configs import DEFAULT, KERNELS, REPO, SMOKE, _add_teacher, _all, _phased, _set

API = {"backend": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"}
TINYBENCH = "config/benchmarks/tinybench.jsonl"


def _lora(**lora):
    """Train a LoRA adapter (on attention unless ``lora`` says otherwise)."""
    return _all(
        _set("train.method", "lora"),
        _set("train.lora", {"r": 4, "alpha": 8, "target_modules": ["q_proj"], **lora}),
    )


def _teacher(spec):
    """Generate with one more teacher, ``spec``."""
    return _all(_add_teacher("other", spec), _set("generation.teacher", "other"))


def _phases(*names, **fields):
    return _phased([{"name": n, "epochs": 1, **fields} for n in names])


def _pretrained(path):
    return _set("student", {"pretrained": str(path), "effort_tag": "{effort: $effort}"})


def _in(local: str, mutate):
    """A mutation given the path ``local`` names among the test's directories."""
    return lambda config, dirs: mutate(dirs[local])(config)


def _plain(mutate):
    return lambda config, dirs: mutate(config)


# (kind, base, mutation(config, dirs), what the one-line message says: its parts, in order, split
# at "…" where a test's own directory comes between)
CASES = [
    # budgets that cannot fit
    (
        "grpo completion longer than the context",
        KERNELS,
        _plain(_set("grpo.max_completion_length", 4096)),
        "grpo.max_completion_length: 4096 leaves no room for the prompt in the student's "
        "max_position_embeddings (3072)",
    ),
    (
        "grpo completion longer than a local student's context",
        KERNELS,
        _in("moe", lambda p: _all(_pretrained(p), _set("grpo.max_completion_length", 256))),
        "grpo.max_completion_length: 256 leaves no room for the prompt in the "
        "max_position_embeddings (256) of student.pretrained",
    ),
    (
        "eval context below max_new_tokens",
        DEFAULT,
        _plain(_set("eval.context_length", 64)),
        "eval.context_length: 64 leaves no room for the prompt beside max_new_tokens (96)",
    ),
    (
        "eval samples the job cannot finish",
        DEFAULT,
        _plain(_set("eval.samples", 10**9)),
        "eval.samples: Input should be less than or equal to 1024",
    ),
    (
        "table resamples the job cannot finish",
        DEFAULT,
        _plain(_set("tables.n_resamples", 10**12)),
        "tables.n_resamples: Input should be less than or equal to 1000000",
    ),
    (
        "lora dropout 1",
        DEFAULT,
        _plain(_lora(dropout=1)),
        "train.lora.dropout: Input should be less than 1",
    ),
    # names that point nowhere
    (
        "unknown kernel problem",
        KERNELS,
        _plain(
            _set("sources.0", {"name": "kb", "kind": "kernels", "problems": ["relu", "nosuch"]})
        ),
        "sources.0.problems: source 'kb': no problem file for ['nosuch']",
    ),
    (
        "unknown problem of a generated family",
        KERNELS,
        _plain(_set("sources.0.problems", ["relu_nosuch"])),
        "sources.0.problems: relu_nosuch not in family elementwise",
    ),
    (
        # an effort group has no rule of its own any more: its jobs are generate's
        "cost.gpus naming an effort group's rule of old",
        DEFAULT,
        _plain(
            _all(
                _set("generation.effort_groups", [["low", "medium"]]),
                _set("cost.gpus", {"generate_low_medium": 2}),
            )
        ),
        "cost.gpus.generate_low_medium: not a rule of the workflow (one of …, generate, grade_eval",
    ),
    (
        "gpu_type_by_rule naming no rule",
        DEFAULT,
        _plain(
            _all(
                _set("cost.gpu_types", {"h100": {"usd_per_hour": 2, "memory_gb": 80}}),
                _set("cost.gpu_type", "h100"),
                _set("cost.gpu_type_by_rule", {"trian": "h100"}),
            )
        ),
        "cost.gpu_type_by_rule.trian: not a rule of the workflow (did you mean 'train'?)",
    ),
    (
        "cost.gpus naming no rule",
        DEFAULT,
        _plain(_set("cost.gpus", {"evaluate_budgets": 2})),
        "cost.gpus.evaluate_budgets: not a rule of the workflow (did you mean 'evaluate_budget'?)",
    ),
    (
        "benchmark named like a budget table",
        DEFAULT,
        _plain(
            _all(
                _set("benchmarks.heldout-budgets", TINYBENCH),
                _set("eval.benchmarks", ["heldout", "heldout-budgets"]),
            )
        ),
        "eval.benchmarks.1: 'heldout-budgets' ends like another table's file",
    ),
    (
        "benchmark named like an effort table",
        DEFAULT,
        _plain(
            _all(
                _set("benchmarks.heldout-efforts", TINYBENCH),
                _set("eval.benchmarks", ["heldout", "heldout-efforts"]),
            )
        ),
        "eval.benchmarks.1: 'heldout-efforts' ends like another table's file",
    ),
    (
        "phase named like the adapter",
        DEFAULT,
        _plain(_all(_lora(), _phases("warm", "warm.adapter", "last"))),
        "train.phases.1.name: 'warm.adapter' ends like another file of a checkpoint",
    ),
    (
        "phase named like a sidecar",
        DEFAULT,
        _plain(_phases("warm", "warm.prov.json", "last")),
        "train.phases.1.name: 'warm.prov.json' ends like another file of a checkpoint",
    ),
    # paths
    (
        "local pretrained that does not exist",
        DEFAULT,
        _in("tmp", lambda p: _pretrained(p / "nosuch")),
        "nosuch does not exist (a local model directory, or a hub id owner/name)",
    ),
    (
        "pretrained directory that is not a model",
        DEFAULT,
        _in("notmodel", _pretrained),
        "notmodel is not a model directory (no config.json, tokenizer_config.json)",
    ),
    (
        "dataset path with an unknown suffix",
        DEFAULT,
        _in("tmp", lambda p: _set("benchmarks.extra", {"path": str(p / "rows.txt")})),
        "rows.txt is a local file of an unknown kind (.txt)",
    ),
    (
        "budget ledger that is a directory",
        DEFAULT,
        _in(
            "tmp",
            lambda p: _teacher(
                {
                    **API,
                    "sampling": {"max_tokens": 64},
                    "budget": {"daily_output_tokens": 1000, "ledger": str(p)},
                }
            ),
        ),
        "teachers.other.budget.ledger: …is a directory",
    ),
    (
        "hf teacher model that does not exist",
        DEFAULT,
        _in("tmp", lambda p: _teacher({"backend": "hf", "model_path": str(p / "teacher")})),
        "teachers.other.model_path: …teacher does not exist",
    ),
    (
        "experiment name too long for a file name",
        DEFAULT,
        _plain(_set("experiment", "x" * 300)),
        "experiment: 300 bytes is longer than a file name may be (255",
    ),
    # an overlay that turns the kernel track on over a math config
    (
        "kernel track over a math config",
        DEFAULT,
        _plain(_set("kernels", {})),
        "kernels: the kernel track's validator and tables, but no source has kind 'kernels'",
    ),
    # MoE keys, against the student built here or a local model's config.json
    (
        "target_parameters on a dense model",
        DEFAULT,
        _plain(_lora(target_parameters=["mlp.experts.gate_up_proj"])),
        "train.lora.target_parameters: student.model is a dense model",
    ),
    (
        "target_parameters on a local dense model",
        DEFAULT,
        _in(
            "dense", lambda p: _all(_pretrained(p), _lora(target_parameters=["experts.down_proj"]))
        ),
        "train.lora.target_parameters: student.pretrained",
    ),
    (
        "target module not in the model",
        SMOKE,
        _plain(_set("train.lora.target_modules", ["q_proj", "gate_proj"])),
        "train.lora.target_modules: 'gate_proj' matches nothing in student.model",
    ),
    (
        "target module not in a local model",
        DEFAULT,
        _in("moe", lambda p: _all(_pretrained(p), _lora(target_modules=["qkv_proj"]))),
        "train.lora.target_modules: 'qkv_proj' matches nothing in student.pretrained",
    ),
    (
        "expert-parallel size not dividing the experts",
        SMOKE,
        _plain(
            _all(
                _set("train.distributed", {"gpus_per_node": 3, "expert_parallel_size": 3}),
                _set("train.lora.target_parameters", []),
            )
        ),
        "train.distributed.expert_parallel_size: 3 does not divide the 8 experts of student.model",
    ),
    (
        "device_map typo",
        SMOKE,
        _plain(_set("train.device_map", "atuo")),
        "train.device_map: 'atuo' is not a strategy (auto, balanced, balanced_low_0, sequential)",
    ),
    (
        "device_map onto no device",
        SMOKE,
        _plain(_set("train.device_map", {"model": "gpu0"})),
        "train.device_map.model: 'gpu0' is not a device",
    ),
    (
        "gpu_memory_limit of no GPU",
        SMOKE,
        _plain(_all(_set("train.device_map", "auto"), _set("train.gpu_memory_limit", "1KB"))),
        "train.gpu_memory_limit: '1KB' is not a GPU's memory (1MiB to 16TiB; an int is GiB)",
    ),
    (
        "gpu_memory_limit with a trailing newline",
        SMOKE,
        _plain(_all(_set("train.device_map", "auto"), _set("train.gpu_memory_limit", "80GiB\n"))),
        "train.gpu_memory_limit: a memory size is an int of GiB",
    ),
    (
        "max_memory of a GPU the job does not have",
        SMOKE,
        _plain(_all(_set("train.device_map", "auto"), _set("train.max_memory", {7: "80GiB"}))),
        "train.max_memory.7: GPU 7 is not one of the 1 of gpus_per_node",
    ),
    (
        "max_memory of no GPU",
        SMOKE,
        _plain(_all(_set("train.device_map", "auto"), _set("train.max_memory", {"cpu": "64GiB"}))),
        "train.max_memory: gives no GPU",
    ),
    # values that pass a pattern but mean nothing
    (
        "unknown attribute in a sampled option",
        DEFAULT,
        _plain(_set("train.sampled_options", {"num_loops": [1, 2]})),
        "train.sampled_options: the model config of student.model has no num_loops",
    ),
    (
        "phase with no efforts",
        DEFAULT,
        _plain(
            _phased([{"name": "first", "epochs": 1, "efforts": []}, {"name": "last", "epochs": 1}])
        ),
        "train.phases.0.efforts: List should have at least 1 item",
    ),
    (
        "effort tag with an escaped $",
        DEFAULT,
        _plain(_set("student.effort_tag", "{effort: $$effort}")),
        "student.effort_tag: '{effort: $$effort}' has no $effort to substitute",
    ),
    (
        "extra sampling option overriding a typed field",
        DEFAULT,
        _plain(_teacher({**API, "sampling": {"temperature": 0.6, "extra": {"temperature": 1.0}}})),
        "teachers.other.sampling.extra.temperature: a typed sampling field; set "
        "sampling.temperature instead",
    ),
    (
        "prompt template with an unknown placeholder",
        DEFAULT,
        _plain(
            _set("benchmarks.extra", {"path": TINYBENCH, "prompt_template": "$prompt in $lang"})
        ),
        "benchmarks.extra.prompt_template: only $prompt may be substituted (KeyError('lang')",
    ),
    (
        "where filter with min above max",
        DEFAULT,
        _plain(
            _set("benchmarks.extra", {"path": TINYBENCH, "where": {"level": {"min": 5, "max": 1}}})
        ),
        "benchmarks.extra.where.level.min: 5 is above max (1): no row could pass",
    ),
]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, setup, moe):
    """A scratch directory (a ledger path, a data file of an unknown kind), a directory that is no
    model, and real local models: the dense and the MoE students the training tests build."""
    tmp = tmp_path_factory.mktemp("round3")
    (tmp / "rows.txt").write_text("What is 1 + 1?\n")
    (tmp / "notmodel").mkdir()
    (tmp / "notmodel" / "weights.bin").write_bytes(b"\0")
    return {
        "tmp": tmp,
        "notmodel": tmp / "notmodel",
        "dense": setup / "base",
        "moe": moe[0] / "base",
    }


@pytest.mark.parametrize(
    ("base", "mutate", "expected"),
    [pytest.param(base, mutate, expected, id=kind) for kind, base, mutate, expected in CASES],
)
def test_round_three_config_is_refused_in_one_line(base, mutate, expected, dirs):
    config = copy.deepcopy(base)
    mutate(config, dirs)
    with pytest.raises(ConfigError) as err:
        resolve(config, REPO)
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid config:" and len(lines) == 2, str(err.value)
    assert _says(lines[1], expected), lines[1]


def _says(text: str, expected: str) -> bool:
    """Whether ``text`` holds the parts of ``expected`` (split at "…") in order."""
    at = 0
    for part in expected.split("…"):
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True


def test_the_issue_kinds_are_all_here():
    assert len(CASES) >= 31


@pytest.mark.parametrize(
    "base, mutate, accepted",
    [
        # a hub id cannot be looked up offline: its job fetches it and fails there, named
        pytest.param(DEFAULT, _pretrained("Qwen/Qwen3-0.6B"), True, id="hub student"),
        pytest.param(
            DEFAULT,
            _teacher({"backend": "hf", "model_path": "Qwen/Qwen3-0.6B"}),
            True,
            id="hub teacher",
        ),
        # MoE keys of a hub student are checked when its job has loaded its config
        pytest.param(
            DEFAULT,
            _all(_pretrained("Qwen/Qwen3-30B-A3B"), _lora(target_parameters=["experts.x"])),
            True,
            id="hub student's targets",
        ),
        pytest.param(SMOKE, _set("train.device_map", "balanced_low_0"), True, id="a strategy"),
        pytest.param(
            SMOKE,
            _all(
                _set("train.device_map", {"model": 0, "lm_head": "cpu"}),
                _set("train.lora.target_parameters", []),
            ),
            True,
            id="a module map",
        ),
        pytest.param(
            DEFAULT,
            _set("benchmarks.extra", {"path": TINYBENCH, "where": {"level": {"min": 3, "max": 3}}}),
            True,
            id="where min equal to max",
        ),
        pytest.param(DEFAULT, _set("student.effort_tag", "$$ $effort"), True, id="a literal $"),
    ],
)
def test_near_misses_are_accepted(base, mutate, accepted):
    config = copy.deepcopy(base)
    mutate(config)
    assert bool(resolve(config, REPO)) is accepted


SAMPLE = ["lora dropout 1", "cost.gpus naming no rule", "pretrained directory that is not a model"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", SAMPLE)
def test_snakemake_n_and_estimate_refuse_before_any_job(kind, dirs, tmp_path):
    """The same one line from the real `snakemake -n` and `stillroom estimate`, no job run."""
    _, base, mutate, expected = next(c for c in CASES if c[0] == kind)
    config = copy.deepcopy(base)
    mutate(config, dirs)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = tmp_path / "run"
    workdir.mkdir()
    env = snakemake_env()
    runs = {
        "snakemake -n": snakemake_command(workdir, "-n", "--cores", "1", configfiles=[path]),
        "stillroom estimate": [
            *(sys.executable, "-m", "stillroom", "estimate", "--configfile", str(path)),
            *("--root", str(REPO)),
        ],
    }
    for name, cmd in runs.items():
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
        out = done.stdout + done.stderr
        assert done.returncode != 0, f"{name} accepted it:\n{out}"
        assert _says(out, expected), f"{name}:\n{out}"
        assert "Traceback" not in out, f"{name}:\n{out}"
    assert not (workdir / "results").exists()  # nothing was written: no job ran
