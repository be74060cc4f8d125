"""GRPO on kernel problems (the AutoTriton recipe) with TRL's GRPOTrainer and the validator's dual reward.

Each step samples ``group_size`` completions for each of ``prompts_per_step`` problems; a completion's
reward is execution x rules from ``kernels.validator.evaluate``, so a correct module that computes with
torch instead of Triton earns 0. The reward is one function on purpose: TRL sums several reward
functions before the group normalisation, and a separate rule reward added to the execution reward
would pay a cheat half the credit instead of zeroing it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stillroom import launch
from stillroom.io import DataError, atomic_dir, read_jsonl, write_jsonl
from stillroom.kernels import VALIDATOR_DEFAULTS
from stillroom.kernels.prompting import extract_code, user_content

PARAM_DEFAULTS: dict[str, Any] = {
    "group_size": 4,
    "prompts_per_step": 2,
    "beta": 0.04,
    "loss_type": "dapo",
    "lr": 1e-6,
    "max_steps": 100,
    "max_completion_length": 1024,
    "temperature": 1.0,
    "top_p": 1.0,
    "epsilon": 0.2,
    "seed": 0,
    "logging_steps": 1,
    "validator": {},
    "reward_workers": None,
    "dtype": "auto",
    "gradient_checkpointing": False,
    "distributed": None,
}
# TRL 1.16's loss types that work with token-level importance sampling (luspo needs sequence level).
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "vespo")
DTYPES = ("auto", "float32")
REQUIRED = ("prompt_id", "kind", "prompt", "answer")


def check_params(params: Mapping) -> dict[str, Any]:
    """Return ``params`` over the defaults; unknown keys and out-of-range values raise ValueError naming the key."""
    unknown = sorted(set(params) - set(PARAM_DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown grpo param(s): {', '.join(unknown)} (known: {', '.join(PARAM_DEFAULTS)})"
        )
    p = {**PARAM_DEFAULTS, **params}
    lowest = {
        "group_size": 2,
        "prompts_per_step": 1,
        "max_steps": 1,
        "max_completion_length": 1,
        "seed": 0,
        "logging_steps": 1,
        "reward_workers": 1,
    }
    for key, low in lowest.items():
        if key == "reward_workers" and p[key] is None:  # one per thread of the stage
            continue
        if isinstance(p[key], bool) or not isinstance(p[key], int) or p[key] < low:
            raise ValueError(f"grpo param {key} must be an int >= {low}, got {p[key]!r}")
    for key, ok, want in (
        ("beta", lambda v: v >= 0, ">= 0"),
        ("lr", lambda v: v > 0, "> 0"),
        ("temperature", lambda v: v > 0, "> 0"),
        ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"),
        ("epsilon", lambda v: v > 0, "> 0"),
    ):
        if isinstance(p[key], bool) or not isinstance(p[key], (int, float)) or not ok(p[key]):
            raise ValueError(f"grpo param {key} must be a number {want}, got {p[key]!r}")
    if p["loss_type"] not in LOSS_TYPES:
        raise ValueError(
            f"grpo param loss_type: {p['loss_type']!r} is not one of {', '.join(LOSS_TYPES)}"
        )
    if p["dtype"] not in DTYPES:
        raise ValueError(
            f"grpo param dtype: {p['dtype']!r} is not one of {', '.join(DTYPES)} (bf16 weights would "
            "lose every update below half a bf16 step; on GPU, auto computes in bf16 over float32)"
        )
    # ValueError, not TypeError, for bad types too: the CLI reports ValueError as a usage error
    if not isinstance(p["gradient_checkpointing"], bool):
        raise ValueError(  # noqa: TRY004
            f"grpo param gradient_checkpointing must be true or false, got {p['gradient_checkpointing']!r}"
        )
    if not isinstance(p["validator"], Mapping):
        raise ValueError(f"grpo param validator must be an object, got {p['validator']!r}")  # noqa: TRY004
    bad = sorted(set(p["validator"]) - set(VALIDATOR_DEFAULTS))
    if bad:
        raise ValueError(
            f"unknown grpo validator key(s): {', '.join(bad)} (known: {', '.join(VALIDATOR_DEFAULTS)})"
        )
    v = p["validator"] = {**VALIDATOR_DEFAULTS, **p["validator"]}
    p["distributed"] = launch.check_distributed({"distributed": p["distributed"]})
    if p["prompts_per_step"] % p["distributed"]["world_size"]:
        raise ValueError(
            f"grpo param prompts_per_step {p['prompts_per_step']} must be a multiple of the "
            f"{p['distributed']['world_size']} processes of grpo.distributed (each takes whole groups)"
        )
    if v["device"] not in ("cpu", "cuda"):
        raise ValueError(f"grpo validator device: {v['device']!r} is not cpu or cuda")
    if isinstance(v["trials"], bool) or not isinstance(v["trials"], int) or v["trials"] < 1:
        raise ValueError(f"grpo validator trials must be an int >= 1, got {v['trials']!r}")
    if (
        isinstance(v["timeout_s"], bool)
        or not isinstance(v["timeout_s"], (int, float))
        or v["timeout_s"] <= 0
    ):
        raise ValueError(f"grpo validator timeout_s must be a number > 0, got {v['timeout_s']!r}")
    return p


class KernelReward:
    """TRL reward function: the validator's reward (execution x rules) of each completion's ModelNew block.

    A batch's completions are evaluated concurrently on ``workers`` threads (each candidate runs in its own
    process, forked from the validator's warm server). Every scored completion is kept in ``records``.
    """

    __name__ = "kernel_reward"  # TRL logs rewards/<name>/mean

    def __init__(
        self,
        *,
        workers: int = 1,
        device: str = "cpu",
        trials: int = 3,
        timeout_s: float = 60.0,
        seed: int = 0,
    ):
        self.workers = workers
        self.options = {"device": device, "trials": trials, "timeout_s": timeout_s, "seed": seed}
        self.records: list[dict[str, Any]] = []

    def _score(self, problem: str, text: str) -> dict[str, Any]:
        from stillroom.kernels.validator import evaluate

        code = extract_code(text)
        if code is None:  # nothing to run: no subprocess
            return {
                "exec_reward": 0.0,
                "rule_reward": 0.0,
                "reward": 0.0,
                "compiled": False,
                "correct": False,
                "launched_triton": False,
                "reason": "no code block after the reasoning",
            }
        r = evaluate(problem, code, **self.options)
        return {
            "exec_reward": r.exec_reward,
            "rule_reward": r.rule_reward,
            "reward": r.reward,
            "compiled": r.compiled,
            "correct": r.correct,
            "launched_triton": r.launched_triton,
            "reason": r.reasons[0] if r.reasons else "",
        }

    def __call__(
        self,
        completions: list,
        answer: list[str],
        prompt_id: list[str],
        *,
        trainer_state=None,
        log_metric: Callable[[str, float], Any] | None = None,
        **_,
    ) -> list[float]:
        # Conversational completions arrive as [{"role": "assistant", "content": ...}]
        texts = [
            c if isinstance(c, str) else "".join(m["content"] or "" for m in c) for c in completions
        ]
        with ThreadPoolExecutor(max(1, min(self.workers, len(texts)))) as pool:
            scored = list(pool.map(self._score, answer, texts))
        # Completions are generated at the start of the optimizer step they train: global_step + 1.
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        self.records += [{"step": step, "prompt_id": pid, **s} for pid, s in zip(prompt_id, scored)]
        if log_metric is not None:
            for key in ("exec_reward", "rule_reward", "launched_triton"):
                log_metric(f"kernel/{key}", sum(float(s[key]) for s in scored) / len(scored))
        return [s["reward"] for s in scored]


def load_problems(path) -> list[dict[str, Any]]:
    """The kernel problems of a pool as conversational GRPO rows; a mixed pool's other kinds are left out."""
    records = read_jsonl(path, required=REQUIRED)
    kernels = [rec for rec in records if rec["kind"] == "kernel"]
    if not kernels:
        raise DataError(
            f"{path}: none of its {len(records)} rows has key 'kind' = 'kernel'; GRPO trains on "
            "kernel problems"
        )
    return [
        {
            "prompt": [{"role": "user", "content": user_content(rec)}],
            "answer": rec["answer"],
            "prompt_id": rec["prompt_id"],
        }
        for rec in kernels
    ]


