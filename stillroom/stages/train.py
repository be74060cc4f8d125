"""Rule train: SFT of the student on the teacher's traces (full, LoRA or QLoRA; runtime/sft.py),
in this process or on every process of ``train.distributed``; a killed job resumes from its last
checkpoint beside the output. LoRA / QLoRA save the adapter; rule merge_adapter merges it."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from ..config import StageParams, Student, Train, WeightHook
from ..config.training import EffortTagIn, TrainPhase, hooks_problem
from ..data.conversations import check_renders, load_conversations
from ..grading.formats import with_effort_tag
from ..io import DataError, atomic_dir, write_json
from ..provenance.sidecars import digest
from ..runtime import launch
from ..runtime.adapters import (
    check_saved_adapter,
    gather_adapter,
    resolve_targets,
    trainable_breakdown,
)
from ..runtime.checkpoints import (
    last_checkpoint,
    save_adapter_for_inference,
    save_for_inference,
)
from ..runtime.sft import (
    build_trainer,
    check_expert_parallel,
    check_optimizer,
    encode_examples,
    progress_callback,
    supervision_stats,
)
from ..runtime.templates import check_supervision, check_system_turn, training_template
from .contract import stage


class Params(StageParams, Train):
    weight_hooks: list[WeightHook] = []
    phase: TrainPhase | None = Field(None, description="this job's phase of train.phases")
    effort_tag_in: EffortTagIn = Student.model_fields["effort_tag_in"].default

    @model_validator(mode="after")
    def _hooks(self) -> Params:
        problem = hooks_problem(self.method, self.weight_hooks)
        if problem:
            raise ValueError(f"weight_hooks: {problem}")
        return self


def place_tags(examples: list[dict], where: EffortTagIn) -> list[dict]:
    """The rows with their effort tag (the system turn of a tagged row, as the dataset stage
    writes it) where ``student.effort_tag_in`` puts it."""
    if where == "system":
        return examples
    return [
        {**ex, "messages": with_effort_tag(ex["messages"][1:], ex["messages"][0]["content"], where)}
        if ex.get("tagged") and ex["messages"][0]["role"] == "system"
        else ex
        for ex in examples
    ]


def encode_checked(
    tokenizer, template, examples: list[dict], max_length: int, source: str = "dataset"
) -> tuple[list[dict], dict]:
    """The rows' tokens and assistant masks under ``template``, and the outcome of checking them
    (``check_supervision``): a template that refuses the rows' system turn, fails to render
    them, or supervises anything but each assistant turn as written is refused here, before
    any training step."""
    check_system_turn(tokenizer, template, examples)
    check_renders(
        tokenizer,
        [{**ex, "messages": template.fed(ex["messages"])} for ex in examples],
        source=source,
        chat_template=template.text,
        template_name=template.name,
        hint=": set train.chat_template to a template that renders them",
    )
    encoded = encode_examples(tokenizer, template, examples)
    return encoded, check_supervision(tokenizer, template, examples, encoded, max_length)


def select_rows(examples: list[dict], phase: TrainPhase | None, source: str) -> list[dict]:
    """The rows a phase trains on: its efforts, with the effort tags dropped if it says so."""
    if phase is None:
        return examples
    rows = []
    for ex in examples:
        if phase.efforts is not None:
            if "effort" not in ex:
                raise DataError(
                    f"{source}: row {ex['id']} has no 'effort', but train phase '{phase.name}' "
                    f"selects rows by effort ({', '.join(phase.efforts)})"
                )
            if ex["effort"] not in phase.efforts:
                continue
        if phase.tags == "none" and ex.get("tagged") and ex["messages"][0]["role"] == "system":
            ex = {**ex, "messages": ex["messages"][1:], "tagged": False}
        rows.append(ex)
    if not rows:
        raise DataError(
            f"{source}: no rows for train phase '{phase.name}' (efforts {phase.efforts}; the "
            f"dataset has {sorted({ex.get('effort') for ex in examples}, key=str)})"
        )
    return rows


@stage(
    "train",
    params=Params,
    inputs=("base", "dataset", "chat_template?"),
    outputs=("model",),
    help="supervised fine-tuning",
)
def run(
    *,
    base: str,
    dataset: str,
    out_model: str,
    params: Mapping[str, Any] | Params,
    chat_template: str | None = None,
    threads: int = 1,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    p = Params.parse(params, where="train")
    kwargs = {
        "base_dir": base,
        "dataset_path": dataset,
        "out_dir": out_model,
        "chat_template": chat_template,
        "params": p.dump(),
    }
    return launch.run(p.layout, train_sft, kwargs, threads=threads, log=log, where="train")


def checkpoint_fingerprint(p: Params, base_dir, dataset_path, template_text: str) -> dict:
    """What a preemption checkpoint must have been made with to be resumed: the params, base,
    dataset and template. save_minutes is left out: when checkpoints were written does not change
    the weights, so a job resubmitted with another interval still resumes (save_steps stays in: a
    resumed Trainer keeps the checkpoint's step interval)."""
    return {
        "params": {k: v for k, v in p.dump().items() if k != "save_minutes"},
        "base": digest(base_dir)["sha256"],
        "dataset": digest(dataset_path)["sha256"],
        "chat_template": hashlib.sha256(template_text.encode()).hexdigest(),
    }


def train_sft(
    base_dir,
    dataset_path,
    out_dir,
    chat_template=None,
    *,
    params: Mapping[str, Any] | Params,
    threads: int = 1,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Fine-tune the model in ``base_dir`` on ``dataset_path``, rendered with ``chat_template`` or
    the one ``training_template`` finds; save it to ``out_dir`` with its own template (LoRA / QLoRA:
    the adapter, which ``stream_merge`` merges into the base); return metrics. In a torchrun worker
    every rank runs this; rank 0 alone writes files and logs."""
    import torch
    from transformers import AutoTokenizer

    from ..runtime.hooks import WeightHooks, step_callback  # loads torch

    p = Params.parse(params, where="train")
    check_optimizer(p)
    check_expert_parallel(base_dir, p)
    if p.lora:
        resolve_targets(base_dir, p.lora)
    main = launch.rank() == 0
    torch.set_num_threads(threads)
    examples = select_rows(load_conversations(dataset_path), p.phase, str(dataset_path))
    examples = place_tags(examples, p.effort_tag_in)
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    template = training_template(tokenizer, chat_template, where=str(base_dir))
    encoded, checked = encode_checked(
        tokenizer, template, examples, p.max_length, source=str(dataset_path)
    )
    ids = [ex["id"] for ex in examples]
    stats = supervision_stats(encoded, ids, p.max_length, source=str(dataset_path))
    log(
        f"chat template for training: {template.name}; supervision checked on "
        f"{checked['rows_checked']} rows"
        + (f", reasoning fed as {template.reasoning_field}" if template.reasoning_field else "")
    )
    log(
        f"{stats['examples']} examples, {stats['supervised_tokens']} supervised of "
        f"{stats['total_tokens']} tokens ({stats['truncated']} truncated at max_length "
        f"{p.max_length})"
    )
    # Checkpoints live beside the output (which appears only when training is done), so a job killed
    # by preemption or wall time resumes there; a fingerprint keeps a changed run from resuming a
    # stale one.
    checkpoints = Path(str(out_dir).rstrip("/") + ".checkpoints")
    fingerprint, last = None, None
    if p.checkpointing:
        fingerprint = checkpoint_fingerprint(p, base_dir, dataset_path, template.text)
        last = last_checkpoint(checkpoints, fingerprint, log, main)
    sampled: dict[str, dict] = {}
    callbacks = [progress_callback(log)] if main else []
    hooks = WeightHooks(p.weight_hooks)
    if hooks or p.sampled_options:
        callbacks.append(step_callback(hooks, p.sampled_options, p.seed, sampled))
    # Every rank takes part in gathering the sharded weights for the save; only rank 0 keeps a
    # directory.
    with atomic_dir(out_dir) if main else tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trainer = build_trainer(
            base_dir,
            encoded,
            p,
            checkpoints,
            callbacks=callbacks,
            resume=last,
            seed=p.seed,
            log=log if main else lambda _: None,
        )
        breakdown = trainable_breakdown(trainer.model)
        four_bit = {k: v for k, v in breakdown["four_bit_weights"].items() if v}
        log(
            f"trainable parameters {breakdown['trainable']} of {breakdown['parameters_total']:,} "
            f"({breakdown['adapter_bytes'] / 2**20:.2f} MiB)"
            + (f"; weight tensors in 4 bits {four_bit}" if four_bit else "")
        )
        packed = trainer.train_dataset
        real = sum(len(ids) for ids in packed["input_ids"])
        start = time.perf_counter()
        if p.checkpointing and main:
            checkpoints.mkdir(parents=True, exist_ok=True)
            write_json(checkpoints / "fingerprint.json", fingerprint)
        trainer.train(resume_from_checkpoint=last)
        seconds = time.perf_counter() - start
        peaks = launch.peak_memory_mib()  # every rank's, gathered while all of them are here
        model = trainer.accelerator.unwrap_model(trainer.model)
        state = None
        if p.sharded:
            state = gather_adapter(model) if p.lora else launch.gather_state(model)
        if main:
            end_of_turn = template.end_of_turn(tokenizer)
            if p.lora:
                # The adapter alone: rule merge_adapter, a CPU job, streams it into the
                # full-precision base (for QLoRA the original bf16 checkpoint, never the NF4
                # weights trained against), so this GPU job never holds the merged model.
                save_adapter_for_inference(model, tokenizer, base_dir, tmp, end_of_turn, state)
                check_saved_adapter(tmp, base_dir, p.lora)
            else:
                if state is not None:
                    model = launch.unsharded(model, state)
                save_for_inference(model, tokenizer, base_dir, tmp, end_of_turn=end_of_turn)
    if main:
        shutil.rmtree(checkpoints, ignore_errors=True)

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    metrics = {
        **{k: stats[k] for k in ("examples", "supervised_tokens", "total_tokens")},
        "steps": trainer.state.global_step,
        "losses": losses,
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(losses[-3:]) / len(losses[-3:]) if losses else None,
        "train_seconds": round(seconds, 3),
        # counted, not the rate times the time: the cost ledger's tokens are the same every run
        "tokens_seen": int(trainer.state.num_input_tokens_seen),
        "tokens_per_second": round(trainer.state.num_input_tokens_seen / max(seconds, 1e-9), 1),
        "packing_efficiency": round(real / (len(packed) * p.max_length), 4),
        "world_size": p.layout.world_size,
        "peak_memory_mib": peaks,
        "chat_template": template.origin,
        "template_check": checked,
        **({"sampled_options": sampled} if sampled else {}),
        **breakdown,
    }
    log(
        f"trained {metrics['steps']} steps in {seconds:.1f} s "
        f"({metrics['tokens_per_second']:.0f} tokens/s), "
        f"loss {metrics['first_loss']} -> {metrics['final_loss']}"
    )
    return metrics
