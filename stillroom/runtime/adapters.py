"""LoRA and QLoRA on attention projections and on fused MoE experts (PEFT ``target_parameters``).

No adapter touches a MoE router (config/routers.py: the router, and the shared expert's gate)
unless ``lora.allow_router`` says so (adapting it destabilises routing), whatever spelling reaches
it: the config refuses router spellings (``mlp.gate``, ``gate.weight``, ``router``,
``shared_expert_gate``), ``resolve_targets`` refuses every target that PEFT would resolve to
a router module or parameter on the model itself, and ``check_saved_adapter`` refuses a saved
adapter holding a router tensor.

QLoRA loads the base in bitsandbytes NF4 (double quantisation). bitsandbytes quantises
``nn.Linear`` layers only, so fused expert parameters stay in the compute dtype.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from ..config import Lora
from ..config.routers import ROUTER_CLASS, ROUTER_NAMES, router_role

_MOE_CLASS = re.compile(r"moe|sparse|expert", re.IGNORECASE)
_PEFT_PREFIX = "base_model.model."


def meta_model(model: str | Path | Any):
    """The model of a directory (or of a transformers config) built on the meta device: names and
    classes, no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model) if isinstance(model, str | Path) else model
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def routers(model) -> dict[str, str]:
    """The router modules of ``model`` by name, each with its class name: by class (Qwen3-MoE's
    Qwen3MoeTopKRouter, others' *Router), or by name in an MoE block (older transformers' nn.Linear
    mlp.gate, Qwen2-MoE's shared_expert_gate, beside the experts). A router's own submodules count
    as the router."""
    modules = dict(model.named_modules())
    found: dict[str, str] = {}
    for name, module in modules.items():
        parent_name, _, leaf = name.rpartition(".")
        parent = modules.get(parent_name) if name else None
        cls = type(module).__name__
        if ROUTER_CLASS.search(cls) or (
            leaf in ROUTER_NAMES
            and parent is not None
            and (hasattr(parent, "experts") or _MOE_CLASS.search(type(parent).__name__))
        ):
            found[name] = cls
    return found


def _router_of(name: str, found: dict[str, str]) -> str | None:
    """The router that module or parameter ``name`` belongs to, if any."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:i])) in found:
            return prefix
    return None


def _suffix_match(target: str, name: str) -> bool:
    # PEFT's rule for a list of target names (target_modules and target_parameters alike)
    return name == target or name.endswith("." + target)


def _examples(names: list[str]) -> str:
    """Targets that would match ``names``, to show when one matched nothing: each name's last two
    components, stopping at a layer or expert index (self_attn.q_proj, experts.gate_up_proj,
    input_layernorm), so each is a suffix PEFT matches and never an index or an empty name."""
    out = set()
    for name in names:
        tail: list[str] = []
        for part in reversed(name.split(".")):
            if not part or part.isdigit() or len(tail) == 2:
                break
            tail.insert(0, part)
        out.add(".".join(tail))
    return ", ".join(sorted(out - {""}))


def resolve_targets(
    model_dir: str | Path | Any, lora: Lora, name: str | None = None
) -> dict[str, list[str]]:
    """Every target must name modules / parameters of the model, and none may reach a router
    unless ``lora.allow_router``: checked on a meta-device build, matching as PEFT matches, so a
    typo or a router fails in a second instead of after loading a 500B checkpoint. Returns each
    target's matches. ``model_dir`` may be a transformers config, then ``name`` says whose."""
    model = meta_model(model_dir)
    found = routers(model)
    modules = [n for n, _ in model.named_modules()]
    # PEFT looks for target_parameters among each module's own parameters
    params = [
        f"{m}.{p}" if m else p
        for m, module in model.named_modules()
        for p, _ in module.named_parameters(recurse=False)
    ]
    # the modules that hold weights of their own: those a target module can adapt
    owners = [p.rpartition(".")[0] for p in params]
    matches: dict[str, list[str]] = {}
    problems = []
    for kind, names, pool, shown in (
        ("target_modules", lora.target_modules, modules, owners),
        ("target_parameters", lora.target_parameters, params, params),
    ):
        for target in names:
            hits = [n for n in pool if _suffix_match(target, n)]
            if not hits:
                # PEFT would silently rewrite a transformers-4 per-expert name into LoRA on the
                # fused experts at twice the rank; here it is refused with the spelling to use
                per_expert = target.split(".")[-1] in ("gate_proj", "up_proj", "down_proj")
                fused = per_expert and any(n.endswith(".experts.gate_up_proj") for n in params)
                hint = (
                    "; this model's experts are fused: name them in target_parameters "
                    "(mlp.experts.gate_up_proj, mlp.experts.down_proj)"
                    if fused
                    else ""
                )
                raise ValueError(
                    f"train.lora.{kind}: '{target}' matches nothing in {name or model_dir} "
                    f"(its {kind.removeprefix('target_')}: {_examples(shown)}){hint}"
                )
            matches[target] = hits
            reached = [(n, r) for n in hits if (r := _router_of(n, found))]
            if reached and not lora.allow_router:
                name, router = reached[0]
                more = f", and {len(reached) - 1} more like it" if len(reached) > 1 else ""
                problems.append(
                    f"train.lora.{kind}: '{target}' reaches {name} of "
                    f"{router_role(router) or 'the router'} {router} ({found[router]}){more}; "
                    "adapting it destabilises routing. Set "
                    "train.lora.allow_router: true to do it anyway"
                )
    if problems:
        raise ValueError("\n".join(problems))
    return matches