def progress_callback(log: Callable[[str], Any]):
    """A TrainerCallback sending one line per logged step to ``log``."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                kl = logs.get("kl")
                log(
                    f"step {state.global_step}/{state.max_steps} reward {logs['reward']:.3f} "
                    f"std {logs.get('reward_std', 0.0):.3f} kl {'-' if kl is None else f'{kl:.4g}'}"
                )

    return Progress()


def train_grpo(
    base_dir, problems, out_dir, *, params: Mapping, threads: int = 1, log=print
) -> dict:
    """GRPO from the model in ``base_dir`` on ``problems``; save to ``out_dir``; return metrics. Inside a
    torchrun worker every rank runs this (data parallel, FSDP2-sharded when there are several); rank 0
    alone writes files and logs."""
    import tempfile

    import torch
    import torch.distributed as dist
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from stillroom.student import generation_config

    p = check_params(params)
    layout, main = p["distributed"], launch.rank() == 0
    workers = p["reward_workers"] or max(1, threads)
    rows = load_problems(problems)
    if len(rows) < p["prompts_per_step"]:
        raise DataError(
            f"{problems}: {len(rows)} problem(s), fewer than prompts_per_step={p['prompts_per_step']}"
        )
    cuda = torch.cuda.is_available()
    if p["validator"]["device"] == "cuda" and not cuda:
        raise ValueError("grpo validator device is cuda but no CUDA device is available")
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    # float32 weights always (a bf16 master copy loses small updates); bf16 autocast on GPU
    model = AutoModelForCausalLM.from_pretrained(
        Path(base_dir),
        dtype=torch.float32,
        attn_implementation="sdpa",
        **launch.load_kwargs(p, layout),
    )
    reward = KernelReward(workers=workers, seed=p["seed"], **p["validator"])
    log(
        f"{len(rows)} kernel problems; {p['prompts_per_step']} x {p['group_size']} completions a step over "
        f"{layout['world_size']} process(es), rewards on {workers} worker(s) each, validator on {p['validator']['device']}"
    )

    with atomic_dir(out_dir) if main else tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = GRPOConfig(
            output_dir=str(tmp / "trainer"),
            learning_rate=p["lr"],
            max_steps=p["max_steps"],
            # One generation batch (prompts_per_step groups, over all processes) per optimizer step, one
            # group per micro-batch: TRL generates anew every gradient_accumulation_steps micro-batches.
            per_device_train_batch_size=p["group_size"],
            gradient_accumulation_steps=p["prompts_per_step"] // layout["world_size"],
            generation_batch_size=p["prompts_per_step"] * p["group_size"],
            num_generations=p["group_size"],
            beta=p["beta"],
            loss_type=p["loss_type"],
            epsilon=p["epsilon"],
            max_completion_length=p["max_completion_length"],
            temperature=p["temperature"],
            top_p=p["top_p"],
            seed=p["seed"],
            data_seed=p["seed"],
            logging_steps=p["logging_steps"],
            use_cpu=not cuda,
            bf16=cuda,  # GRPOConfig defaults bf16 on, which CPU autocast would make lossy and slow
            activation_checkpointing=p[
                "gradient_checkpointing"
            ],  # transformers 5's name; TRL defaults it on
            save_strategy="no",
            report_to="none",
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[progress_callback(log)] if main else [],
        )
        trainer.remove_callback(PrinterCallback)  # progress goes through our own log callable
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        model = trainer.accelerator.unwrap_model(trainer.model)
        records = reward.records
        if layout["world_size"] > 1:  # each process scored its own completions
            gathered: list = [None] * layout["world_size"]
            dist.all_gather_object(gathered, records)
            records = sorted(
                (r for part in gathered for r in part), key=lambda r: (r["step"], r["prompt_id"])
            )
        # Every rank takes part in gathering sharded weights; only rank 0 keeps a directory.
        state = launch.gather_state(model) if launch.sharded(p, layout) else None
        if main:
            if state is not None:
                model = launch.unsharded(model, state)
            model.config.use_cache = True  # inference downstream wants the cache back
            if not (Path(base_dir) / "generation_config.json").exists():
                model.generation_config = generation_config(tokenizer)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            write_jsonl(tmp / "rewards.jsonl", records)
        shutil.rmtree(
            tmp / "trainer", ignore_errors=True
        )  # TRL's output_dir: nothing there is kept

    n = len(records)
    per_step = [
        {"step": h["step"], **{k: h.get(k) for k in ("reward", "reward_std", "kl", "loss")}}
        for h in trainer.state.log_history
        if "reward" in h
    ]
    metrics = {
        "steps": trainer.state.global_step,
        "seconds": round(seconds, 3),
        "world_size": layout["world_size"],
        "completions": n,
        "reward_mean": sum(r["reward"] for r in records) / n if n else None,
        "exec_mean": sum(r["exec_reward"] for r in records) / n if n else None,
        "rule_mean": sum(r["rule_reward"] for r in records) / n if n else None,
        "launch_rate": sum(r["launched_triton"] for r in records) / n if n else None,
        "per_step": per_step,
        "trl_version": trl.__version__,
    }
    log(
        f"GRPO: {metrics['steps']} steps in {seconds:.1f} s, {n} completions scored, "
        f"mean reward {metrics['reward_mean']}"
    )
    return metrics


def run(
    *, base: str, problems: str, out_model: str, params: Mapping, threads: int = 1, log=print, **_
) -> dict:
    """The CLI's ``grpo`` stage: in this process, or on every process of ``grpo.distributed``."""
    layout = check_params(params)["distributed"]
    if layout["world_size"] == 1:
        return train_grpo(base, problems, out_model, params=params, threads=threads, log=log)
    per_process = max(1, threads // layout["gpus_per_node"])
    return launch.spawn(
        layout,
        {
            "base_dir": base,
            "problems": problems,
            "out_dir": out_model,
            "params": dict(params),
            "threads": per_process,
        },
        log,
        cpus=threads,
        target="stillroom.grpo:train_grpo",
    )
