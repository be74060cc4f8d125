"""The GRPO stage: the dual reward scored for real, a CPU smoke run of TRL's GRPOTrainer, bad
inputs."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from transformers import AutoModelForCausalLM

from stillroom.cli import build_parser
from stillroom.config import ConfigError, Experiment, ValidatorOptions, merge_configs
from stillroom.grading.formats import user_content
from stillroom.io import DataError, read_jsonl, write_jsonl
from stillroom.kernels import KernelResult
from stillroom.kernels.reward import NO_CODE
from stillroom.runtime import grpo
from stillroom.runtime.grpo import (
    DiversitySampler,
    HarnessFailure,
    KernelReward,
    diversity_weight,
    load_problems,
)
from stillroom.runtime.student import build_model, train_tokenizer
from stillroom.stages.grpo import Params, job_params, run

from ..conftest import REPO, TINY, recipe_files

KERNELS = Path(__file__).resolve().parents[2] / "stillroom" / "kernels"
NAMES = ("relu", "add", "mul")
MODEL = {**TINY, "max_position_embeddings": 2048}


def problem(name: str) -> str:
    return (KERNELS / "problems" / f"{name}.py").read_text()


def solution(name: str) -> str:
    return (KERNELS / "solutions" / f"{name}.py").read_text()


def record(name: str, kind: str = "kernel") -> dict:
    src = problem(name)
    return {
        "prompt_id": f"kb-{name}",
        "source": "kernelbench",
        "kind": kind,
        "prompt": src,
        "answer": src,
        "meta": {"name": name},
    }


@pytest.fixture(scope="module")
def kernel_setup(tmp_path_factory):
    """A tiny random Qwen3 whose tokenizer is trained on the kernel prompts (short prompts, fast
    steps)."""
    root = tmp_path_factory.mktemp("grpo")
    write_jsonl(root / "problems.jsonl", [record(n) for n in NAMES])
    texts = [user_content(record(n)) for n in NAMES] + [solution(n) for n in NAMES]
    train_tokenizer(texts, root / "tokenizer", vocab_size=800, min_frequency=2)
    build_model(root / "tokenizer", root / "base", model=MODEL, seed=0)
    return root


def test_reward_is_execution_times_rules():
    reward = KernelReward(ValidatorOptions(), workers=2)
    logged = {}
    completions, answers, ids, expected = [], [], [], []
    for name in ("relu", "add"):
        honest = "<think>plan</think>\n```python\n" + solution(name) + "```"
        cheat = (
            "<think>plan</think>\n```python\n"
            + problem(name).replace("class Model(", "class ModelNew(")
            + "```"
        )
        for text, want in ((honest, 1.0), (cheat, 0.0), ("<think>plan</think>\nNo idea.", 0.0)):
            completions.append([{"role": "assistant", "content": text}] if name == "add" else text)
            answers.append(problem(name))
            ids.append(f"kb-{name}")
            expected.append(want)
    scores = reward(
        completions,
        answers,
        ids,
        trainer_state=SimpleNamespace(global_step=4),
        log_metric=lambda k, v: logged.__setitem__(k, v),
    )
    assert scores == expected
    assert reward.__name__ == "kernel_reward"
    rows = reward.records
    assert [r["step"] for r in rows] == [5] * 6 and [r["prompt_id"] for r in rows] == ids
    for honest, cheat, empty in (rows[0:3], rows[3:6]):
        assert honest["correct"] and honest["launched_triton"] and honest["rule_reward"] == 1.0
        # The torch module computes outside any program the replay can run: nothing of it
        # reaches the replayed outputs, and no kernel was launched.
        assert (
            cheat["exec_reward"] == 0.0 and cheat["rule_reward"] == 0.0 and cheat["reward"] == 0.0
        )
        assert cheat["reason"] == "output 0 is not made by the program (computed outside kernels)"
        assert not empty["compiled"] and empty["reason"] == NO_CODE  # no ```python block
    assert logged == {
        "kernel/exec_reward": 2 / 6,
        "kernel/rule_reward": 2 / 6,
        "kernel/launched_triton": 2 / 6,
        "kernel/harness_failures": 0.0,
    }
    # the validator's inputs come from the seed: a repeated completion is scored once, the same
    assert reward.validator_runs == 6
    again = reward(completions[::-1], answers[::-1], ids[::-1])
    assert again == expected[::-1] and reward.validator_runs == 6
    assert reward.records[6:] == [{**r, "step": None} for r in rows[5::-1]]


def test_a_completion_the_validator_failed_on_gets_no_reward(monkeypatch):
    """None, not 0: TRL leaves it out of its group's baseline and gives it no advantage."""
    scored = KernelResult(1.0, 1.0, 1.0, True, True, True)
    failed = KernelResult(0.0, 0.0, 0.0, False, False, False, reasons=["harness: lost"])
    failed.status = "harness"
    results = iter([scored, failed])
    monkeypatch.setattr(grpo, "score_answer", lambda *a, **k: next(results))
    reward, logged = KernelReward(ValidatorOptions()), {}
    scores = reward(["a", "b"], ["p", "p"], ["kb-x", "kb-x"], log_metric=logged.__setitem__)
    assert scores == [1.0, None]
    assert reward.records[1]["status"] == "harness" and reward.records[1]["exec_reward"] is None
    assert reward.latest == {}  # kept only for diversity sampling (no gathering otherwise)
    tracking = KernelReward(ValidatorOptions(), track_groups=True)
    results = iter([scored, failed])
    tracking(["a", "b"], ["p", "p"], ["kb-x", "kb-x"])
    assert tracking.latest == {"kb-x": [1.0]}  # the validator's failure says nothing
    assert logged["kernel/exec_reward"] == 1.0 and logged["kernel/harness_failures"] == 1.0


