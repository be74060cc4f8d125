"""LoRA and QLoRA on attention projections and on fused MoE experts (PEFT ``target_parameters``).
The config refuses the router (``mlp.gate``) unless told otherwise (adapting it destabilises
routing); here the targets are checked against the model before it is loaded.

QLoRA loads the base in bitsandbytes NF4 (double quantisation). bitsandbytes quantises
``nn.Linear`` layers only, so fused expert parameters stay in the compute dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Lora


def resolve_targets(model_dir: str | Path, lora: Lora) -> None:
    """Every target must name modules / parameters of the model: checked on a meta-device build, so
    a typo fails in a second instead of after loading a 500B checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    modules = [n for n, _ in model.named_modules()]
    params = [n for n, _ in model.named_parameters()]
    for kind, names, pool in (
        ("target_modules", lora.target_modules, modules),
        ("target_parameters", lora.target_parameters, params),
    ):
        for target in names:
            if not any(n == target or n.endswith("." + target) for n in pool):
                raise ValueError(
                    f"train.lora.{kind}: '{target}' matches nothing in {model_dir} "
                    f"(e.g. {', '.join(sorted({n.split('.')[-1] for n in pool})[:12])})"
                )


def lora_config(lora: Lora):
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules) or None,
        target_parameters=list(lora.target_parameters) or None,
        task_type="CAUSAL_LM",
    )


def quantization_config(compute_dtype):
    """NF4 with double quantisation, the QLoRA recipe. Storage in the compute dtype lets FSDP2 shard
    the packed 4-bit weights like any other parameter."""
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
    later forward goes through ``gemv_4bit``, which has no autograd: LoRA layers behind it silently
    get no gradient (measured: 8 of 12 LoRA tensors None). Returns how many layers were switched.
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
