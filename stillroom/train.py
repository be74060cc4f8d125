"""Full-parameter SFT of the student on teacher traces, with TRL's SFTTrainer and BFD packing.

Packed documents are kept apart by restarting position_ids: transformers derives a block-diagonal
causal mask from them only when there is no attention_mask and no KV cache, hence use_cache=False.
Packed rows are batched as (batch, max_length), not flattened padding-free into one (1, batch *
max_length) row: sdpa materialises a dense mask, so one long row costs batch times more attention
(2-4x slower steps on CPU).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stillroom.adapters import check_lora, lora_config, resolve_targets, trainable_breakdown
from stillroom.io import DataError, atomic_dir, read_jsonl, write_json
from stillroom.provenance import digest

ROLES = {"system", "user", "assistant"}
PARAM_DEFAULTS: dict[str, Any] = {
    "lr": 1e-3, "epochs": 1.0, "max_steps": -1, "batch_size": 8, "grad_accum": 1, "max_length": 1024,
    "warmup_ratio": 0.0, "lr_scheduler": "cosine", "weight_decay": 0.0, "seed": 0, "logging_steps": 10,
    "method": "full", "lora": None, "save_steps": 0,
}


def check_params(params: Mapping) -> dict[str, Any]:
    """Return ``params`` over the defaults; unknown keys and out-of-range values raise ValueError."""
    unknown = sorted(set(params) - set(PARAM_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown training param(s): {', '.join(unknown)} (known: {', '.join(PARAM_DEFAULTS)})")
    p = {**PARAM_DEFAULTS, **params}
    lowest = {"batch_size": 1, "grad_accum": 1, "max_length": 1, "logging_steps": 1, "max_steps": -1, "seed": 0,
              "save_steps": 0}
    for key, low in lowest.items():
        if isinstance(p[key], bool) or not isinstance(p[key], int) or p[key] < low:
            raise ValueError(f"training param {key} must be an int >= {low}, got {p[key]!r}")
    if not 0 <= p["warmup_ratio"] < 1:
        raise ValueError(f"training param warmup_ratio must be in [0, 1), got {p['warmup_ratio']!r}")
    p["lora"] = check_lora(p)
    return p


def load_examples(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read and validate the SFT JSONL; keep only id and messages."""
    rows = read_jsonl(path, required=("messages",), types={"messages": list})
    with open(path, encoding="utf-8") as fh:  # read_jsonl skips blank lines; recover real line numbers
        linenos = [n for n, line in enumerate(fh, 1) if line.strip()]
    examples = []
    for lineno, row in zip(linenos, rows):
        where = f"{path}:{lineno}: key 'messages'"
        for i, msg in enumerate(row["messages"]):
            if not isinstance(msg, dict) or msg.get("role") not in ROLES or not isinstance(msg.get("content"), str):
                raise DataError(f"{where}: message {i} needs a role in {sorted(ROLES)} and string content: {msg!r:.80}")
        if not any(m["role"] == "assistant" for m in row["messages"]):
            raise DataError(f"{where}: no assistant turn to train on")
        messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
        examples.append({"id": str(row.get("id", f"line {lineno}")), "messages": messages})
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def supervision_stats(tokenizer, examples: list[dict], max_length: int, source: str = "dataset") -> dict[str, int]:
    """Count tokens after truncation at max_length; fail if any example keeps no assistant token."""
    total = supervised = truncated = 0
    empty = []
    for ex in examples:
        enc = tokenizer.apply_chat_template(
            ex["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        mask = enc["assistant_masks"][:max_length]
        truncated += len(enc["input_ids"]) > max_length
        total += len(mask)
        supervised += sum(mask)
        if not any(mask):
            empty.append(ex["id"])
    if empty:
        raise DataError(
            f"{source}: {len(empty)} of {len(examples)} examples have no assistant tokens left after truncation "
            f"at max_length={max_length} (ids: {', '.join(empty[:10])}{' ...' if len(empty) > 10 else ''})"
        )
    return {"examples": len(examples), "supervised_tokens": supervised, "total_tokens": total, "truncated": truncated}


def progress_callback(log: Callable[[str], Any]):
    """A TrainerCallback sending one line per logging step to ``log``."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                log(
                    f"step {state.global_step}/{state.max_steps} loss {logs['loss']:.4f} "
                    f"lr {logs.get('learning_rate', 0.0):.2e} {time.perf_counter() - self.start:.1f} s"
                )

    return Progress()


def collate_packed_rows(examples: list[dict], *, pad_token_id: int) -> dict:
    """Stack packed rows (input_ids, labels, seq_lengths) into right-padded tensors with restarting positions."""
    import torch

    shape = (len(examples), max(len(ex["input_ids"]) for ex in examples))
    ids, labels = torch.full(shape, pad_token_id), torch.full(shape, -100)
    positions = torch.zeros(shape, dtype=torch.long)
    for row, ex in enumerate(examples):
        n = len(ex["input_ids"])
        ids[row, :n] = torch.tensor(ex["input_ids"])
        labels[row, :n] = torch.tensor(ex["labels"])
        positions[row, :n] = torch.cat([torch.arange(k) for k in ex["seq_lengths"]])
    labels[positions == 0] = -100  # a document's first token is never predicted from the one before it
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def build_trainer(base_dir, examples: list[dict], params: Mapping, output_dir, callbacks=()):
    """The SFTTrainer for ``examples`` (validated ``params``), model loaded fresh from ``base_dir``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    model = AutoModelForCausalLM.from_pretrained(Path(base_dir), attn_implementation="sdpa", dtype=torch.float32)
    model.config.use_cache = False  # a cache disables the packed-document mask (see module docstring)
    config = SFTConfig(
        output_dir=str(output_dir),
        learning_rate=params["lr"],
        num_train_epochs=params["epochs"],
        max_steps=params["max_steps"],
        per_device_train_batch_size=params["batch_size"],
        gradient_accumulation_steps=params["grad_accum"],
        warmup_steps=params["warmup_ratio"],  # a float < 1 is a ratio in transformers 5
        lr_scheduler_type=params["lr_scheduler"],
        weight_decay=params["weight_decay"],
        seed=params["seed"],
        data_seed=params["seed"],
        logging_steps=params["logging_steps"],
        logging_first_step=True,
        max_length=params["max_length"],
        packing=True,
        packing_strategy="bfd",
        assistant_only_loss=True,
        use_cpu=not cuda,
        bf16=cuda,
        include_num_input_tokens_seen="non_padding",
        save_strategy="steps" if params["save_steps"] else "no",
        save_steps=params["save_steps"] or 500,
        save_total_limit=2,
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        gradient_checkpointing=False,  # TRL turns it on by default; needless recompute at student sizes
    )
    dataset = Dataset.from_list([{"messages": ex["messages"]} for ex in examples])
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=list(callbacks), peft_config=lora_config(params["lora"]) if params["lora"] else None)
    # TRL refuses a custom collator with BFD packing (it assumes flash-attention varlen); swap it in after.
    trainer.data_collator = functools.partial(collate_packed_rows, pad_token_id=tokenizer.pad_token_id)
    trainer.remove_callback(PrinterCallback)  # progress goes through our own log callable
    return trainer


def _last_checkpoint(checkpoints: Path, fingerprint: Mapping, log) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    if not checkpoints.is_dir():
        return None
    saved = checkpoints / "fingerprint.json"
    if not saved.exists() or json.loads(saved.read_text()) != json.loads(json.dumps(fingerprint)):
        log(f"discarding checkpoints in {checkpoints}: made with other params or inputs")
        shutil.rmtree(checkpoints)
        return None
    # A kill during a save leaves a checkpoint without trainer_state.json (transformers writes it last): drop it.
    while (last := get_last_checkpoint(str(checkpoints))) and not (Path(last) / "trainer_state.json").exists():
        log(f"discarding incomplete {last}")
        shutil.rmtree(last)
    if last:
        log(f"resuming from {last}")
    return last


def train_sft(base_dir, dataset_path, out_dir, *, params: Mapping, threads: int = 1, log=print) -> dict:
    """Fine-tune the model in ``base_dir`` on ``dataset_path``; save it to ``out_dir``; return metrics."""
    import torch
    from transformers import AutoTokenizer

    from stillroom.student import generation_config

    p = check_params(params)
    if p["lora"]:
        resolve_targets(base_dir, p["lora"])
    torch.set_num_threads(threads)
    examples = load_examples(dataset_path)
    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    stats = supervision_stats(tokenizer, examples, p["max_length"], source=str(dataset_path))
    log(
        f"{stats['examples']} examples, {stats['supervised_tokens']} supervised of {stats['total_tokens']} tokens "
        f"({stats['truncated']} truncated at max_length {p['max_length']})"
    )
    # Checkpoints live beside the output (which appears only when training is done), so a job killed by
    # preemption or wall time resumes there; a fingerprint keeps a changed run from resuming a stale one.
    checkpoints = Path(str(out_dir).rstrip("/") + ".checkpoints")
    fingerprint, last = None, None
    if p["save_steps"]:
        fingerprint = {"params": p, "base": digest(base_dir)["sha256"], "dataset": digest(dataset_path)["sha256"]}
        last = _last_checkpoint(checkpoints, fingerprint, log)
    with atomic_dir(out_dir) as tmp:
        trainer = build_trainer(base_dir, examples, p, checkpoints, callbacks=[progress_callback(log)])
        breakdown = trainable_breakdown(trainer.model)
        log(f"trainable parameters {breakdown['trainable']} of {breakdown['parameters_total']:,} "
            f"({breakdown['adapter_bytes'] / 2**20:.2f} MiB)")
        packed = trainer.train_dataset
        real = sum(len(ids) for ids in packed["input_ids"])
        start = time.perf_counter()
        if p["save_steps"]:
            checkpoints.mkdir(parents=True, exist_ok=True)
            write_json(checkpoints / "fingerprint.json", fingerprint)
        trainer.train(resume_from_checkpoint=last)
        seconds = time.perf_counter() - start
        model = trainer.accelerator.unwrap_model(trainer.model)
        if p["lora"]:  # keep the adapter, and give later stages (merge, evaluation) the merged model
            model.save_pretrained(tmp / "adapter")
            model = model.merge_and_unload()
        model.config.use_cache = True  # inference downstream wants the cache back
        if not (Path(base_dir) / "generation_config.json").exists():
            model.generation_config = generation_config(tokenizer)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(checkpoints, ignore_errors=True)

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    metrics = {
        **{k: stats[k] for k in ("examples", "supervised_tokens", "total_tokens")},
        "steps": trainer.state.global_step,
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(losses[-3:]) / len(losses[-3:]) if losses else None,
        "train_seconds": round(seconds, 3),
        "tokens_per_second": round(trainer.state.num_input_tokens_seen / max(seconds, 1e-9), 1),
        "packing_efficiency": round(real / (len(packed) * p["max_length"]), 4),
        **breakdown,
    }
    log(f"trained {metrics['steps']} steps in {seconds:.1f} s ({metrics['tokens_per_second']:.0f} tokens/s), "
        f"loss {metrics['first_loss']} -> {metrics['final_loss']}")
    return metrics


def run(*, base: str, dataset: str, out_model: str, params: Mapping, threads: int = 1, log=print, **_) -> dict:
    """The CLI's ``train`` stage."""
    return train_sft(base, dataset, out_model, params=params, threads=threads, log=log)