def check_saved_adapter(adapter_dir: str | Path, model_dir: str | Path, lora: Lora) -> None:
    """A saved adapter holds no router tensor unless ``lora.allow_router``: read from the file's
    tensor names against the routers of the model, not trusting the checks made before training."""
    from safetensors import safe_open

    if lora.allow_router:
        return
    found = routers(meta_model(model_dir))
    with safe_open(Path(adapter_dir) / "adapter_model.safetensors", framework="pt") as fh:
        names = list(fh.keys())
    bad = [n for n in names if _router_of(n.removeprefix(_PEFT_PREFIX), found)]
    if bad:
        raise ValueError(
            f"{adapter_dir}: the adapter holds router tensors ({', '.join(bad[:4])}"
            f"{' ...' if len(bad) > 4 else ''}) though train.lora.allow_router is false"
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


def four_bit_types() -> tuple[type, ...]:
    """The 4-bit weight classes (bitsandbytes' ``Params4bit``, torchao's ``NF4Tensor``) of the
    libraries this process has imported: one not imported holds no weight, and importing it costs
    seconds."""
    types: list[type] = []
    if "bitsandbytes" in sys.modules:
        from bitsandbytes.nn import Params4bit

        types.append(Params4bit)
    if "torchao" in sys.modules:
        from torchao.quantization import NF4Tensor

        types.append(NF4Tensor)
    return tuple(types)


def trainable_breakdown(model) -> dict[str, Any]:
    """Trainable parameters by place (attention / experts / other), the adapter's memory, and the
    frozen weights stored in 4 bits by place (what QLoRA quantised; an FSDP2 shard by its local
    tensor)."""
    from torch.distributed.tensor import DTensor

    counts = {"attention": 0, "experts": 0, "other": 0}
    four_bit = dict.fromkeys(counts, 0)
    quantized = four_bit_types()
    nbytes = total = 0
    for name, p in model.named_parameters():
        total += p.numel()
        place = "experts" if ".experts" in name else "attention" if "self_attn" in name else "other"
        local = p.to_local() if isinstance(p, DTensor) else p
        four_bit[place] += bool(quantized) and isinstance(local, quantized)
        if not p.requires_grad:
            continue
        counts[place] += p.numel()
        nbytes += p.numel() * p.element_size()
    return {
        "trainable": counts,
        "trainable_total": sum(counts.values()),
        "parameters_total": total,
        "adapter_bytes": nbytes,
        "four_bit_weights": four_bit,
    }


def gather_adapter(model) -> dict:
    """The LoRA tensors of an FSDP2-sharded PEFT model, whole, on CPU; every rank must call it. Only
    the adapter crosses the network: gathering the base too would be the full model in one
    process."""
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
        for name, p in model.named_parameters()
        if "lora_" in name
    }
