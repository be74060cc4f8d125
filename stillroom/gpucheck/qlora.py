"""Check ``qlora``: an NF4 base with LoRA through the production trainer: loss, adapter
gradients, memory."""

from __future__ import annotations

import tempfile
import time
from typing import Any

from .common import LORA_TARGETS, Log, attention, decreased, mib, verdict
from .sft import documents


def grad_probe(record: list[dict]):
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

    from ..config import Train
    from ..runtime.adapters import trainable_breakdown
    from ..runtime.sft import build_trainer

    impl = attention(device)
    cuda = device == "cuda"
    _, encoded, _ = documents(base_dir, dataset, max_length)
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
            base_dir, encoded, params, tmp, callbacks=[grad_probe(grads)], seed=seed
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
        "loss_decreased": decreased(losses),
        "tokens_per_s": round(trainer.state.num_input_tokens_seen / seconds, 1),
        "train_s": round(seconds, 2),
        "grads_per_step": grads,
        **trainable_breakdown(trainer.model),
        "memory_mib": {
            "nf4_weights": mib(stored),
            "same_weights_in_bf16": mib(2 * logical),
            "after_load": mib(loaded) if cuda else None,
            "peak": mib(torch.cuda.max_memory_allocated()) if cuda else None,
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
    return verdict(failures, **out)
