"""A one-shot GPU check (``make gpu-check``): the code paths that cannot run on the CPU machines,
exercised once on one GPU (the flagship on all of them) within about 8 minutes, with a JSON
summary.

Checks, each in a process of its own with its own time limit under one overall deadline, so that a
hang, a crash or a poisoned CUDA context in one is recorded and the next still runs:

- ``sft``: bf16 SFT of a small random Qwen3 on the same documents in packed rows (restarting
  position_ids; FlashAttention 2 when flash-attn is importable, else sdpa) and in padded rows, from
  the same weights: per-step losses, the step-0 loss difference (beside that of a packing whose
  documents see each other, the leak it must catch), tokens/s of each; then the production
  trainer (runtime/sft.py ``build_trainer``) for a few steps.
- ``qlora``: an NF4 base with LoRA through the same trainer: loss, adapter gradients, memory.
- ``qlora_fsdp_staged``: the flagship recipe on a tiny Qwen3-MoE: the train stage with every
  weight matrix in NF4 (fused experts included, the staged loader), LoRA on attention and the
  fused experts, FSDP2 over every GPU found (one process on one GPU), a few steps; then the
  streaming merge of the adapter into the base in a process of its own. Losses, tokens/s, peak
  GPU memory per rank, NF4 tensors, the merge's peak RSS and seconds, the router unchanged, the
  merged logits against the base with the adapter in PEFT.
- ``evaluate``: the evaluate stage with the ``hf`` backend on the GPU; samples written, timing.
- ``kernels``: every reference solution compiled by Triton on the GPU through the kernel reward
  (``stillroom.grading.kernel.score_answer``), with its speedup over the PyTorch reference.

Without a CUDA device it writes a ``skipped`` summary and exits 0. ``--device cpu`` runs the same
checks on CPU at toy sizes (Triton's interpreter, sdpa, float32; the flagship on 2 gloo ranks), for
developing the check itself.

    python -m stillroom.gpucheck [--out results/gpu-check.json] [--checks sft,qlora,...]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import importlib.metadata
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .io import write_jsonl, write_text

Log = Callable[[str], Any]

DEFAULT_OUT = "results/gpu-check.json"
# Seconds from start to the summary: 8 minutes less what the interpreter and the venv check take.
DEADLINE_S = 450.0
# Per-check limits. The checks before the kernels take at most 310 s, so the kernels, which come
# last and stop early on their own when time runs short, always get 140 s and up to their 200 s
# when the others finish sooner (the deadline trims their limit).
LIMITS_S = {
    "sft": 90.0,
    "qlora": 70.0,
    # torchrun, one worker per GPU, staged load, a few steps, then the merge in its own process
    "qlora_fsdp_staged": 100.0,
    "evaluate": 50.0,
    "kernels": 200.0,
}
# A check is not started with less than this left: it would only be killed.
MIN_START_S = 20.0
# Of a kernel check's limit, kept for its process start (torch, triton) and the summary.
KERNEL_MARGIN_S = 20.0
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "triton")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Sizes:
    """How big each check runs: a model worth timing on a GPU, or a toy one on CPU."""

    model: dict[str, Any]
    vocab_size: int
    conversations: int
    max_turns: int  # conversations of 1..max_turns problems: lengths vary, so padding costs
    steps: int
    docs_per_step: int
    max_length: int  # tokens per packed row
    trainer_rows: int  # packed rows per step of the production trainer
    lr: float
    qlora_lr: float
    lora_r: int
    eval_problems: int
    eval_samples: int
    eval_new_tokens: int
    kernel_trials: int
    kernel_timeout_s: float
    kernel_workers: int
    # the flagship's Qwen3-MoE (all its layers sparse) and its optimizer steps
    moe_model: dict[str, Any]
    moe_steps: int
    kernel_problems: tuple[str, ...] | None = None  # None: all of the project's problems


SIZES = {
    "cuda": Sizes(
        model=dict(
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
        ),
        vocab_size=4096,
        conversations=1024,
        max_turns=8,
        steps=20,
        docs_per_step=32,
        max_length=2048,
        trainer_rows=4,
        lr=1e-3,
        qlora_lr=5e-3,
        lora_r=16,
        eval_problems=16,
        eval_samples=4,
        eval_new_tokens=128,
        kernel_trials=3,
        kernel_timeout_s=60.0,
        # Compiles are CPU-bound and the GPU work of each candidate is microseconds, so a few in
        # flight keep all 48 within the limit; speedups are timed with others compiling beside.
        kernel_workers=4,
        # ~40M parameters, 94% of them experts (the real model's share); every NF4 shape divides
        # the 8 ways of a full node
        moe_model=dict(
            family="qwen3_moe",
            hidden_size=512,
            intermediate_size=1536,
            moe_intermediate_size=384,
            num_experts=16,
            num_experts_per_tok=4,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),
        moe_steps=8,
    ),
    "cpu": Sizes(
        model=dict(
            hidden_size=64,
            intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=512,
            tie_word_embeddings=True,
        ),
        vocab_size=320,
        conversations=48,
        max_turns=1,  # short documents, several to a row: a leak shows at this size
        steps=3,
        docs_per_step=8,
        max_length=512,
        trainer_rows=2,
        lr=1e-3,
        qlora_lr=5e-3,
        lora_r=4,
        eval_problems=3,
        eval_samples=2,
        eval_new_tokens=16,
        kernel_trials=1,
        kernel_timeout_s=60.0,
        kernel_workers=2,
        moe_model=dict(
            family="qwen3_moe",
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=512,
            tie_word_embeddings=False,
        ),
        moe_steps=4,
        kernel_problems=("add", "relu"),
    ),
}


# ---------------------------------------------------------------------------------------------
# The checks. Each returns {"status": "pass" | "fail", "failures": [...], numbers...}.


def _verdict(failures: list[str], **numbers: Any) -> dict[str, Any]:
    return {"status": "fail" if failures else "pass", "failures": failures, **numbers}


def _decreased(losses: list[float]) -> bool:
    """The last three steps' mean below the first step's (train_sft's final_loss)."""
    tail = losses[-3:]
    return len(losses) > 1 and sum(tail) / len(tail) < losses[0]


def _attention(device: str) -> str:
    from transformers.utils import is_flash_attn_2_available

    return "flash_attention_2" if device == "cuda" and is_flash_attn_2_available() else "sdpa"


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _mib(nbytes: float) -> float:
    return round(nbytes / 2**20, 2)


def _documents(base_dir, dataset, max_length: int) -> tuple[Any, list[dict], list[dict]]:
    """(tokenizer, encoded examples, documents): each document its input_ids and labels (assistant
    tokens only, as TRL builds them from the masks), truncated at ``max_length``."""
    from transformers import AutoTokenizer

    from .data.conversations import load_conversations
    from .runtime.sft import encode_examples
    from .runtime.templates import training_template

    tokenizer = AutoTokenizer.from_pretrained(Path(base_dir))
    encoded = encode_examples(tokenizer, training_template(tokenizer), load_conversations(dataset))
    docs = []
    for enc in encoded:
        ids, mask = enc["input_ids"][:max_length], enc["assistant_masks"][:max_length]
        labels = [t if m else -100 for t, m in zip(ids, mask, strict=True)]
        if any(label != -100 for label in labels):
            docs.append({"input_ids": ids, "labels": labels})
    return tokenizer, encoded, docs


def packed_batch(docs: list[dict], *, max_length: int, pad_token_id: int, flatten: bool) -> dict:
    """The documents filled in order into rows of at most ``max_length`` tokens, collated as the
    trainer collates packed rows (restarting positions; one flattened row for FlashAttention)."""
    from .runtime.sft import collate_packed_rows

    rows: list[dict] = []
    for doc in docs:
        if not rows or len(rows[-1]["input_ids"]) + len(doc["input_ids"]) > max_length:
            rows.append({"input_ids": [], "labels": [], "seq_lengths": []})
        rows[-1]["input_ids"] += doc["input_ids"]
        rows[-1]["labels"] += doc["labels"]
        rows[-1]["seq_lengths"].append(len(doc["input_ids"]))
    return collate_packed_rows(rows, pad_token_id=pad_token_id, flatten=flatten)


def padded_batch(docs: list[dict], *, pad_token_id: int) -> dict:
    """One document per row, right-padded, with an attention mask: the unpacked layout."""
    import torch

    shape = (len(docs), max(len(d["input_ids"]) for d in docs))
    ids, labels = torch.full(shape, pad_token_id), torch.full(shape, -100)
    mask = torch.zeros(shape, dtype=torch.long)
    for row, doc in enumerate(docs):
        n = len(doc["input_ids"])
        ids[row, :n] = torch.tensor(doc["input_ids"])
        labels[row, :n] = torch.tensor(doc["labels"])
        mask[row, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def _train_steps(
    base_dir,
    batches: list[dict],
    *,
    device: str,
    impl: str,
    lr: float,
    seed: int,
    probe: dict | None = None,
):
    """Plain AdamW steps from the base weights, loaded as the trainer loads them (float32 weights,
    bf16 autocast on GPU): (losses, seconds per step, peak MiB or None, the loss of ``probe`` under
    the initial weights or None)."""
    import torch

    from .config import Train
    from .runtime.sft import load_model

    torch.manual_seed(seed)
    model = load_model(base_dir, Train.parse({"attn_implementation": impl})).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    cuda = device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    probed = None
    if probe is not None:
        probe = {k: v.to(device) for k, v in probe.items()}
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            probed = model(**probe, use_cache=False).loss.item()
    losses, seconds = [], []
    for batch in batches:
        _sync(device)
        start = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=cuda):
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # waits for the step
        _sync(device)
        seconds.append(time.perf_counter() - start)
    peak = _mib(torch.cuda.max_memory_allocated()) if cuda else None
    del model, optimizer
    if cuda:
        torch.cuda.empty_cache()
    return losses, seconds, peak, probed


def check_sft(
    base_dir: str,
    dataset: str,
    *,
    device: str,
    steps: int,
    docs_per_step: int,
    max_length: int,
    trainer_rows: int,
    lr: float,
    seed: int = 0,
    log: Log = print,
) -> dict[str, Any]:
    """Packed against padded rows on the same documents from the same weights, then the
    production trainer. The step-0 losses are one forward of identical weights over identical
    supervised tokens, so they differ only by numerics; a packing that let documents see each
    other would differ by more."""
    import torch

    from .config import Train
    from .runtime.sft import build_trainer

    impl = _attention(device)
    flatten = "flash" in impl
    tokenizer, encoded, docs = _documents(base_dir, dataset, max_length)
    pad = tokenizer.pad_token_id
    order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist()
    needed = steps * docs_per_step
    if len(docs) < needed:
        raise ValueError(f"{dataset}: {len(docs)} documents, {needed} needed for {steps} steps")
    groups = [
        [docs[i] for i in order[s * docs_per_step : (s + 1) * docs_per_step]] for s in range(steps)
    ]
    tokens = [sum(len(d["input_ids"]) for d in g) for g in groups]
    layouts = {
        "packed": [
            packed_batch(g, max_length=max_length, pad_token_id=pad, flatten=flatten)
            for g in groups
        ],
        "padded": [padded_batch(g, pad_token_id=pad) for g in groups],
    }
    precision = "bf16 autocast, float32 weights" if device == "cuda" else "float32"
    out: dict[str, Any] = {
        "attn_implementation": impl,
        "precision": precision,
        "documents_per_step": docs_per_step,
        "tokens_per_step": round(sum(tokens) / steps),
    }
    failures = []
    leaky_loss = math.nan
    for name, batches in layouts.items():
        log(f"{name}: {steps} steps, {impl}, {precision}")
        # The control: the first packed batch without restarting positions, so that documents
        # attend to the ones before them in their row.
        leak = None
        if name == "packed":
            leak = {k: v for k, v in batches[0].items() if k != "position_ids"}
        losses, seconds, peak, probed = _train_steps(
            base_dir, batches, device=device, impl=impl, lr=lr, seed=seed, probe=leak
        )
        if leak is not None:
            leaky_loss = probed
        # step 0 pays for kernel selection and allocator warm-up
        timed = slice(1, None) if steps > 1 else slice(None)
        slots = sum(b["input_ids"].numel() for b in batches)
        out[name] = {
            "losses": [round(x, 5) for x in losses],
            "tokens_per_s": round(sum(tokens[timed]) / sum(seconds[timed]), 1),
            "seconds_per_step": round(sum(seconds[timed]) / len(seconds[timed]), 4),
            "padding_share": round(1 - sum(tokens) / slots, 4),
            "peak_memory_mib": peak,
            "loss_decreased": _decreased(losses),
        }
        if name == "packed":
            rows = sum(b["input_ids"].shape[0] for b in batches)
            out[name]["documents_per_row"] = round(steps * docs_per_step / rows, 2)
            if rows == steps * docs_per_step:
                failures.append("packed rows hold one document each: nothing was packed")
        if not all(math.isfinite(x) for x in losses):
            failures.append(f"{name}: a loss is not finite")
        elif not out[name]["loss_decreased"]:
            failures.append(f"{name}: loss did not decrease ({losses[0]:.4f} -> {losses[-1]:.4f})")
    padded0 = out["padded"]["losses"][0]
    diff = abs(out["packed"]["losses"][0] - padded0)
    # Measured on CPU: float32 layouts agree to ~1e-6, bf16 autocast to ~4e-5; documents that see
    # each other shift the loss by ~4e-3 (CPU sizes) to ~9e-2 (GPU sizes).
    tolerance = 5e-3 if device == "cuda" else 1e-4
    out["step0_loss_abs_diff"] = round(diff, 6)
    out["step0_tolerance"] = tolerance
    out["step0_leaky_abs_diff"] = round(abs(leaky_loss - padded0), 6)
    if out["step0_leaky_abs_diff"] <= tolerance:
        failures.append(
            "documents that see each other change the step-0 loss by no more than the tolerance: "
            "the comparison could not catch a leak at these sizes"
        )
    out["max_loss_abs_diff"] = round(
        max(
            abs(a - b)
            for a, b in zip(out["packed"]["losses"], out["padded"]["losses"], strict=True)
        ),
        6,
    )
    out["packed_speedup"] = round(out["packed"]["tokens_per_s"] / out["padded"]["tokens_per_s"], 3)
    if diff > tolerance:
        failures.append(f"step-0 loss differs by {diff:.3g} between packed and padded rows")

    log(f"production trainer: {steps} steps of {trainer_rows} packed rows")
    params = Train.parse(
        {
            "max_steps": steps,
            "batch_size": trainer_rows,
            "max_length": max_length,
            "logging_steps": 1,
            "lr": lr,
            "lr_scheduler": "constant",
            "attn_implementation": impl,
        },
        where="gpu-check",
    )
    with tempfile.TemporaryDirectory(prefix="gpu-check-sft-") as tmp:
        trainer = build_trainer(base_dir, encoded, params, tmp, seed=seed)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    out["trainer"] = {
        "losses": [round(x, 5) for x in losses],
        "tokens_per_s": round(trainer.state.num_input_tokens_seen / seconds, 1),
        "train_s": round(seconds, 2),
        "on": str(next(trainer.model.parameters()).device),
        "loss_decreased": _decreased(losses),
    }
    if not out["trainer"]["loss_decreased"]:
        failures.append("trainer: loss did not decrease")
    return _verdict(failures, **out)


def _grad_probe(record: list[dict]):
    """A TrainerCallback counting, before each optimizer step, trainable parameters whose gradient
    is missing or zero (LoRA B starts at zero, so at step 0 only A's gradients are zero)."""
    from transformers import TrainerCallback

    class GradProbe(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            counts = {"total": 0, "none": 0, "zero": 0, "zero_lora_B": 0}
            for name, p in model.named_parameters():
                if not p.requires_grad:
                    continue
                counts["total"] += 1
                if p.grad is None:
                    counts["none"] += 1
                elif not bool(p.grad.abs().sum() > 0):
                    counts["zero"] += 1
                    counts["zero_lora_B"] += "lora_B" in name
            record.append(counts)

    return GradProbe()


def check_qlora(
    base_dir: str,
    dataset: str,
    *,
    device: str,
    steps: int,
    trainer_rows: int,
    max_length: int,
    lr: float,
    lora_r: int,
    seed: int = 0,
    log: Log = print,
) -> dict[str, Any]:
    """QLoRA through the production trainer: a bitsandbytes NF4 base, LoRA on every linear layer
    of the blocks."""
    import bitsandbytes as bnb
    import torch

    from .config import Train
    from .runtime.adapters import trainable_breakdown
    from .runtime.sft import build_trainer

    impl = _attention(device)
    cuda = device == "cuda"
    _, encoded, _ = _documents(base_dir, dataset, max_length)
    params = Train.parse(
        {
            "method": "qlora",
            "load_in_4bit": True,
            "lora": {
                "r": lora_r,
                "alpha": 2 * lora_r,
                "dropout": 0.0,
                "target_modules": LORA_TARGETS,
            },
            "max_steps": steps,
            "batch_size": trainer_rows,
            "max_length": max_length,
            "logging_steps": 1,
            "lr": lr,
            "lr_scheduler": "constant",
            "attn_implementation": impl,
        },
        where="gpu-check",
    )
    grads: list[dict] = []
    failures = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-qlora-") as tmp:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer = build_trainer(
            base_dir, encoded, params, tmp, callbacks=[_grad_probe(grads)], seed=seed
        )
        layers = [m for m in trainer.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        stored = sum(m.weight.numel() * m.weight.element_size() for m in layers)
        logical = sum(m.in_features * m.out_features for m in layers)
        places = sorted({str(m.weight.device) for m in layers})
        loaded = torch.cuda.memory_allocated() if cuda else None
        log(f"{len(layers)} NF4 layers on {', '.join(places)}; training {steps} steps")
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    out = {
        "attn_implementation": impl,
        "nf4_layers": len(layers),
        "nf4_on": places,
        "losses": [round(x, 5) for x in losses],
        "loss_decreased": _decreased(losses),
        "tokens_per_s": round(trainer.state.num_input_tokens_seen / seconds, 1),
        "train_s": round(seconds, 2),
        "grads_per_step": grads,
        **trainable_breakdown(trainer.model),
        "memory_mib": {
            "nf4_weights": _mib(stored),
            "same_weights_in_bf16": _mib(2 * logical),
            "after_load": _mib(loaded) if cuda else None,
            "peak": _mib(torch.cuda.max_memory_allocated()) if cuda else None,
        },
    }
    if not layers:
        failures.append("no bitsandbytes Linear4bit layer: the base was not quantised")
    if cuda and places != [f"cuda:{torch.cuda.current_device()}"]:
        failures.append(f"NF4 layers on {places}, not on the GPU")
    if not out["loss_decreased"]:
        failures.append("loss did not decrease")
    if not grads:
        failures.append("no optimizer step was probed")
    else:
        if any(g["none"] for g in grads):
            failures.append("a trainable parameter got no gradient")
        if grads[0]["zero_lora_B"]:
            failures.append(f"step 0: {grads[0]['zero_lora_B']} LoRA B tensors got zero gradient")
        if len(grads) > 1 and grads[-1]["zero"]:
            failures.append(f"last step: {grads[-1]['zero']} trainable tensors got zero gradient")
    return _verdict(failures, **out)


ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
FUSED_EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# The merged model's logits against the base with the adapter applied by PEFT, both in float32:
# the same sums in another order (measured on CPU at toy sizes: 2.4e-7, the adapter's own effect
# 0.4).
MERGE_TOLERANCE = 1e-4
# Below this the trained adapter barely moves the logits, and agreeing within MERGE_TOLERANCE
# would prove nothing about the merge.
MIN_ADAPTER_EFFECT = 10 * MERGE_TOLERANCE


def _status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM: the peak RSS) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise ValueError(f"/proc/self/status has no {field}")


def measured_merge(base: str, adapter: str, out: str, *, log: Log = print) -> dict[str, Any]:
    """``stream_merge`` as the merge_adapter rule runs it, a CPU job of its own, with this
    process's resident memory once the libraries are imported and at its peak, beside the sizes
    of the checkpoint and of its largest shard (the merge holds about one shard at a time)."""
    import peft  # noqa: F401 - imported before the first reading, as the merge imports them
    import transformers  # noqa: F401

    from .runtime.adapter_merge import stream_merge
    from .runtime.merge import shard_map

    shards = [Path(base) / s for s in set(shard_map(Path(base)).values())]
    before = _status_mib("VmRSS")
    summary = stream_merge(base, adapter, out)
    log(f"merged {summary['tensors_changed']} tensors in {summary['seconds']} s")
    return _verdict(
        [],
        **summary,
        checkpoint_mib=_mib(sum(s.stat().st_size for s in shards)),
        largest_shard_mib=_mib(max(s.stat().st_size for s in shards)),
        rss_before_mib=before,
        peak_rss_mib=_status_mib("VmHWM"),
    )


@contextlib.contextmanager
def _gpus_hidden(hide: bool):
    """The GPUs hidden from the processes started inside (the train stage's workers)."""
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hide:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if hide:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved


def _tensors(model_dir: Path, match: Callable[[str], bool]) -> dict[str, Any]:
    from safetensors import safe_open

    from .runtime.merge import shard_map

    out = {}
    for key, shard in shard_map(model_dir).items():
        if match(key):
            with safe_open(model_dir / shard, framework="pt") as fh:
                out[key] = fh.get_tensor(key)
    return out


def _merged_logits(base_dir, adapter: Path, merged: Path, device: str, vocab_size: int, seed: int):
    """On random tokens, float32 on ``device``: the largest logit difference between the merged
    model and the base with the adapter applied by PEFT, and between the latter and the base
    (the adapter's own effect)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (2, 64), generator=generator).to(device)

    def load(path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model.to(device).eval()

    # full float32 matmuls on GPU too: TF32 would blur differences far above the tolerance
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.no_grad():
            model = load(base_dir)
            plain = model(input_ids=ids).logits
            tuned = PeftModel.from_pretrained(model, adapter).eval()
            want = tuned(input_ids=ids).logits
            del model, tuned
            got = load(merged)(input_ids=ids).logits
    finally:
        torch.set_float32_matmul_precision(precision)
    return {
        "logits_max_abs_diff": float((got - want).abs().max()),
        "logits_tolerance": MERGE_TOLERANCE,
        "adapter_logits_effect": float((want - plain).abs().max()),
    }


def _is_router(key: str) -> bool:
    return any(f".mlp.{name}." in key for name in ("gate", "router", "shared_expert_gate"))


def check_qlora_fsdp_staged(
    base_dir: str,
    dataset: str,
    *,
    device: str,
    steps: int,
    trainer_rows: int,
    max_length: int,
    lr: float,
    lora_r: int,
    seed: int = 0,
    log: Log = print,
) -> dict[str, Any]:
    """The flagship recipe (beam-qlora-fsdp-staged) on a tiny Qwen3-MoE: the train stage with
    QLoRA, every weight matrix in NF4 (fused experts included) through the staged loader, LoRA on
    attention and the fused experts, FSDP2 over every GPU (2 gloo ranks on CPU; one process on
    one GPU); then the adapter streamed into the base as rule merge_adapter does, in a process of
    its own, and the merged model's logits held against the base with the adapter in PEFT."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig

    from .stages.train import run as train_stage

    cuda = device == "cuda"
    processes = torch.cuda.device_count() if cuda else 2
    impl = _attention(device)
    params: dict[str, Any] = {
        "method": "qlora",
        "load_in_4bit": True,
        "quantize_moe_experts": True,
        "lora": {
            "r": lora_r,
            "alpha": 2 * lora_r,
            "dropout": 0.0,
            "target_modules": ATTENTION,
            "target_parameters": FUSED_EXPERTS,
        },
        "max_steps": steps,
        "batch_size": trainer_rows,
        "max_length": max_length,
        "logging_steps": 1,
        "lr": lr,
        "lr_scheduler": "constant",
        "dtype": "bfloat16" if cuda else "float32",
        "attn_implementation": impl,
        "gradient_checkpointing": True,
        "seed": seed,
    }
    if processes > 1:
        params["distributed"] = {"gpus_per_node": processes, "fsdp_size": processes}
    config = AutoConfig.from_pretrained(base_dir)
    layers, experts = config.num_hidden_layers, config.num_experts
    # one NF4 tensor per attention projection, and per expert and fused projection
    expected_nf4 = {"attention": 4 * layers, "experts": 2 * experts * layers, "other": 0}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-flagship-") as tmp:
        tmp = Path(tmp)
        adapter, merged = tmp / "adapter", tmp / "merged"
        log(f"QLoRA on {processes} process(es), FSDP2 {processes > 1}, {impl}, {steps} steps")
        start = time.perf_counter()
        with _gpus_hidden(not cuda):
            metrics = train_stage(
                base=base_dir,
                dataset=dataset,
                out_model=str(adapter),
                params=params,
                threads=os.cpu_count() or 1,
                log=log,
            )
        stage_s = time.perf_counter() - start
        with safe_open(adapter / "adapter_model.safetensors", framework="pt") as fh:
            saved = list(fh.keys())
        merge = run_isolated(
            "merge",
            "stillroom.gpucheck:measured_merge",
            {"base": base_dir, "adapter": str(adapter), "out": str(merged)},
            limit_s=300.0,
            env={"CUDA_VISIBLE_DEVICES": ""},  # a CPU job, as rule merge_adapter is
            log=log,
        )
        out_merge = {k: v for k, v in merge.items() if k not in ("failures",)}
        comparison: dict[str, Any] = {}
        if merge["status"] == "pass":
            base_routers = _tensors(Path(base_dir), _is_router)
            merged_routers = _tensors(merged, _is_router)
            changed_routers = sorted(
                k
                for k in base_routers
                if k not in merged_routers or not torch.equal(base_routers[k], merged_routers[k])
            )
            experts_base = _tensors(Path(base_dir), lambda k: ".experts." in k)
            experts_merged = _tensors(merged, lambda k: ".experts." in k)
            comparison = {
                "routers": len(base_routers),
                "routers_unchanged": bool(base_routers) and not changed_routers,
                "expert_tensors_changed": sum(
                    not torch.equal(v, experts_merged[k]) for k, v in experts_base.items()
                ),
                **_merged_logits(base_dir, adapter, merged, device, config.vocab_size, seed),
            }
            del base_routers, merged_routers, experts_base, experts_merged
            if changed_routers:
                failures.append(f"the merge changed the router: {changed_routers[0]}")
            if not comparison["routers"]:
                failures.append("no router weight in the base: nothing to hold unchanged")
            if not comparison["expert_tensors_changed"]:
                failures.append("the merge changed no expert weight")
            if comparison["logits_max_abs_diff"] > MERGE_TOLERANCE:
                failures.append(
                    f"merged logits differ from the adapter model's by "
                    f"{comparison['logits_max_abs_diff']:.3g} (tolerance {MERGE_TOLERANCE:g})"
                )
            if comparison["adapter_logits_effect"] < MIN_ADAPTER_EFFECT:
                failures.append(
                    f"the adapter moves the logits by {comparison['adapter_logits_effect']:.3g} "
                    "only: the merge comparison would catch nothing"
                )
        else:
            failures.append(f"merge: {merge['status']}: {merge.get('error')}")
    losses = metrics["losses"]
    four_bit = metrics["four_bit_weights"]
    peaks = metrics["peak_memory_mib"]
    out = {
        "processes": metrics["world_size"],
        "fsdp2": processes > 1,
        "attn_implementation": impl,
        "dtype": params["dtype"],
        "losses": [round(x, 5) for x in losses],
        "loss_decreased": _decreased(losses),
        "tokens_per_s": metrics["tokens_per_second"],
        "train_s": metrics["train_seconds"],
        "stage_s": round(stage_s, 2),
        "four_bit_weights": four_bit,
        "four_bit_weights_expected": expected_nf4,
        "trainable": metrics["trainable"],
        "adapter_tensors": len(saved),
        "peak_gpu_memory_mib": peaks["gpu"],
        "peak_host_rss_mib": peaks["host_rss"],
        "merge": out_merge,
        **comparison,
    }
    if metrics["world_size"] != processes:
        failures.append(f"trained on {metrics['world_size']} processes, not {processes}")
    if not all(math.isfinite(x) for x in losses):
        failures.append("a loss is not finite")
    elif not out["loss_decreased"]:
        failures.append(f"loss did not decrease ({losses[0]:.4f} -> {losses[-1]:.4f})")
    if not four_bit.get("experts"):
        failures.append("no expert weight in NF4")
    if four_bit != expected_nf4:
        failures.append(f"NF4 weight tensors {four_bit}, expected {expected_nf4}")
    if not metrics["trainable"].get("experts"):
        failures.append("no LoRA weight on the experts")
    routed = sorted(k for k in saved if _is_router(k.replace(".base_layer", "")))
    if routed:
        failures.append(f"the adapter holds router weights: {routed[0]}")
    if cuda and not (peaks["gpu"] and all(peaks["gpu"])):
        failures.append(f"a rank allocated no GPU memory: {peaks['gpu']}")
    return _verdict(failures, **out)


def check_evaluate(
    base_dir: str,
    *,
    device: str,
    problems: int,
    samples: int,
    max_new_tokens: int,
    seed: int = 0,
    log: Log = print,
) -> dict[str, Any]:
    """The evaluate stage, ``hf`` backend, on generated arithmetic problems."""
    import torch

    from .data.sources import generate
    from .io import read_jsonl
    from .stages import evaluate

    cuda = device == "cuda"
    rows = [
        {"prompt": r["prompt"], "answer": r["answer"], "kind": r["kind"]}
        for r in generate("arithmetic", "gpu-check", problems, seed, max_operand=99)
    ]
    params = {
        "model_name": "gpu-check",
        "benchmark": "gpu-check",
        "samples": samples,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": max_new_tokens,
        "batch_size": problems * samples,
        "effort": None,
        "effort_tag": "{reasoning effort: $effort}",
        "backend": {"backend": "hf"},
        "seed": seed,
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-eval-") as tmp:
        bench, out_path = Path(tmp) / "problems.jsonl", Path(tmp) / "samples.jsonl"
        write_jsonl(bench, rows)
        before = torch.cuda.memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        metrics = evaluate.run(
            model=str(base_dir),
            problems=str(bench),
            out_samples=str(out_path),
            params=params,
            log=log,
        )
        seconds = time.perf_counter() - start
        written = read_jsonl(out_path)
    # A fresh process: GPU memory allocated during the stage means the model ran there.
    used = torch.cuda.max_memory_allocated() - before if cuda else None
    failures = []
    if len(written) != problems * samples:
        failures.append(f"{len(written)} samples written, {problems * samples} expected")
    if not any(r["completion_tokens"] for r in written):
        failures.append("no completion tokens generated")
    if cuda and not used:
        failures.append("no GPU memory was allocated: the hf backend did not run on the GPU")
    return _verdict(
        failures,
        problems=problems,
        samples_written=len(written),
        completion_tokens=metrics["completion_tokens"],
        tokens_per_s=metrics["tokens_per_s"],
        stage_s=round(seconds, 2),
        gpu_memory_mib=_mib(used) if cuda else None,
    )


def check_kernels(
    problems: list[str] | None = None,
    *,
    device: str,
    trials: int,
    timeout_s: float,
    workers: int,
    budget_s: float | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Every reference solution answered as the procedural teacher answers (reasoning, then the
    code block) and scored by the kernel reward: compiled by Triton on a GPU (its interpreter on
    CPU), checked against the reference and, on a GPU, timed against it. Problems not started
    within ``budget_s`` are reported as not run."""
    from .config import ValidatorOptions
    from .grading.kernel import score_answer
    from .kernels.problemset import kernel_files, solution_files
    from .teachers.kernel import kernel_solution

    spec = {
        "name": "gpu-check",
        "kind": "kernels",
        "problems": list(problems) if problems else None,
    }
    files, solutions = kernel_files(spec), solution_files(spec)
    deadline = time.monotonic() + budget_s if budget_s else math.inf
    results: dict[str, dict] = {}

    def one(stem: str) -> None:
        left = deadline - time.monotonic()
        if stem not in solutions:
            results[stem] = {"reward": 0.0, "reasons": ["no reference solution"]}
            return
        if left < 5:
            results[stem] = {"reward": None, "reasons": ["not run: the check's time was up"]}
            return
        src = files[stem].read_text(encoding="utf-8")
        reasoning, block = kernel_solution(src, stem, detail=0)
        # the candidate's two jobs (extraction, replay) never outlast the check
        options = ValidatorOptions(device=device, trials=trials, timeout_s=min(timeout_s, left / 2))
        start = time.perf_counter()
        try:
            r = score_answer(src, f"<think>\n{reasoning}\n</think>\n\n{block}", options)
        except Exception as exc:  # noqa: BLE001 - the validator itself failed: this problem's result
            results[stem] = {"reward": 0.0, "reasons": [f"{type(exc).__name__}: {exc}"]}
            return
        results[stem] = {
            "reward": r.reward,
            "speedup": round(r.speedup, 3) if r.speedup is not None else None,
            "seconds": round(time.perf_counter() - start, 2),
            **({} if r.reward == 1.0 else {"reasons": r.reasons}),
        }
        log(f"{stem}: reward {r.reward:g}, speedup {results[stem]['speedup']}")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, files))
    per_problem = {stem: results[stem] for stem in files}
    passed = [s for s, r in per_problem.items() if r["reward"] == 1.0]
    speedups = [r["speedup"] for r in per_problem.values() if r.get("speedup")]
    failures = [
        f"{stem}: {'; '.join(r.get('reasons', []))[:300]}"
        for stem, r in per_problem.items()
        if r["reward"] != 1.0
    ]
    if device == "cuda":
        failures += [
            f"{s}: passed but no speedup was timed" for s in passed if not results[s].get("speedup")
        ]
    return _verdict(
        failures,
        problems=len(per_problem),
        passed=len(passed),
        not_run=sum(r["reward"] is None for r in per_problem.values()),
        workers=workers,
        speedup_geomean=(
            round(math.exp(sum(math.log(s) for s in speedups) / len(speedups)), 3)
            if speedups
            else None
        ),
        faster_than_reference=sum(s > 1 for s in speedups),
        per_problem=per_problem,
    )


CHECKS = {
    "sft": "stillroom.gpucheck:check_sft",
    "qlora": "stillroom.gpucheck:check_qlora",
    "qlora_fsdp_staged": "stillroom.gpucheck:check_qlora_fsdp_staged",
    "evaluate": "stillroom.gpucheck:check_evaluate",
    "kernels": "stillroom.gpucheck:check_kernels",
}


# ---------------------------------------------------------------------------------------------
# The shared model, the isolation of each check, and the summary.


def sft_rows(count: int, max_turns: int, seed: int) -> list[dict]:
    """Conversations of 1..max_turns arithmetic problems, each answered with worked reasoning of
    varying detail: document lengths spread over ~an order of magnitude."""
    import random

    from .data.sources import generate, worked_solution

    rng = random.Random(seed)
    problems = iter(generate("arithmetic", "gpu-check", count * max_turns, seed, max_operand=999))
    rows = []
    for i in range(count):
        messages = []
        for _ in range(rng.randint(1, max_turns)):
            rec = next(problems)
            reasoning, final = worked_solution(rec["meta"], rec["answer"], detail=rng.randrange(4))
            messages += [
                {"role": "user", "content": rec["prompt"]},
                {"role": "assistant", "content": f"<think>{reasoning}</think>\n{final}"},
            ]
        rows.append({"id": f"gpu-check-{i}", "messages": messages})
    return rows


def build_fixture(workdir: Path, sizes: Sizes, seed: int = 0, moe: bool = True) -> dict[str, Any]:
    """The SFT set, a BPE tokenizer trained on it, a random Qwen3 of ``sizes.model`` and, with
    ``moe``, a random Qwen3-MoE of ``sizes.moe_model``, as the tests build theirs (no model
    hub)."""
    from .runtime.student import build_model, train_tokenizer

    rows = sft_rows(sizes.conversations, sizes.max_turns, seed)
    write_jsonl(workdir / "sft.jsonl", rows)
    train_tokenizer(
        [m["content"] for r in rows for m in r["messages"]],
        workdir / "tokenizer",
        vocab_size=sizes.vocab_size,
        min_frequency=2,
    )
    built = build_model(workdir / "tokenizer", workdir / "base", model=sizes.model, seed=seed)
    out = {
        "dataset": str(workdir / "sft.jsonl"),
        "base": str(workdir / "base"),
        "conversations": len(rows),
        **built,
    }
    if moe:
        # float32 on disk, as build_model saves it: the merge is then compared in float32
        moe_built = build_model(
            workdir / "tokenizer", workdir / "moe", model=sizes.moe_model, seed=seed
        )
        out.update(moe_base=str(workdir / "moe"), moe_parameters=moe_built["parameters"])
    return out


def check_kwargs(name: str, device: str, s: Sizes, fixture: Mapping[str, Any]) -> dict:
    """The arguments of check ``name`` on ``device`` at sizes ``s``, on the model and data of
    ``fixture`` (build_fixture)."""
    if name == "sft":
        return dict(
            base_dir=fixture["base"],
            dataset=fixture["dataset"],
            device=device,
            steps=s.steps,
            docs_per_step=s.docs_per_step,
            max_length=s.max_length,
            trainer_rows=s.trainer_rows,
            lr=s.lr,
        )
    if name == "qlora":
        return dict(
            base_dir=fixture["base"],
            dataset=fixture["dataset"],
            device=device,
            steps=s.steps,
            trainer_rows=s.trainer_rows,
            max_length=s.max_length,
            lr=s.qlora_lr,
            lora_r=s.lora_r,
        )
    if name == "qlora_fsdp_staged":
        return dict(
            base_dir=fixture["moe_base"],
            dataset=fixture["dataset"],
            device=device,
            steps=s.moe_steps,
            trainer_rows=s.trainer_rows,
            max_length=s.max_length,
            lr=s.qlora_lr,
            lora_r=s.lora_r,
        )
    if name == "evaluate":
        return dict(
            base_dir=fixture["base"],
            device=device,
            problems=s.eval_problems,
            samples=s.eval_samples,
            max_new_tokens=s.eval_new_tokens,
        )
    return dict(
        problems=list(s.kernel_problems) if s.kernel_problems else None,
        device=device,
        trials=s.kernel_trials,
        timeout_s=s.kernel_timeout_s,
        workers=s.kernel_workers,
        budget_s=None,  # from the limit the check gets (run_checks)
    )


def _die_with_parent() -> None:
    """In the check's process: SIGKILL when the summary's process dies, so that no orphan keeps
    the GPU."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_isolated(
    name: str,
    target: str,
    kwargs: Mapping[str, Any],
    limit_s: float,
    *,
    env: Mapping[str, str] | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """``target(**kwargs)`` ("module:function") in a process of its own, killed with everything it
    started after ``limit_s``; its output goes to ``log`` line by line, prefixed with ``name``.
    Returns its result, or a status ``error`` / ``timeout`` with the reason and its last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{name}-") as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(
            json.dumps({"target": target, "kwargs": dict(kwargs), "result": str(result)})
        )
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "stillroom.gpucheck", "--child", str(spec)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={
                # libraries' deprecation notices would bury the check's own lines
                "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
                **os.environ,
                **(env or {}),
                "PYTHONUNBUFFERED": "1",
            },
            start_new_session=True,  # its own process group: killed whole
            preexec_fn=_die_with_parent,
        )

        def relay() -> None:
            for line in proc.stdout:
                tail.append(line.rstrip())
                log(f"[{name}] {line.rstrip()}")

        reader = threading.Thread(target=relay, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            timed_out = True
        reader.join(timeout=5)  # a grandchild may still hold the pipe
        seconds = round(time.monotonic() - start, 1)
        if timed_out:
            out = {
                "status": "timeout",
                "error": f"killed at its time limit of {limit_s:.0f} s",
                "log_tail": list(tail),
            }
        elif result.exists():
            out = json.loads(result.read_text())
        else:
            out = {
                "status": "error",
                "error": f"its process ended (exit {proc.returncode}) without a result",
                "log_tail": list(tail),
            }
    return {"status": out.pop("status"), "wall_s": seconds, "limit_s": round(limit_s), **out}


def run_checks(
    plan: Mapping[str, tuple[str, Mapping[str, Any], float]],
    *,
    deadline: float,
    env: Mapping[str, str] | None = None,
    log: Log = print,
) -> dict[str, dict]:
    """Run each check of ``plan`` (name -> (target, kwargs, limit_s)) in order, each within its
    limit and none past ``deadline`` (a time.monotonic() value); a check without time to run is
    skipped. A check whose kwargs take ``budget_s`` is told how long it has."""
    results: dict[str, dict] = {}
    for name, (target, kwargs, limit) in plan.items():
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            results[name] = {"status": "skipped", "reason": f"overall deadline: {left:.0f} s left"}
            continue
        limit = min(limit, left)
        if "budget_s" in kwargs:
            kwargs = {**kwargs, "budget_s": max(1.0, limit - KERNEL_MARGIN_S)}
        log(f"{name}: starting, limit {limit:.0f} s")
        results[name] = run_isolated(name, target, kwargs, limit, env=env, log=log)
        log(f"{name}: {results[name]['status']} in {results[name]['wall_s']} s")
    return results


def device_report() -> tuple[dict[str, Any], str | None]:
    """(what torch sees, why there is no CUDA device or None)."""
    import torch

    info: dict[str, Any] = {"torch_cuda": torch.version.cuda, "cuda_available": False}
    if torch.version.cuda is None:
        return info, f"no CUDA device: torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return info, (
            f"no CUDA device: torch {torch.__version__} sees no GPU"
            + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
        )
    props = torch.cuda.get_device_properties(0)
    info.update(
        cuda_available=True,
        name=props.name,
        count=torch.cuda.device_count(),
        capability=f"{props.major}.{props.minor}",
        memory_gib=round(props.total_memory / 2**30, 1),
    )
    return info, None


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in (*PACKAGES, "flash-attn"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _write(path: str, summary: dict) -> None:
    text = json.dumps(summary, indent=2)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text + "\n")
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m stillroom.gpucheck", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"the JSON summary (default {DEFAULT_OUT})")
    ap.add_argument("--checks", default=",".join(CHECKS), help="comma-separated subset, in order")
    ap.add_argument(
        "--device",
        choices=["auto", "cuda", "cpu"],
        default="auto",
        help="auto: the GPU, or a skipped summary without one; cpu: toy sizes on CPU",
    )
    ap.add_argument("--deadline-s", type=float, default=DEADLINE_S, help="overall time limit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars would bury the checks' lines
    started = time.monotonic()
    deadline = started + args.deadline_s
    names = [n.strip() for n in args.checks.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        ap.error(f"--checks: unknown {', '.join(unknown)} (known: {', '.join(CHECKS)})")

    from .provenance import now

    stamp, host = now(), os.uname().nodename
    info, missing = device_report()
    device = args.device if args.device != "auto" else ("cuda" if missing is None else None)
    if device == "cuda" and missing:
        ap.error(f"--device cuda: {missing}")
    if device is None:
        summary = {
            "status": "skipped",
            "reason": missing,
            "started": stamp,
            "host": host,
            "device": info,
            "versions": _versions(),
            "checks": {n: {"status": "skipped", "reason": "no CUDA device"} for n in names},
        }
        _write(args.out, summary)
        return 0

    def log(msg: str) -> None:
        print(f"[gpu-check {time.monotonic() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    sizes = SIZES[device]
    # On CPU the trainer must not find a GPU either: every check then runs where it says.
    env = {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        t0 = time.monotonic()
        log(f"building the {device} model and data")
        moe = "qlora_fsdp_staged" in names
        fixture = build_fixture(Path(tmp), sizes, moe=moe)
        model = {
            **{k: fixture[k] for k in ("parameters", "vocab_size", "conversations")},
            "shape": sizes.model,
            **(
                {"moe_parameters": fixture["moe_parameters"], "moe_shape": sizes.moe_model}
                if moe
                else {}
            ),
            "build_s": round(time.monotonic() - t0, 1),
        }
        plan = {
            name: (CHECKS[name], check_kwargs(name, device, sizes, fixture), LIMITS_S[name])
            for name in names
        }
        checks = run_checks(plan, deadline=deadline, env=env, log=log)
    passed = [n for n, c in checks.items() if c["status"] == "pass"]
    summary = {
        "status": "pass" if len(passed) == len(checks) else "fail",
        "on": device,
        "started": stamp,
        "seconds": round(time.monotonic() - started, 1),
        "deadline_s": args.deadline_s,
        "host": host,
        "device": info,
        "versions": _versions(),
        "passed": passed,
        "not_passed": [n for n in checks if n not in passed],
        "model": model,
        "checks": checks,
    }
    _write(args.out, summary)
    return 0 if summary["status"] == "pass" else 1


def _child(spec_path: str) -> int:
    """In a check's process: run its target, write its result (an error as a result too)."""
    spec = json.loads(Path(spec_path).read_text())
    module, _, function = spec["target"].partition(":")
    try:
        target = getattr(importlib.import_module(module), function)
        out = target(**spec["kwargs"], log=lambda msg: print(msg, flush=True))
    except Exception as exc:  # noqa: BLE001 - any failure of a check is its result
        out = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc().splitlines()[-15:],
        }
    write_text(spec["result"], json.dumps(out) + "\n")
    return 0 if out.get("status") == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