def test_a_step_whose_rewards_are_mostly_harness_failures_stops_training(monkeypatch):
    """The model would learn from no reward: a loud stop, naming the validator's failure."""
    failed = KernelResult(0.0, 0.0, 0.0, False, False, False, reasons=["harness: no channel"])
    failed.status = "harness"
    scored = KernelResult(1.0, 1.0, 1.0, True, True, True)
    results = iter([scored, failed, scored, failed])
    monkeypatch.setattr(grpo, "score_answer", lambda *a, **k: next(results))
    reward = KernelReward(ValidatorOptions(), max_harness_share=0.25)
    with pytest.raises(HarnessFailure, match=r"step 3: 2 of 4 rewards .* harness: no channel"):
        reward(
            ["a", "b", "c", "d"],
            ["p"] * 4,
            ["kb-x"] * 4,
            trainer_state=SimpleNamespace(global_step=2),
        )
    results = iter([scored, failed, scored, scored])
    assert KernelReward(ValidatorOptions(), max_harness_share=0.25)(
        ["a", "b", "c", "d"], ["p"] * 4, ["kb-x"] * 4
    ) == [1.0, None, 1.0, 1.0]


def test_grpo_smoke_run_saves_a_loadable_model(kernel_setup, tmp_path, monkeypatch):
    """Two real GRPO steps on CPU. A random model never writes a code block, so every reward would
    be 0 and no update would happen: the first completion of each group is swapped for its problem's
    reference answer before scoring (the validator still runs for real), which gives each group one
    1 and one 0."""
    honest = {problem(n): "<think>plan</think>\n```python\n" + solution(n) + "```" for n in NAMES}
    score = KernelReward._score
    calls = []

    def swap_first_of_group(self, problem_src, text):
        calls.append(text)
        return score(self, problem_src, honest[problem_src] if len(calls) % 2 else text)

    monkeypatch.setattr(KernelReward, "_score", swap_first_of_group)
    lines = []
    params = {
        "max_steps": 2,
        "group_size": 2,
        "prompts_per_step": 2,
        "max_completion_length": 24,
        "lr": 1e-3,
        "seed": 0,
        "validator": {"trials": 1, "timeout_s": 60},
    }
    out = tmp_path / "grpo"
    metrics = run(
        base=str(kernel_setup / "base"),
        problems=str(kernel_setup / "problems.jsonl"),
        out_model=str(out),
        params=params,
        threads=2,
        log=lines.append,
    )
    json.dumps(metrics, allow_nan=False)  # goes into the provenance sidecar
    assert metrics["steps"] == 2 and metrics["completions"] == 2 * 2 * 2
    assert [s["step"] for s in metrics["per_step"]] == [1, 2]
    for s in metrics["per_step"]:
        assert s["reward"] == 0.5 and s["reward_std"] > 0
    assert (
        metrics["per_step"][0]["kl"] == 0.0 < metrics["per_step"][1]["kl"]
    )  # the first update moved the policy
    assert (
        metrics["reward_mean"]
        == metrics["exec_mean"]
        == metrics["rule_mean"]
        == metrics["launch_rate"]
        == 0.5
    )
    assert metrics["trl_version"]
    assert sum(line.startswith("step ") and " reward 0.500 " in line for line in lines) == 2, lines

    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "grpo"
    ]  # no temporary directory left behind
    assert not (out / "trainer").exists()
    rewards = read_jsonl(out / "rewards.jsonl", required=("step", "prompt_id", "reward", "reason"))
    assert len(rewards) == 8 and [r["step"] for r in rewards] == [1] * 4 + [2] * 4
    assert [r["reward"] for r in rewards] == [1.0, 0.0] * 4
    assert {r["prompt_id"] for r in rewards} <= {f"kb-{n}" for n in NAMES}
    model = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(kernel_setup / "base")
    assert model.config.use_cache
    assert any(
        (a - b).abs().max() > 0 for a, b in zip(model.parameters(), base.parameters(), strict=False)
    )


