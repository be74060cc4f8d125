"""QLoRA with the base in torchao NF4, fused MoE experts included, shardable by FSDP2.

bitsandbytes quantises ``nn.Linear`` only (fused 3-D experts stay in the compute dtype) and its
``Params4bit`` loses its quant_state when FSDP2 shards it. torchao's ``NF4Tensor`` is a 2-D tensor
subclass with FSDP2 all-gather hooks, so here:

- ``quantize_nf4``: every ``nn.Linear`` of the decoder layers (attention, dense MLP) becomes an
  ``NF4Linear`` and every transformers-5 fused experts module (``gate_up_proj`` (E, 2I, H) and
  ``down_proj`` (E, H, I)) an ``NF4Experts`` holding one NF4 tensor per expert and projection.
  Routers (``gate``, ``router``), embeddings, norms and the LM head keep their weights.
- ``nf4_lora``: PEFT's own LoRA wraps the ``NF4Linear`` layers (they are ``nn.Linear``); PEFT's
  ``ParamWrapper`` would add its delta to the whole 3-D weight, which an NF4 tensor cannot take,
  so the experts get ``ExpertsLora`` wrappers with PEFT's ParamWrapper names, nesting and tensor
  layout. The PEFT model's own ``save_pretrained`` then writes an adapter that
  ``PeftModel.from_pretrained`` loads onto the unquantised model.
- ``fully_shard_layers``: FSDP2 per decoder layer, then the root.

The experts' forward dequantises one expert at a time, only the experts the batch routes to, so
beyond the NF4 weights it holds one expert's weights in the compute dtype.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from torchao.quantization import NF4Tensor
from torchao.quantization import to_nf4 as _quantize

# torchao's (and torchtune's) defaults: 64 weights share an absmax scale; the scales are
# quantised again (double quantisation) in blocks of up to 256.
BLOCK_SIZE = 64
SCALER_BLOCK_SIZE = 256
# The weights are quantised so that FSDP2 can split them over any world size dividing this (8
# GPUs of a node and its divisors): the same quantised values on every layout.
SHARDS = 8
# Never quantised nor adapted here: MoE routers (the config refuses adapting them too).
ROUTER_NAMES = ("gate", "router", "shared_expert_gate")
EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")


def to_nf4(weight: torch.Tensor, *, shards: int = SHARDS, where: str = "weight"):
    """``weight`` (2-D) as an NF4Tensor that FSDP2 can shard ``shards`` ways (or any divisor).

    FSDP2 splits a tensor's rows and torchao splits the packed data, the block scales and the
    scales' own factors alike, so each of them must divide by the shard count: the scale block
    is the largest divisor of the block count up to 256 that leaves a multiple of ``shards``
    scale blocks (256 on real model sizes; smaller on tiny test models)."""
    rows = weight.shape[0]
    blocks, rest = divmod(weight.numel(), BLOCK_SIZE)
    if weight.ndim != 2 or rest or rows % shards or blocks % shards:
        raise ValueError(
            f"{where}: a {tuple(weight.shape)} weight cannot be quantised to NF4 in blocks of "
            f"{BLOCK_SIZE} and sharded {shards} ways (it must be 2-D, its size a multiple of "
            f"{BLOCK_SIZE}, its rows and blocks multiples of {shards})"
        )
    scaler = max(
        s
        for s in range(1, min(SCALER_BLOCK_SIZE, blocks) + 1)
        if blocks % s == 0 and (blocks // s) % shards == 0
    )
    # NF4Tensor keeps its source's storage offset, which FSDP2's unsharded view must equal: a
    # fused expert's slice (offset e * numel) is quantised from a copy of its own
    weight = weight.detach()
    if weight.storage_offset() or not weight.is_contiguous():
        weight = weight.clone(memory_format=torch.contiguous_format)
    return _quantize(weight, BLOCK_SIZE, scaler)


def _frozen(tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


class NF4Linear(nn.Linear):
    """An ``nn.Linear`` whose frozen weight is an NF4Tensor: ``F.linear`` on it is torchao's
    ``linear_nf4``, which dequantises it and has autograd to the input only (the weight is
    dequantised again for the backward, never kept). Being an ``nn.Linear``, PEFT's LoRA wraps it
    as it wraps any linear layer."""

    def __init__(self, linear: nn.Linear, *, shards: int = SHARDS, where: str = "linear"):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = _frozen(to_nf4(linear.weight, shards=shards, where=where))
        if linear.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = _frozen(linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        return out if self.bias is None else out + self.bias.to(out.dtype)


def is_fused_experts(module: nn.Module) -> bool:
    """A transformers-5 fused experts module: 3-D ``gate_up_proj`` and ``down_proj``."""
    return all(
        isinstance(getattr(module, name, None), nn.Parameter) and getattr(module, name).ndim == 3
        for name in EXPERT_PARAMETERS
    )


class NF4Experts(nn.Module):
    """Fused experts with each expert's ``gate_up_proj`` (2I, H) and ``down_proj`` (H, I) its own
    NF4 tensor. The forward is transformers' (Qwen3-MoE) loop over the experts the batch routes
    to, each dequantised on its own, with the LoRA terms its ``ExpertsLora`` wrappers pass in."""

    def __init__(self, experts: nn.Module, *, shards: int = SHARDS, where: str = "experts"):
        super().__init__()
        layout = {
            "is_transposed": False,
            "has_bias": False,
            "has_gate": True,
            "is_concatenated": True,
            "has_post_expert_norm": False,
        }
        odd = {k: getattr(experts, k) for k, v in layout.items() if getattr(experts, k, v) != v}
        if odd:
            raise NotImplementedError(
                f"{where}: {type(experts).__name__} has {odd}; NF4 experts support the "
                f"Qwen3-MoE layout ({layout})"
            )
        self.num_experts = experts.num_experts
        self.act_fn = experts.act_fn
        # (out, in) of one expert's matrix, per fused parameter
        self.expert_shape = {
            name: tuple(getattr(experts, name).shape[1:]) for name in EXPERT_PARAMETERS
        }
        for name in EXPERT_PARAMETERS:
            fused = getattr(experts, name)
            setattr(
                self,
                f"{name}_nf4",
                nn.ParameterList(
                    _frozen(to_nf4(fused[e], shards=shards, where=f"{where}.{name}[{e}]"))
                    for e in range(self.num_experts)
                ),
            )

    def _project(self, x, name: str, expert: int, lora: dict) -> torch.Tensor:
        y = F.linear(x, getattr(self, f"{name}_nf4")[expert])
        if name in lora:
            # PEFT's ParamWrapper layout: lora_A (E*r, in) holds expert e's rows e*r..(e+1)*r;
            # lora_B (out, r*E) holds its columns at e, e+E, ... (delta_e = B_e @ A_e * scaling)
            a, b, scaling = lora[name]
            r = a.shape[0] // self.num_experts
            a_e = a[expert * r : (expert + 1) * r]
            b_e = b.view(b.shape[0], r, self.num_experts)[:, :, expert]
            y = y + (F.linear(F.linear(x.to(a.dtype), a_e), b_e) * scaling).to(y.dtype)
        return y

    def forward(self, hidden_states, top_k_index, top_k_weights, lora: dict | None = None):
        lora = lora or {}
        out = torch.zeros_like(hidden_states)
        with torch.no_grad():
            hit = torch.bincount(top_k_index.flatten(), minlength=self.num_experts)
            hit = hit[: self.num_experts].nonzero().flatten().tolist()
        for expert in hit:
            token, slot = torch.where(top_k_index == expert)
            x = hidden_states[token]
            gate, up = self._project(x, "gate_up_proj", expert, lora).chunk(2, dim=-1)
            y = self._project(self.act_fn(gate) * up, "down_proj", expert, lora)
            out.index_add_(0, token, (y * top_k_weights[token, slot, None]).to(out.dtype))
        return out


class ExpertsLora(nn.Module, BaseTunerLayer):
    """LoRA on one fused expert parameter of an ``NF4Experts``, laid out and named as PEFT's
    ``ParamWrapper``: ``lora_A[adapter]`` (r*E, in), ``lora_B[adapter]`` (out, r*E), the wrapped
    module as ``base_layer`` (another one of these when both parameters are adapted). A PEFT tuner
    layer, because PEFT finds what to save, freeze or disable by visiting those."""

    adapter_layer_names = ("lora_A", "lora_B")

    def __init__(
        self,
        base_layer: nn.Module,
        parameter_name: str,
        *,
        r: int,
        alpha: float,
        use_rslora: bool = False,
        adapter: str = "default",
    ):
        super().__init__()
        self.base_layer = base_layer
        self.parameter_name = parameter_name
        self._active_adapter = adapter
        self.merged_adapters = []
        experts = self.get_base_layer()
        out_features, in_features = experts.expert_shape[parameter_name]
        rank = r * experts.num_experts
        self.lora_A = nn.ModuleDict({adapter: nn.Linear(in_features, rank, bias=False)})
        self.lora_B = nn.ModuleDict({adapter: nn.Linear(rank, out_features, bias=False)})
        # PEFT's default init: B = 0, so the adapted model starts as the base
        nn.init.kaiming_uniform_(self.lora_A[adapter].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B[adapter].weight)
        self.scaling = {adapter: alpha / (math.sqrt(r) if use_rslora else r)}

    def merge(self, safe_merge: bool = False, adapter_names=None) -> None:
        raise NotImplementedError(
            "merging LoRA into NF4 experts is not offered (it would be re-quantised away): "
            "merge the saved adapter into the full-precision checkpoint"
        )

    def unmerge(self) -> None:
        self.merge()

    def forward(self, hidden_states, top_k_index, top_k_weights, lora: dict | None = None):
        lora = dict(lora or {})
        adapter = self._active_adapter
        adapter = adapter[0] if isinstance(adapter, list) else adapter
        if not self.disable_adapters and adapter in self.lora_A:
            lora[self.parameter_name] = (
                self.lora_A[adapter].weight,
                self.lora_B[adapter].weight,
                self.scaling[adapter],
            )
        return self.base_layer(hidden_states, top_k_index, top_k_weights, lora=lora)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM (or of the PEFT model around it)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else inner
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"{type(model).__name__}: no decoder layers (model.model.layers) to quantise or shard"
        )
    return layers


def _set(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


@torch.no_grad()
def quantize_nf4(
    model: nn.Module, *, shards: int = SHARDS, skip: Iterable[str] = ROUTER_NAMES
) -> dict[str, int]:
    """Quantise ``model``'s decoder layers to NF4 in place: linear layers and fused experts, never
    a module (or one inside a module) named in ``skip``, nor anything outside the decoder layers
    (embeddings, final norm, LM head). Returns how many linear and experts modules it replaced."""
    skip = set(skip)
    counts = {"linear": 0, "experts": 0}
    for index, layer in enumerate(decoder_layers(model)):
        for name, module in list(layer.named_modules()):
            where = f"model.layers.{index}.{name}"
            if not name or skip & set(name.split(".")):
                continue
            if is_fused_experts(module):
                _set(layer, name, NF4Experts(module, shards=shards, where=where))
                counts["experts"] += 1
            elif type(module) is nn.Linear:
                _set(layer, name, NF4Linear(module, shards=shards, where=where))
                counts["linear"] += 1
    return counts


def _expert_targets(model: nn.Module, targets: Iterable[str]) -> dict[str, list[str]]:
    """NF4 experts module name -> the fused parameters ``targets`` adapt there, in the order PEFT
    nests its ParamWrappers (the module's registration order, the first one innermost)."""
    found: dict[str, list[str]] = {}
    names = {
        f"{module_name}.{param}": (module_name, param)
        for module_name, module in model.named_modules()
        if isinstance(module, NF4Experts)
        for param in EXPERT_PARAMETERS
    }
    for target in targets:
        hits = [v for k, v in names.items() if k == target or k.endswith("." + target)]
        if not hits:
            raise ValueError(
                f"lora target_parameters: '{target}' names no NF4 fused expert parameter "
                f"(quantize_nf4 the model first; the experts' parameters are "
                f"{', '.join(EXPERT_PARAMETERS)})"
            )
        for module_name, param in hits:
            found.setdefault(module_name, [])
            if param not in found[module_name]:
                found[module_name].append(param)
    return {m: [p for p in EXPERT_PARAMETERS if p in ps] for m, ps in found.items()}


def nf4_lora(model: nn.Module, config, adapter: str = "default"):
    """A PEFT model with LoRA on ``model`` (quantised by ``quantize_nf4``) as ``config`` (a peft
    ``LoraConfig``) says: ``target_modules`` by PEFT itself, fused experts' ``target_parameters``
    by ``ExpertsLora``. Its ``peft_config`` is what ``get_peft_model`` would keep for ``config``
    on the unquantised model, so ``save_pretrained`` writes PEFT's adapter for it. LoRA weights
    are float32 whatever the base's dtype (a bf16 master copy would lose small updates)."""
    from peft import get_peft_model
    from peft.utils.constants import DUMMY_TARGET_MODULES
    from peft.utils.other import get_pattern_key
    from peft.utils.transformers_weight_conversion import (
        convert_peft_config_for_transformers,
        get_model_conversion_mapping,
    )

    # get_peft_model first rewrites a config naming transformers-4 per-expert modules into
    # target_parameters of the fused ones (with rank / alpha patterns); so do we
    config = copy.deepcopy(config)
    convert_peft_config_for_transformers(config, model, get_model_conversion_mapping(model))
    experts_targets = sorted(config.target_parameters or [])
    if experts_targets:
        refused = {
            "lora_dropout": config.lora_dropout,
            "use_dora": config.use_dora,
            "lora_bias": config.lora_bias,
            "fan_in_fan_out": config.fan_in_fan_out,
            "init_lora_weights": config.init_lora_weights is not True,
        }
        refused = {k: getattr(config, k) for k, v in refused.items() if v}
        if refused:
            raise ValueError(
                f"lora target_parameters: LoRA on NF4 fused experts works without {refused} "
                "(as PEFT's ParamWrapper, which loads the adapter, and with PEFT's default init)"
            )
    by_module = _expert_targets(model, experts_targets)
    modules_only = copy.deepcopy(config)
    modules_only.target_parameters = None
    if not modules_only.target_modules:
        modules_only.target_modules = DUMMY_TARGET_MODULES
    peft_model = get_peft_model(model, modules_only, adapter_name=adapter)
    peft_model.peft_config[adapter] = config
    inner = peft_model.get_base_model()
    for module_name, params in by_module.items():
        wrapped = inner.get_submodule(module_name)
        for param in params:
            key = f"{module_name}.{param}"
            r_key = get_pattern_key(config.rank_pattern.keys(), key)
            alpha_key = get_pattern_key(config.alpha_pattern.keys(), key)
            wrapped = ExpertsLora(
                wrapped,
                param,
                r=config.rank_pattern.get(r_key, config.r),
                alpha=config.alpha_pattern.get(alpha_key, config.lora_alpha),
                use_rslora=config.use_rslora,
                adapter=adapter,
            )
        _set(inner, module_name, wrapped)
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    return peft_model


def _check_shardable(model: nn.Module, size: int) -> None:
    for name, p in model.named_parameters():
        if isinstance(p, NF4Tensor) and any(
            n % size
            for n in (p.shape[0], p.quantized_scalers.numel(), p.quantization_factor.numel())
        ):
            raise ValueError(
                f"{name}: an NF4 weight of shape {tuple(p.shape)} with "
                f"{p.quantization_factor.numel()} scale blocks cannot be sharded {size} ways; "
                f"quantize_nf4(shards=) must be a multiple of the FSDP world size"
            )


def fully_shard_layers(model: nn.Module, mesh=None, **kwargs) -> nn.Module:
    """FSDP2 over ``model`` (a quantised PEFT model or any causal LM): each decoder layer its own
    unit, then the root; ``kwargs`` go to ``fully_shard`` (``mp_policy``, ...)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    _check_shardable(model, mesh.size() if mesh is not None else dist.get_world_size())
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def save_adapter(model, out_dir, *, write: bool = True) -> dict[str, torch.Tensor]:
    """Gather the adapter of ``model`` (``nf4_lora``'s, sharded or not; every rank must call) and,
    when ``write`` (rank 0), save it in PEFT's format to ``out_dir``. Returns the gathered LoRA
    tensors under the model's parameter names."""
    from .sft import gather_adapter

    state = gather_adapter(model)
    if write:
        model.save_pretrained(out_dir, state_dict=state)
    return state


def storage_bytes(module: nn.Module) -> int:
    """Bytes held by ``module``'s parameters and buffers (this rank's shards under FSDP2), an NF4
    weight counted by its packed data, scales and lookup table."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in [*module.parameters(), *module.buffers()]:
        local = t.to_local() if isinstance(t, DTensor) else t
        if isinstance(local, NF4Tensor):
            total += sum(getattr(local, a).nbytes for a in local.__tensor_flatten__()[0])
        else:
            total += local.nbytes
    return total
