"""GRPO's trainer (TRL's GRPOTrainer), its kernel reward and its diversity sampler, beside SFT's
trainer (sft.py); the grpo stage (stages/grpo.py) reads its inputs and calls ``train_grpo``.

Each step samples ``group_size`` completions for each of ``prompts_per_step`` problems; a
completion's reward is execution x rules (grading.kernel.score_answer), so a correct module that
computes with torch instead of Triton earns 0. The reward is one function on purpose: TRL sums
several reward functions before the group normalisation, and a separate rule reward added to the
execution reward would pay a cheat half the credit instead of zeroing it. A completion the validator
could not score (its own failure, KernelResult.status "harness") gets None: TRL leaves it out of its
group's baseline and gives it no advantage, so the model is not trained on a 0 it did not earn; when
more than ``max_harness_share`` of a step's rewards are such failures, training stops
(HarnessFailure) rather than go on learning from no reward.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..config import Grpo, ValidatorOptions
from ..grading.formats import user_content
from ..grading.kernel import score_answer
from ..io import DataError, atomic_dir, read_jsonl, write_jsonl
from ..kernels.reward import harness_failed
from . import launch
from .checkpoints import save_for_inference

REQUIRED = ("prompt_id", "kind", "prompt", "answer")


class HarnessFailure(RuntimeError):
    """Too many of a step's rewards are the validator's failures: training stops."""


class KernelReward:
    """TRL reward function: the kernel reward (execution x rules) of each completion.

    A batch's completions are evaluated concurrently on ``workers`` threads (each candidate runs in
    its own process, forked from the validator's warm server). The validator's inputs come from
    ``seed``, so a completion is scored once per problem: a small policy repeats itself often, in a
    group and across steps, and each repeat would cost a validator run for the same reward. Every
    completion is kept in ``records``; one the validator failed on (status "harness") has rewards
    None.
    """

    __name__ = "kernel_reward"  # TRL logs rewards/<name>/mean

    def __init__(
        self,
        options: ValidatorOptions,
        *,
        workers: int = 1,
        seed: int = 0,
        track_groups: bool = False,
        max_harness_share: float = 1.0,
    ):
        self.options, self.workers, self.seed = options, workers, seed
        self.max_harness_share = max_harness_share
        self.records: list[dict[str, Any]] = []
        # track_groups (diversity sampling): prompt id -> rewards of its latest group, over all
        # processes
        self.track_groups = track_groups
        self.latest: dict[str, list[float]] = {}
        self.validator_runs = 0
        # (problem, completion) -> Future of its score; a repeat waits for the first one's run
        self._scored: dict[tuple[str, str], Future] = {}
        self._lock = threading.Lock()

    def _score(self, problem: str, text: str) -> dict[str, Any]:
        with self._lock:
            future = self._scored.get((problem, text))
            first = future is None
            if first:
                future = self._scored[(problem, text)] = Future()
                self.validator_runs += 1
        if first:
            try:
                result = self._validate(problem, text)
                future.set_result(result)
            except BaseException as exc:
                future.set_exception(exc)
                result = None
            if result is None or result["status"] == "harness":  # the validator's failure: retry
                with self._lock:
                    self._scored.pop((problem, text), None)
        return future.result()

    def _validate(self, problem: str, text: str) -> dict[str, Any]:
        r = score_answer(problem, text, self.options, seed=self.seed)
        unscored = harness_failed(r)
        return {
            "status": r.status,
            "exec_reward": None if unscored else r.exec_reward,
            "rule_reward": None if unscored else r.rule_reward,
            "reward": None if unscored else r.reward,
            "compiled": r.compiled,
            "correct": r.correct,
            "launched_triton": r.launched_triton,
            # the harness's own reason is its last; a candidate's first is its main one
            "reason": (r.reasons[-1] if unscored else r.reasons[0]) if r.reasons else "",
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
    ) -> list[float | None]:
        # Conversational completions arrive as [{"role": "assistant", "content": ...}]
        texts = [
            c if isinstance(c, str) else "".join(m["content"] or "" for m in c) for c in completions
        ]
        with ThreadPoolExecutor(max(1, min(self.workers, len(texts)))) as pool:
            scored = list(pool.map(self._score, answer, texts))
        # Completions are generated at the start of the optimizer step they train: global_step + 1.
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        failed = [s for s in scored if s["status"] == "harness"]
        if scored and len(failed) > self.max_harness_share * len(scored):
            raise HarnessFailure(
                f"step {step}: {len(failed)} of {len(scored)} rewards are the kernel validator's "
                f"own failures, more than grpo.max_harness_share={self.max_harness_share} (the "
                f"model would learn from no reward): {failed[0]['reason']}"
            )
        self.records += [
            {"step": step, "prompt_id": pid, **s} for pid, s in zip(prompt_id, scored, strict=True)
        ]
        if self.track_groups:
            self._note_groups(
                [(pid, s["reward"]) for pid, s in zip(prompt_id, scored, strict=True)]
            )
        if log_metric is not None:
            # over the completions the validator scored
            ok = [s for s in scored if s["reward"] is not None]
            for key in ("exec_reward", "rule_reward", "launched_triton"):
                if ok:
                    log_metric(f"kernel/{key}", sum(float(s[key]) for s in ok) / len(ok))
            log_metric("kernel/harness_failures", float(len(scored) - len(ok)))
        return [s["reward"] for s in scored]

    def _note_groups(self, pairs: list[tuple[str, float | None]]) -> None:
        """Keep each problem's latest group of rewards. Every process scores its own groups and
        every process must draw the same problems next, so the groups are gathered first (each
        process calls the reward function at the same point of every step)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            parts: list = [None] * dist.get_world_size()
            dist.all_gather_object(parts, pairs)
            pairs = [pair for part in parts for pair in part]
        groups: dict[str, list[float]] = {}
        for pid, r in pairs:
            if r is not None:  # the validator's failure says nothing of the problem
                groups.setdefault(pid, []).append(r)
        self.latest.update(groups)