@pytest.mark.slow
def test_two_processes_share_the_groups_and_gather_the_rewards(kernel_setup, tmp_path):
    """grpo.distributed: 2 torchrun processes (gloo, FSDP2-sharded), each generating and scoring its
    share; rank 0 gathers every scored completion and saves the whole model."""
    out = tmp_path / "grpo"
    metrics = run(
        base=str(kernel_setup / "base"),
        problems=str(kernel_setup / "problems.jsonl"),
        out_model=str(out),
        params={
            "max_steps": 2,
            "group_size": 2,
            "prompts_per_step": 2,
            "max_completion_length": 8,
            "distributed": {"gpus_per_node": 2},
            "sampling": "diversity",
            "seed": 1,
        },
        threads=2,
        log=lambda _: None,
    )
    assert metrics["world_size"] == 2 and metrics["steps"] == 2 and metrics["completions"] == 8
    rewards = read_jsonl(out / "rewards.jsonl", required=("step", "prompt_id", "reward"))
    assert len(rewards) == 8 and {r["step"] for r in rewards} == {1, 2}
    # Both processes drew the same problems (gathered rewards, one seed): each step is two whole
    # groups of two distinct problems, one group per process.
    for step in (1, 2):
        ids = sorted(r["prompt_id"] for r in rewards if r["step"] == step)
        assert len(set(ids)) == 2 and ids == sorted(sorted(set(ids)) * 2), ids
    assert AutoModelForCausalLM.from_pretrained(out).config.use_cache
    assert not list(tmp_path.glob(".*.tmp"))  # neither the launch spec nor a temporary is left
    with pytest.raises(
        ConfigError, match="grpo.prompts_per_step: 3 must be a multiple of the 2 processes"
    ):
        Params.parse({"prompts_per_step": 3, "distributed": {"gpus_per_node": 2}}, where="grpo")


def test_diversity_weight_is_the_groups_spread():
    assert diversity_weight(None, 0.05) == diversity_weight([], 0.05) == 0.25  # unseen: the most
    assert diversity_weight([1.0, 0.0, 1.0, 0.0], 0.05) == 0.25
    assert diversity_weight([1.0, 0.0, 0.0, 0.0], 0.05) == pytest.approx(0.1875)
    # a group all right or all wrong has no advantage to learn from: the floor
    assert diversity_weight([1.0] * 4, 0.05) == diversity_weight([0.0] * 4, 0.05) == 0.05


