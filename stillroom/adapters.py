"""LoRA and QLoRA on attention projections and on fused MoE experts (PEFT ``target_parameters``), with
the checks that must fail before any model is loaded. The router (``mlp.gate``) is never adapted unless
a config says so explicitly: adapting it destabilises routing (seed 000).

QLoRA loads the base in bitsandbytes NF4 (double quantisation). bitsandbytes quantises ``nn.Linear``
layers only, so fused expert parameters stay in the compute dtype.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

METHODS = ("full", "lora", "qlora")
LORA_KEYS = {"r", "alpha", "dropout", "target_modules", "target_parameters", "allow_router"}
ROUTER = re.compile(r"(^|\.)mlp\.gate(\.weight)?$|^gate$")


def check_lora(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """Validate train params' ``method``, ``lora`` and ``load_in_4bit``; return the LoRA settings (None
    for full SFT)."""
    method, lora, four_bit = (
        params.get("method", "full"),
        params.get("lora"),
        params.get("load_in_4bit", False),
    )
    if method not in METHODS:
        raise ValueError(f"train.method: {method!r} is not one of {', '.join(METHODS)}")
    if not isinstance(four_bit, bool):
        raise ValueError(f"train.load_in_4bit must be true or false, got {four_bit!r}")
    if method == "full":
        if lora:
            raise ValueError(
                "train.lora is set but train.method is 'full' (a full fine-tune has no adapter)"
            )
        if four_bit:
            raise ValueError(
                "train.load_in_4bit is set but train.method is 'full': 4-bit weights cannot be "
                "fine-tuned directly (use method: qlora, or drop load_in_4bit)"
            )
        return None
    if method == "qlora" and not four_bit:
        raise ValueError("train.method 'qlora' needs train.load_in_4bit: true")
    if method == "lora" and four_bit:
        raise ValueError(
            "train.load_in_4bit with train.method 'lora': LoRA on a 4-bit base is QLoRA; "
            "set method: qlora"
        )
    if not lora:
        raise ValueError(
            f"train.method '{method}' needs train.lora (r, alpha, target_modules / target_parameters)"
        )
    unknown = sorted(set(lora) - LORA_KEYS)
    if unknown:
        raise ValueError(
            f"train.lora: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(LORA_KEYS))})"
        )
    lora = {
        "dropout": 0.0,
        "target_modules": [],
        "target_parameters": [],
        "allow_router": False,
        **lora,
    }
    if not lora["target_modules"] and not lora["target_parameters"]:
        raise ValueError("train.lora: set target_modules and/or target_parameters")
    if lora["target_parameters"] and lora["dropout"]:
        raise ValueError(
            f"train.lora.dropout must be 0 with target_parameters (PEFT), got {lora['dropout']}"
        )
    router = [t for t in lora["target_modules"] + lora["target_parameters"] if ROUTER.search(t)]
    if router and not lora["allow_router"]:
        raise ValueError(
            f"train.lora targets the router ({', '.join(router)}); adapting it destabilises routing. "
            "Set train.lora.allow_router: true to do it anyway"
        )
    return lora


def resolve_targets(model_dir: str | Path, lora: Mapping[str, Any]) -> None:
    """Every target must name modules / parameters of the model: checked on a meta-device build, so a typo
    fails in a second instead of after loading a 500B checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    modules = [n for n, _ in model.named_modules()]
    params = [n for n, _ in model.named_parameters()]
    for kind, names, pool in (
        ("target_modules", lora["target_modules"], modules),
        ("target_parameters", lora["target_parameters"], params),
    ):
        for target in names:
            if not any(n == target or n.endswith("." + target) for n in pool):
                raise ValueError(
                    f"train.lora.{kind}: '{target}' matches nothing in {model_dir} "
                    f"(e.g. {', '.join(sorted({n.split('.')[-1] for n in pool})[:12])})"
                )


def lora_config(lora: Mapping[str, Any]):
    from peft import LoraConfig

    return LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=list(lora["target_modules"]) or None,
        target_parameters=list(lora["target_parameters"]) or None,
        task_type="CAUSAL_LM",
    )


def quantization_config(compute_dtype):
    """NF4 with double quantisation, the QLoRA recipe. Storage in the compute dtype lets FSDP2 shard the
    packed 4-bit weights like any other parameter."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_quant_storage=compute_dtype,
    )


def disable_cpu_repacking(model) -> int:
    """Keep bitsandbytes from repacking 4-bit weights for AVX512-BF16 CPUs.

    An eval-mode forward without gradients (a generate, an evaluation) repacks the weight, and every
    later forward goes through ``gemv_4bit``, which has no autograd: LoRA layers behind it silently get
    no gradient (measured: 8 of 12 LoRA tensors None). Returns how many layers were switched.
    """
    import bitsandbytes as bnb

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for m in layers:
        m.support_avx512bf16_for_cpu = False
    return len(layers)


def trainable_breakdown(model) -> dict[str, Any]:
    """Trainable parameters by place (attention / experts / other) and the adapter's memory."""
    counts = {"attention": 0, "experts": 0, "other": 0}
    nbytes = total = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if not p.requires_grad:
            continue
        place = "experts" if ".experts" in name else "attention" if "self_attn" in name else "other"
        counts[place] += p.numel()
        nbytes += p.numel() * p.element_size()
    return {
        "trainable": counts,
        "trainable_total": sum(counts.values()),
        "parameters_total": total,
        "adapter_bytes": nbytes,
    }