def diversity_weight(rewards: list[float] | None, floor: float) -> float:
    """A problem's draw weight: the spread of its latest group's rewards (p(1-p) for 0/1 rewards),
    0.25 (the most) for a problem not yet seen, never below ``floor``."""
    if not rewards:
        return 0.25
    mean = sum(rewards) / len(rewards)
    return max(sum((r - mean) ** 2 for r in rewards) / len(rewards), floor)


class DiversitySampler:
    """GRPO's prompt order (a torch Sampler) with problems drawn by ``diversity_weight``.

    Yields what TRL's RepeatSampler yields, in the same layout: for each generation batch,
    ``batch_size`` distinct problems, each repeated ``group_size`` times, the batch repeated
    ``repeat_count`` times (num_iterations x steps_per_generation). Each batch is drawn when the
    data loader asks for it, from the rewards seen so far (a step or two behind: the loader reads
    one batch ahead), with a generator seeded alike in every process.
    """

    def __init__(
        self,
        prompt_ids: list[str],
        latest: Mapping[str, list[float]],
        *,
        group_size: int,
        batch_size: int,
        repeat_count: int,
        floor: float,
        seed: int,
    ):
        self.prompt_ids, self.latest, self.floor = prompt_ids, latest, floor
        self.group_size, self.batch_size, self.repeat_count = group_size, batch_size, repeat_count
        self.seed, self.passes = seed, 0
        self.batches = len(prompt_ids) // batch_size  # a pass draws as many as one of TRL's

    def __len__(self) -> int:
        return self.batches * self.batch_size * self.group_size * self.repeat_count

    def __iter__(self):
        import torch

        generator = torch.Generator().manual_seed(self.seed + self.passes)
        self.passes += 1
        for _ in range(self.batches):
            weights = torch.tensor(
                [diversity_weight(self.latest.get(pid), self.floor) for pid in self.prompt_ids],
                dtype=torch.float64,
            )
            chosen = torch.multinomial(weights, self.batch_size, generator=generator).tolist()
            for _ in range(self.repeat_count):
                for index in chosen:
                    yield from [index] * self.group_size


def load_problems(path) -> list[dict[str, Any]]:
    """The kernel problems of a pool as conversational GRPO rows; a mixed pool's other kinds are
    left out."""
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
                norm = logs.get("grad_norm")
                log(
                    f"step {state.global_step}/{state.max_steps} reward {logs['reward']:.3f} "
                    f"std {logs.get('reward_std', 0.0):.3f} kl {'-' if kl is None else f'{kl:.4g}'}"
                    f" grad norm {'-' if norm is None else f'{norm:.3g}'}"
                )

    return Progress()