def test_diversity_sampler_keeps_trls_layout_and_follows_the_rewards():
    ids = [f"p{i}" for i in range(8)]
    latest = {pid: [1.0] * 4 for pid in ids}  # every problem solved...
    latest["p3"] = [1.0, 0.0, 1.0, 0.0]  # ...but one
    sampler = DiversitySampler(
        ids, latest, group_size=2, batch_size=2, repeat_count=3, floor=0.001, seed=0
    )
    order = list(sampler)
    assert len(order) == len(sampler) == 4 * 2 * 2 * 3
    batches = [order[i : i + 2 * 2 * 3] for i in range(0, len(order), 2 * 2 * 3)]
    for batch in batches:
        first = batch[:4]  # two distinct problems, each a group of two, the block repeated
        assert first[0] == first[1] != first[2] == first[3] and batch == first * 3
    drawn = [i for batch in batches for i in batch[:4:2]]
    assert drawn.count(3) == 4  # weight 0.25 against 0.001: in every batch
    # seeded: another pass is another draw, a new sampler with the seed repeats the first
    again = DiversitySampler(
        ids, latest, group_size=2, batch_size=2, repeat_count=3, floor=0.001, seed=0
    )
    assert list(again) == order
    # the weights are read when a batch is drawn: rewards that arrive later count
    latest["p3"], latest["p5"] = [1.0] * 4, [0.0, 1.0]
    assert all(5 in batch for batch in (list(sampler)[i : i + 12] for i in range(0, 48, 12)))


def test_bad_problems_and_params(kernel_setup, tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text(
        json.dumps(record("relu")) + "\n\n" + json.dumps(record("add", kind="math")) + "\n"
    )
    assert [r["prompt_id"] for r in load_problems(path)] == [
        "kb-relu"
    ]  # a mixed pool's kernels only
    path.write_text(json.dumps(record("add", kind="math")) + "\n")
    with pytest.raises(
        DataError, match=r"problems\.jsonl: none of its 1 rows has key 'kind' = 'kernel'"
    ):
        run(
            base=str(kernel_setup / "base"),
            problems=str(path),
            out_model=str(tmp_path / "out"),
            params={},
        )
    path.write_text(json.dumps({k: v for k, v in record("relu").items() if k != "answer"}) + "\n")
    with pytest.raises(DataError, match=r"problems\.jsonl:1: missing key 'answer'"):
        run(
            base=str(kernel_setup / "base"),
            problems=str(path),
            out_model=str(tmp_path / "out"),
            params={},
        )
    with pytest.raises(ConfigError, match="grpo: unknown key 'learning_rate'"):
        run(
            base=str(kernel_setup / "base"),
            problems=str(kernel_setup / "problems.jsonl"),
            out_model=str(tmp_path / "out"),
            params={"learning_rate": 1e-6},
        )
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="grpo.loss_type"):
        Params.parse({"loss_type": "ppo"}, where="grpo")
    with pytest.raises(ConfigError, match="grpo.group_size"):
        Params.parse({"group_size": 1}, where="grpo")  # GRPO's advantage needs a group
    with pytest.raises(ConfigError, match="grpo.validator: unknown key 'device_id'"):
        Params.parse({"validator": {"device_id": 0}}, where="grpo")
    assert Params.parse({"seed": 3}, where="grpo").seed == 3  # the pipeline injects seed
    args = build_parser().parse_args(["grpo", "--base", "b", "--problems", "p", "--out-model", "m"])
    assert (args.base, args.problems, args.out_model) == ("b", "p", "m")


def test_the_grpo_job_takes_the_grpo_section_and_the_kernels_validator():
    config: dict = {}
    for path in recipe_files(REPO / "config/experiments/autotriton-tiny.yaml"):
        config = merge_configs(config, yaml.safe_load(path.read_text()))
    exp = Experiment.parse(config)
    params = job_params(exp)
    assert params.validator == exp.kernels.validator and params.lr == exp.grpo.lr
    job = json.loads(params.as_param())
    assert job["seed"] == exp.seed and job["group_size"] == exp.grpo.group_size
    assert job["validator"] == exp.kernels.validator.dump()
    # no kernels section: the validator's defaults, written as none given
    bare = job_params(Experiment.parse({**config, "kernels": None}))
    assert bare.validator == ValidatorOptions() and json.loads(bare.as_param())["validator"] == {}
