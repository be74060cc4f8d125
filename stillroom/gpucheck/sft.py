"""Check ``sft``: bf16 SFT of a small random Qwen3 on the same documents in packed rows
(restarting position_ids; FlashAttention 2 when flash-attn is importable, else sdpa) and in
padded rows, from the same weights; then the production trainer (runtime/sft.py)."""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import Log, attention, decreased, mib, sync, verdict


def documents(base_dir, dataset, max_length: int) -> tuple[Any, list[dict], list[dict]]:
    """(tokenizer, encoded examples, documents): each document its input_ids and labels (assistant
    tokens only, as TRL builds them from the masks), truncated at ``max_length``."""
    from transformers import AutoTokenizer

    from ..data.conversations import load_conversations
    from ..runtime.sft import encode_examples
    from ..runtime.templates import training_template

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
    from ..runtime.sft import collate_packed_rows

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

    from ..config import Train
    from ..runtime.sft import load_model

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
        sync(device)
        start = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=cuda):
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # waits for the step
        sync(device)
        seconds.append(time.perf_counter() - start)
    peak = mib(torch.cuda.max_memory_allocated()) if cuda else None
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

    from ..config import Train
    from ..runtime.sft import build_trainer

    impl = attention(device)
    flatten = "flash" in impl
    tokenizer, encoded, docs = documents(base_dir, dataset, max_length)
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
            "loss_decreased": decreased(losses),
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
        "loss_decreased": decreased(losses),
    }
    if not out["trainer"]["loss_decreased"]:
        failures.append("trainer: loss did not decrease")
    return verdict(failures, **out)