def train_grpo(
    base_dir,
    problems,
    out_dir,
    *,
    params: Mapping[str, Any] | Grpo,
    validator: Mapping[str, Any] | ValidatorOptions,
    seed: int,
    threads: int = 1,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """GRPO from the model in ``base_dir`` on ``problems`` with the grpo section ``params``, the
    kernel ``validator``'s options and ``seed``; save to ``out_dir``; return metrics. In a torchrun
    worker every rank runs this (data parallel, FSDP2-sharded when there are several); rank 0 alone
    writes files and logs."""
    import tempfile

    import torch
    import torch.distributed as dist
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    p = Grpo.parse(params, where="grpo")
    checker = ValidatorOptions.parse(validator, where="grpo.validator")
    layout, main = p.layout, launch.rank() == 0
    workers = p.reward_workers or max(1, threads)
    rows = load_problems(problems)
    if len(rows) < p.prompts_per_step:
        raise DataError(
            f"{problems}: {len(rows)} problem(s), fewer than prompts_per_step={p.prompts_per_step}"
        )
    cuda = torch.cuda.is_available()
    if checker.device == "cuda" and not cuda:
        raise ValueError("grpo validator device is cuda but no CUDA device is available")
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    # float32 weights always (a bf16 master copy loses small updates); bf16 autocast on GPU
    model = AutoModelForCausalLM.from_pretrained(
        Path(base_dir),
        dtype=torch.float32,
        attn_implementation="sdpa",
        **launch.load_kwargs(p),
    )
    reward = KernelReward(
        checker,
        workers=workers,
        seed=seed,
        track_groups=p.sampling == "diversity",
        max_harness_share=p.max_harness_share,
    )
    log(
        f"{len(rows)} kernel problems; {p.prompts_per_step} x {p.group_size} completions a step "
        f"over {layout.world_size} process(es), rewards on {workers} worker(s) each, validator "
        f"on {checker.device}"
    )

    with atomic_dir(out_dir) if main else tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = GRPOConfig(
            output_dir=str(tmp / "trainer"),
            learning_rate=p.lr,
            optim=p.optim,
            num_iterations=p.num_iterations,
            max_grad_norm=p.max_grad_norm,
            max_steps=p.max_steps,
            # One generation batch (prompts_per_step groups, over all processes) per optimizer step,
            # one group per micro-batch: TRL generates anew every gradient_accumulation_steps
            # micro-batches.
            per_device_train_batch_size=p.group_size,
            gradient_accumulation_steps=p.prompts_per_step // layout.world_size,
            generation_batch_size=p.prompts_per_step * p.group_size,
            num_generations=p.group_size,
            beta=p.beta,
            loss_type=p.loss_type,
            epsilon=p.epsilon,
            max_completion_length=p.max_completion_length,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=seed,
            data_seed=seed,
            logging_steps=p.logging_steps,
            use_cpu=not cuda,
            # GRPOConfig defaults bf16 on, which CPU autocast would make lossy and slow
            bf16=cuda,
            # transformers 5's name; TRL defaults it on
            activation_checkpointing=p.gradient_checkpointing,
            save_strategy="no",
            report_to="none",
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        if p.sampling == "diversity":

            class Trainer(GRPOTrainer):
                def _get_train_sampler(self, dataset=None):
                    return DiversitySampler(
                        [row["prompt_id"] for row in rows],
                        reward.latest,
                        group_size=p.group_size,
                        batch_size=p.prompts_per_step,
                        repeat_count=p.num_iterations * self.args.steps_per_generation,
                        floor=p.diversity_floor,
                        seed=seed,
                    )
        else:
            Trainer = GRPOTrainer
        trainer = Trainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[progress_callback(log)] if main else [],
        )
        # progress goes through our own log callable
        trainer.remove_callback(PrinterCallback)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        model = trainer.accelerator.unwrap_model(trainer.model)
        records = reward.records
        # each process scored its own completions
        if layout.world_size > 1:
            gathered: list = [None] * layout.world_size
            dist.all_gather_object(gathered, records)
            records = sorted(
                (r for part in gathered for r in part), key=lambda r: (r["step"], r["prompt_id"])
            )
        # Every rank takes part in gathering sharded weights; only rank 0 keeps a directory.
        state = launch.gather_state(model) if p.sharded else None
        if main:
            if state is not None:
                model = launch.unsharded(model, state)
            save_for_inference(model, tokenizer, base_dir, tmp)
            write_jsonl(tmp / "rewards.jsonl", records)
        # TRL's output_dir: nothing there is kept
        shutil.rmtree(tmp / "trainer", ignore_errors=True)

    n = len(records)
    scored = [r for r in records if r["reward"] is not None]  # not the validator's failures
    m = len(scored)
    per_step = [
        {
            "step": h["step"],
            **{k: h.get(k) for k in ("reward", "reward_std", "kl", "loss", "grad_norm")},
        }
        for h in trainer.state.log_history
        if "reward" in h
    ]
    metrics = {
        "steps": trainer.state.global_step,
        "seconds": round(seconds, 3),
        "world_size": layout.world_size,
        "completions": n,
        "validator_runs": reward.validator_runs,  # distinct completions of a problem (rank 0's)
        "harness_failures": n - m,
        "reward_mean": sum(r["reward"] for r in scored) / m if m else None,
        "exec_mean": sum(r["exec_reward"] for r in scored) / m if m else None,
        "rule_mean": sum(r["rule_reward"] for r in scored) / m if m else None,
        "launch_rate": sum(r["launched_triton"] for r in scored) / m if m else None,
        "per_step": per_step,
        "trl_version": trl.__version__,
    }
    log(
        f"GRPO: {metrics['steps']} steps in {seconds:.1f} s, {n} completions scored "
        f"({reward.validator_runs} validator runs), mean reward {metrics['reward_mean']}"
    )
    return metrics


if __name__ == "__main__":
    # the entry point of the workers launch.spawn starts
    launch.serve(train_grpo)
