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
- ``load_staged``: all of the above without ever holding the bf16 model: built on the meta
  device, then read, quantised, adapted and sharded one decoder layer at a time.
- ``save_adapter``: the (gathered) adapter in PEFT's format.

The experts' forward dequantises one expert at a time, only the experts the batch routes to, so
beyond the NF4 weights it holds one expert's weights in the compute dtype.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from torchao.quantization import NF4Tensor
from torchao.quantization import to_nf4 as _quantize
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import SubclassTensorArgs

# Never quantised nor adapted here: MoE routers (the config refuses adapting them too).
from ..config.routers import ROUTER_NAMES
from .saving import save_pretrained

# torchao's (and torchtune's) defaults: 64 weights share an absmax scale; the scales are
# quantised again (double quantisation) in blocks of up to 256.
BLOCK_SIZE = 64
SCALER_BLOCK_SIZE = 256
# The weights are quantised so that FSDP2 can split them over any world size dividing this (8
# GPUs of a node and its divisors): the same quantised values on every layout.
SHARDS = 8
EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")


def to_nf4(weight: torch.Tensor, *, shards: int = SHARDS, where: str = "weight", group=None):
    """``weight`` (2-D) as an NF4Tensor that FSDP2 can shard ``shards`` ways (or any divisor).

    FSDP2 splits a tensor's rows and torchao splits the packed data, the block scales and the
    scales' own factors alike, so each of them must divide by the shard count: the scale block
    is the largest divisor of the block count up to 256 that leaves a multiple of ``shards``
    scale blocks (256 on real model sizes; smaller on tiny test models).

    ``group``: processes that all hold ``weight`` and share the work (``_quantize_shared``): the
    same NF4 tensor, bit for bit, on each, for 1 / their number of the quantisation each."""
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
    if group is None or group.size() == 1:
        return _quantize(weight, BLOCK_SIZE, scaler)
    if blocks % group.size():
        raise ValueError(
            f"{where}: {blocks} blocks of {BLOCK_SIZE} cannot be split over {group.size()} "
            "processes: quantise with shards= a multiple of their number"
        )
    return _quantize_shared(weight, scaler, group)


def _quantize_shared(weight: torch.Tensor, scaler: int, group) -> NF4Tensor:
    """torchao's ``to_nf4(weight, BLOCK_SIZE, scaler)`` computed by the processes of ``group``
    together: each maps its 1 / n of the blocks to NF4 codes (the costly part: every weight
    against 16 levels) and the codes are all-gathered. The blocks' scales and their double
    quantisation (one pass over the weight, and its one figure that spans blocks, the scales'
    mean) are computed whole by each process, so every process holds the tensor quantising the
    whole would give. torchao's own steps, called in turn."""
    import torch.distributed as dist

    flat = weight.view(-1)
    scalers, factors, mean = NF4Tensor.double_quantize_scalers(flat, BLOCK_SIZE, scaler)
    n, rank = group.size(), group.rank()
    piece = flat.numel() // n
    mine = flat[rank * piece : (rank + 1) * piece]
    # torchao's level table, as from_tensor makes it for this dtype and device
    levels = _quantize(weight.new_ones(BLOCK_SIZE), BLOCK_SIZE, 1).nf4
    codes = NF4Tensor.convert_to_norm_float_weight(mine, piece // BLOCK_SIZE, BLOCK_SIZE, levels)
    pieces = [torch.empty_like(codes) for _ in range(n)]
    dist.all_gather(pieces, codes, group=group)
    meta = SubclassTensorArgs(weight.size(), weight.stride(), 0, weight.dtype, weight.device, False)
    blocks = flat.numel() // BLOCK_SIZE
    return NF4Tensor(
        meta, BLOCK_SIZE, blocks, scaler, scalers, factors, mean, torch.cat(pieces), levels
    )


def _frozen(tensor) -> nn.Parameter:
    return nn.Parameter(tensor, requires_grad=False)


class NF4Linear(nn.Linear):
    """An ``nn.Linear`` whose frozen weight is an NF4Tensor: ``F.linear`` on it is torchao's
    ``linear_nf4``, which dequantises it and has autograd to the input only (the weight is
    dequantised again for the backward, never kept). Being an ``nn.Linear``, PEFT's LoRA wraps it
    as it wraps any linear layer."""

    def __init__(
        self, weight, bias=None, *, shards: int = SHARDS, where: str = "linear", group=None
    ):
        nn.Module.__init__(self)
        self.out_features, self.in_features = weight.shape
        self.weight = _frozen(to_nf4(weight, shards=shards, where=where, group=group))
        if bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = _frozen(bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        return out if self.bias is None else out + self.bias.to(out.dtype)


def is_fused_experts(module: nn.Module) -> bool:
    """A transformers-5 fused experts module: 3-D ``gate_up_proj`` and ``down_proj``."""
    return all(
        isinstance(getattr(module, name, None), nn.Parameter) and getattr(module, name).ndim == 3
        for name in EXPERT_PARAMETERS
    )


EXPERTS_LAYOUT = {
    "is_transposed": False,
    "has_bias": False,
    "has_gate": True,
    "is_concatenated": True,
    "has_post_expert_norm": False,
}


def check_experts_layout(experts: nn.Module, where: str) -> None:
    """NF4 experts compute the Qwen3-MoE layout: [gate; up] stacked, (out, in) matrices."""
    odd = {k: getattr(experts, k) for k, v in EXPERTS_LAYOUT.items() if getattr(experts, k, v) != v}
    if odd:
        raise NotImplementedError(
            f"{where}: {type(experts).__name__} has {odd}; NF4 experts support the Qwen3-MoE "
            f"layout ({EXPERTS_LAYOUT})"
        )


class NF4Experts(nn.Module):
    """Fused experts with each expert's ``gate_up_proj`` (2I, H) and ``down_proj`` (H, I) its own
    NF4 tensor. The forward is transformers' (Qwen3-MoE) loop over the experts the batch routes
    to, each dequantised on its own, with the LoRA terms its ``ExpertsLora`` wrappers pass in.

    Under expert parallelism (``group``, set by the staged loader) this process holds only the
    experts ``first`` .. ``first`` + its count of the model's ``num_experts``: each routed row is
    sent to the process holding its expert and its output sent back (all-to-all, differentiable),
    while the LoRA weights stay whole on every process (FSDP2 gathers them with the layer), so
    each expert's LoRA gradient comes from the one process that ran it and FSDP2's reduction
    sums it like any data-parallel gradient."""

    def __init__(
        self,
        gate_up_proj: Iterable[torch.Tensor],
        down_proj: Iterable[torch.Tensor],
        act_fn: nn.Module,
        *,
        shards: int = SHARDS,
        where: str = "experts",
        first: int = 0,
        num_experts: int | None = None,
        group=None,
    ):
        """One (2I, H) ``gate_up_proj`` and one (H, I) ``down_proj`` matrix per expert held here
        (experts ``first``, ``first`` + 1, ...), each quantised as it comes (an iterator holds
        one expert's weights at a time); ``num_experts``: the model's (default: those given);
        ``group``: processes that hold the same experts and share their quantisation
        (``to_nf4``)."""
        super().__init__()
        self.act_fn = act_fn
        for name, matrices in (("gate_up_proj", gate_up_proj), ("down_proj", down_proj)):
            setattr(
                self,
                f"{name}_nf4",
                nn.ParameterList(
                    _frozen(
                        to_nf4(w, shards=shards, where=f"{where}.{name}[{first + e}]", group=group)
                    )
                    for e, w in enumerate(matrices)
                ),
            )
        self.first = first
        self.held = len(self.gate_up_proj_nf4)
        self.num_experts = self.held if num_experts is None else num_experts
        self.group = None  # the expert-parallel process group, when there is one
        # (out, in) of one expert's matrix, per fused parameter
        self.expert_shape = {
            name: tuple(getattr(self, f"{name}_nf4")[0].shape) for name in EXPERT_PARAMETERS
        }

    @classmethod
    def from_fused(cls, experts: nn.Module, *, shards: int = SHARDS, where: str = "experts"):
        """From a transformers fused experts module (``check_experts_layout``)."""
        check_experts_layout(experts, where)
        return cls(
            experts.gate_up_proj.unbind(0),
            experts.down_proj.unbind(0),
            experts.act_fn,
            shards=shards,
            where=where,
        )

    def _project(self, x, name: str, expert: int, lora: dict) -> torch.Tensor:
        y = F.linear(x, getattr(self, f"{name}_nf4")[expert - self.first])
        if name in lora:
            # PEFT's ParamWrapper layout: lora_A (E*r, in) holds expert e's rows e*r..(e+1)*r;
            # lora_B (out, r*E) holds its columns at e, e+E, ... (delta_e = B_e @ A_e * scaling)
            a, b, scaling = lora[name]
            r = a.shape[0] // self.num_experts
            a_e = a[expert * r : (expert + 1) * r]
            b_e = b.view(b.shape[0], r, self.num_experts)[:, :, expert]
            y = y + (F.linear(F.linear(x.to(a.dtype), a_e), b_e) * scaling).to(y.dtype)
        return y

    def _run(self, x: torch.Tensor, expert: torch.Tensor, lora: dict) -> torch.Tensor:
        """Rows ``x`` through their experts ``expert`` (held here, ascending), one expert at a
        time. The output depends on ``x`` and every LoRA weight even when no row came: under
        expert parallelism each process must take part in the backward's collectives."""
        counts = torch.bincount(expert - self.first, minlength=self.held).tolist()
        outs = []
        for index, (rows, n) in enumerate(zip(x.split(counts), counts, strict=True)):
            if n:
                e = self.first + index
                gate, up = self._project(rows, "gate_up_proj", e, lora).chunk(2, dim=-1)
                outs.append(self._project(self.act_fn(gate) * up, "down_proj", e, lora))
        if outs:
            return torch.cat(outs)
        hidden = self.expert_shape["down_proj"][0]
        touch = x.sum() + sum(a.sum() + b.sum() for a, b, _ in lora.values())
        return x.new_zeros(0, hidden) + 0 * touch

    def _dispatched(self, x: torch.Tensor, expert: torch.Tensor, lora: dict) -> torch.Tensor:
        """``_run`` on the processes of the expert-parallel group holding each row's expert: the
        rows (sorted by expert, so by process) go out and their outputs come back in order."""
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        group, held = self.group, self.held
        send = torch.bincount(expert // held, minlength=dist.get_world_size(group))
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        send, recv = send.tolist(), recv.tolist()
        rows = all_to_all_single_autograd(x, recv, send, group)
        experts = expert.new_empty(sum(recv))
        dist.all_to_all_single(experts, expert.contiguous(), recv, send, group=group)
        # rows from each process come sorted by expert; together they are sorted again
        order = torch.argsort(experts, stable=True)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        done = self._run(rows[order], experts[order], lora)[back]
        return all_to_all_single_autograd(done, send, recv, group)

    def forward(self, hidden_states, top_k_index, top_k_weights, lora: dict | None = None):
        lora = lora or {}
        k = top_k_index.shape[1]
        order = torch.argsort(top_k_index.flatten(), stable=True)
        expert = top_k_index.flatten()[order]
        token = order // k
        x = hidden_states[token]
        y = self._run(x, expert, lora) if self.group is None else self._dispatched(x, expert, lora)
        weight = top_k_weights.flatten()[order]
        out = torch.zeros_like(hidden_states)
        return out.index_add_(0, token, (y * weight[:, None]).to(out.dtype))


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
        self.scaling = {adapter: alpha / (math.sqrt(r) if use_rslora else r)}
        self.reset_lora_parameters(adapter)

    @torch.no_grad()
    def reset_lora_parameters(self, adapter: str, init_lora_weights: bool = True) -> None:
        """PEFT's default init: B = 0, so the adapted model starts as the base."""
        nn.init.kaiming_uniform_(self.lora_A[adapter].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B[adapter].weight)

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
                _set(layer, name, NF4Experts.from_fused(module, shards=shards, where=where))
                counts["experts"] += 1
            elif type(module) is nn.Linear:
                _set(
                    layer,
                    name,
                    NF4Linear(module.weight, module.bias, shards=shards, where=where),
                )
                counts["linear"] += 1
    return counts


def _lora_plan(model: nn.Module, config, kind) -> tuple[object, dict[str, list[tuple]]]:
    """``config`` as ``get_peft_model`` would keep it for ``model``, and the fused experts LoRA it
    asks for: experts module name -> [(parameter, r, alpha)] in the order PEFT nests its
    ParamWrappers (the module's registration order, the first one innermost). ``kind`` tells the
    experts modules (``NF4Experts``, or fused ones on the meta device for the staged loader)."""
    from peft.utils.other import get_pattern_key
    from peft.utils.transformers_weight_conversion import (
        convert_peft_config_for_transformers,
        get_model_conversion_mapping,
    )

    # get_peft_model first rewrites a config naming transformers-4 per-expert modules into
    # target_parameters of the fused ones (with rank / alpha patterns); so do we
    config = copy.deepcopy(config)
    convert_peft_config_for_transformers(config, model, get_model_conversion_mapping(model))
    refused = {
        "use_dora": config.use_dora,  # its weight norm would need the dequantised base
        "lora_bias": config.lora_bias,
    }
    if config.target_parameters:  # as PEFT's ParamWrapper, which loads the adapter
        refused |= {
            "lora_dropout": config.lora_dropout,
            "fan_in_fan_out": config.fan_in_fan_out,
            "init_lora_weights": config.init_lora_weights is not True,
        }
    refused = {k: getattr(config, k) for k, v in refused.items() if v}
    if refused:
        raise ValueError(f"lora: LoRA on an NF4 base works without {refused}")
    names = {
        f"{module_name}.{param}": (module_name, param)
        for module_name, module in model.named_modules()
        if kind(module)
        for param in EXPERT_PARAMETERS
    }
    found: dict[str, set[str]] = {}
    for target in sorted(config.target_parameters or []):
        hits = [v for k, v in names.items() if k == target or k.endswith("." + target)]
        if not hits:
            raise ValueError(
                f"lora target_parameters: '{target}' names no fused expert parameter of the NF4 "
                f"model (its experts' parameters: {', '.join(EXPERT_PARAMETERS)})"
            )
        for module_name, param in hits:
            found.setdefault(module_name, set()).add(param)
    plan = {}
    for module_name, params in found.items():
        plan[module_name] = []
        for param in (p for p in EXPERT_PARAMETERS if p in params):
            key = f"{module_name}.{param}"
            r_key = get_pattern_key(config.rank_pattern.keys(), key)
            alpha_key = get_pattern_key(config.alpha_pattern.keys(), key)
            plan[module_name].append(
                (
                    param,
                    config.rank_pattern.get(r_key, config.r),
                    config.alpha_pattern.get(alpha_key, config.lora_alpha),
                )
            )
    return config, plan


def _peft_linears(model: nn.Module, config, adapter: str, *, empty: bool = False):
    """PEFT's own LoRA on ``config.target_modules`` (an empty frame on the meta device when
    ``empty``); the PEFT model keeps ``config`` whole, experts targets included."""
    from peft import get_peft_model
    from peft.utils.constants import DUMMY_TARGET_MODULES

    modules_only = copy.deepcopy(config)
    modules_only.target_parameters = None
    if not modules_only.target_modules:
        modules_only.target_modules = DUMMY_TARGET_MODULES
    peft_model = get_peft_model(model, modules_only, adapter_name=adapter, low_cpu_mem_usage=empty)
    peft_model.peft_config[adapter] = config
    return peft_model


def _wrap_experts(root: nn.Module, plan: dict, config, adapter: str) -> None:
    for module_name, params in plan.items():
        wrapped = root.get_submodule(module_name)
        for param, r, alpha in params:
            wrapped = ExpertsLora(
                wrapped, param, r=r, alpha=alpha, use_rslora=config.use_rslora, adapter=adapter
            )
        _set(root, module_name, wrapped)


def _init_lora(layer: nn.Module, seed: int, config, adapter: str) -> None:
    """(Re)initialise the LoRA weights of one decoder layer from ``seed`` alone, in float32: every
    loading path and every rank starts from the same adapter."""
    from peft.tuners.lora import LoraLayer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for module in layer.modules():
            if isinstance(module, (LoraLayer, ExpertsLora)) and adapter in module.lora_A:
                for name in ("lora_A", "lora_B"):
                    factor = getattr(module, name)[adapter]
                    if factor.weight.is_meta:
                        factor.to_empty(device="cpu")
                    factor.float()
                module.reset_lora_parameters(adapter, config.init_lora_weights)


def nf4_lora(model: nn.Module, config, adapter: str = "default", seed: int = 0):
    """A PEFT model with LoRA on ``model`` (quantised by ``quantize_nf4``) as ``config`` (a peft
    ``LoraConfig``) says: ``target_modules`` by PEFT itself, fused experts' ``target_parameters``
    by ``ExpertsLora``. Its ``peft_config`` is what ``get_peft_model`` would keep for ``config``
    on the unquantised model, so ``save_pretrained`` writes PEFT's adapter for it. LoRA weights
    are float32 whatever the base's dtype (a bf16 master copy would lose small updates), each
    decoder layer's drawn from ``seed`` + its index."""
    config, plan = _lora_plan(model, config, lambda m: isinstance(m, NF4Experts))
    peft_model = _peft_linears(model, config, adapter)
    _wrap_experts(peft_model.get_base_model(), plan, config, adapter)
    for index, layer in enumerate(decoder_layers(peft_model)):
        _init_lora(layer, seed + index, config, adapter)
    return peft_model


def _check_shardable(model: nn.Module, size: int) -> None:
    for name, p in model.named_parameters():
        if isinstance(p, NF4Tensor) and any(
            n % size
            for n in (p.shape[0], p.quantized_scalers.numel(), p.quantization_factor.numel())
        ):
            raise ValueError(
                f"{name}: an NF4 weight of shape {tuple(p.shape)} with "
                f"{p.quantization_factor.numel()} scale blocks cannot be sharded {size} ways: "
                f"quantise with shards= a multiple of {size} (quantize_nf4, load_staged)"
            )


def _shard_count(mesh) -> int:
    """How many ways FSDP2 splits each parameter: the mesh's last dimension (HSDP replicates over
    the first), or every process of the default group."""
    import torch.distributed as dist

    if mesh is not None:
        return mesh.shape[-1]
    return dist.get_world_size() if dist.is_initialized() else 1


def fully_shard_layers(model: nn.Module, mesh=None, **kwargs) -> nn.Module:
    """FSDP2 over ``model`` (a quantised PEFT model or any causal LM): each decoder layer its own
    unit, then the root; ``kwargs`` go to ``fully_shard`` (``mp_policy``, ...)."""
    from torch.distributed.fsdp import fully_shard

    _check_shardable(model, _shard_count(mesh))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


class _Checkpoint:
    """A safetensors checkpoint's tensors by name, in ``dtype`` on ``device``: each file
    memory-mapped from its first read until ``close``."""

    def __init__(self, model_dir: Path, dtype: torch.dtype, device: str | torch.device = "cpu"):
        from .merge import shard_map

        self.dir, self.dtype, self.device = model_dir, dtype, device
        self.files = shard_map(model_dir)
        self.handles: dict[str, object] = {}

    def __contains__(self, key: str) -> bool:
        return key in self.files

    def __call__(self, key: str, index: int | None = None) -> torch.Tensor:
        """Tensor ``key`` (only its ``index``-th row of the first dimension when given)."""
        from safetensors import safe_open

        if key not in self.files:
            raise ValueError(f"{self.dir}: the checkpoint has no tensor '{key}'")
        # what the previous tensor's quantisation freed
        _release_freed_memory()
        name = self.files[key]
        if name not in self.handles:
            self.handles[name] = safe_open(self.dir / name, framework="pt")
        handle = self.handles[name]
        tensor = handle.get_tensor(key) if index is None else handle.get_slice(key)[index]
        return tensor.to(self.device, self.dtype)

    def close(self) -> None:
        self.handles.clear()


def _release_freed_memory() -> None:
    """Return the C heap's freed pages to the system. glibc keeps them for reuse, and each
    matrix's quantisation temporaries (~80 MiB for a 1536 x 1024 expert) fragment the heap: with
    no trim the loader's resident memory on 2 ranks reached 1.2 GiB at 8 layers of 114 MiB, and
    1.7 GiB at 16; trimmed before each read, its shards plus ~120 MiB."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _unwrapped(name: str) -> str:
    """A module's name in the checkpoint: without PEFT's ``base_layer`` levels."""
    return name.replace(".base_layer", "")


def _read_experts(
    read: _Checkpoint,
    key: str,
    meta: nn.Module,
    shards: int,
    part: tuple[int, int] = (0, 1),
    group=None,
) -> NF4Experts:
    """The NF4 experts of ``key`` from the checkpoint, one expert at a time: saved per expert
    (``experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj``, transformers' files) or fused
    (``experts.gate_up_proj`` / ``down_proj``). ``part``: (index, count) of an expert-parallel
    group, whose ``index``-th process reads only its ``1 / count`` of the experts; ``group``:
    processes sharing the quantisation of the same experts (``to_nf4``)."""
    check_experts_layout(meta, key)
    count = meta.num_experts
    index, parts = part
    if count % parts:
        raise ValueError(
            f"{key}: {count} experts cannot be split over {parts} expert-parallel processes"
        )
    held = range(index * count // parts, (index + 1) * count // parts)
    if f"{key}.0.gate_proj.weight" in read:
        gate_up = (
            torch.cat([read(f"{key}.{e}.gate_proj.weight"), read(f"{key}.{e}.up_proj.weight")])
            for e in held
        )
        down = (read(f"{key}.{e}.down_proj.weight") for e in held)
    else:
        gate_up = (read(f"{key}.gate_up_proj", e) for e in held)
        down = (read(f"{key}.down_proj", e) for e in held)
    experts = NF4Experts(
        gate_up,
        down,
        meta.act_fn,
        shards=shards,
        where=key,
        first=held.start,
        num_experts=count,
        group=group,
    )
    want = {name: tuple(getattr(meta, name).shape[1:]) for name in EXPERT_PARAMETERS}
    if experts.held != len(held) or experts.expert_shape != want:
        raise ValueError(
            f"{key}: the checkpoint holds {experts.held} experts of {experts.expert_shape}"
            f" but the config describes {len(held)} of {want}"
        )
    return experts


def _read_rest(root: nn.Module, prefix: str, read: _Checkpoint) -> None:
    """Every parameter of ``root`` still on the meta device (norms, routers, embeddings, LM head),
    read as it is and frozen; LoRA weights are drawn, not read."""
    for name, p in list(root.named_parameters()):
        if p.is_meta and "lora_" not in name:
            _set(root, name, _frozen(read(prefix + _unwrapped(name))))


@torch.no_grad()
def _read_layer(
    layer,
    prefix: str,
    read: _Checkpoint,
    shards: int,
    skip: set,
    part: tuple[int, int] = (0, 1),
    group=None,
) -> dict[str, int]:
    """Quantise ``layer``'s linear layers and experts from the checkpoint (``group`` sharing the
    work, ``to_nf4``; expert-parallel processes hold different experts, each its own) and read
    the rest; how many linear and experts modules."""
    counts = {"linear": 0, "experts": 0}
    for name, module in list(layer.named_modules()):
        parts = set(name.split("."))
        if not name or skip & parts or any(p.startswith("lora_") for p in parts):
            continue
        key = prefix + _unwrapped(name)
        if is_fused_experts(module):
            shared = group if part[1] == 1 else None
            _set(layer, name, _read_experts(read, key, module, shards, part, shared))
            counts["experts"] += 1
        elif type(module) is nn.Linear:
            bias = read(f"{key}.bias") if module.bias is not None else None
            weight = read(f"{key}.weight")
            _set(layer, name, NF4Linear(weight, bias, shards=shards, where=key, group=group))
            counts["linear"] += 1
    _read_rest(layer, prefix, read)
    return counts


def place_layers(
    sizes: list[int], budgets: Mapping[Any, int], *, first: int = 0, last: int = 0
) -> list:
    """The device of each decoder layer (``sizes``, their bytes) spread over ``budgets`` (device
    -> bytes it may hold, in order) as transformers' device_map "auto" spreads them: consecutive
    layers per device, balanced by bytes, the embeddings (``first`` bytes) on the first device
    and the final norm and LM head (``last``) on the last. A layer goes to the device holding its
    middle byte. Refused when a device would hold more than its budget."""
    devices = list(budgets)
    share = (first + sum(sizes) + last) / len(devices)
    placed, start = [], first
    for size in sizes:
        placed.append(devices[min(int((start + size / 2) // share), len(devices) - 1)])
        start += size
    held = {d: sum(s for s, p in zip(sizes, placed, strict=True) if p == d) for d in devices}
    held[devices[0]] += first
    held[devices[-1]] += last
    over = {d: n for d, n in held.items() if n > budgets[d]}
    if over:
        raise ValueError(
            "the NF4 model does not fit its device budgets (max_memory): "
            + ", ".join(
                f"{d} would hold {held[d] / 2**30:.2f} GiB of {budgets[d] / 2**30:.2f}"
                for d in over
            )
        )
    return placed


def _nf4_bytes(layer: nn.Module, skip: set, dtype: torch.dtype) -> int:
    """Bytes a decoder layer (on the meta device) will hold once quantised as ``_read_layer``
    quantises it: its linear layers' and experts' weights in NF4 (4 bits and the scales of
    torchao's double quantisation), the rest in ``dtype``."""
    quantised = 0
    for name, module in layer.named_modules():
        if not name or skip & set(name.split(".")):
            continue
        if is_fused_experts(module):
            quantised += sum(getattr(module, p).numel() for p in EXPERT_PARAMETERS)
        elif type(module) is nn.Linear:
            quantised += module.weight.numel()
    rest = sum(p.numel() for p in layer.parameters()) - quantised
    nf4 = 0.5 + 1 / BLOCK_SIZE + 4 / (BLOCK_SIZE * SCALER_BLOCK_SIZE)
    return int(quantised * nf4 + rest * dtype.itemsize)


def load_staged(
    model_dir,
    lora=None,
    *,
    mesh=None,
    dtype: torch.dtype = torch.bfloat16,
    shards: int = SHARDS,
    skip: Iterable[str] = ROUTER_NAMES,
    adapter: str = "default",
    seed: int = 0,
    attn_implementation: str | None = None,
    log=lambda _: None,
    expert_group=None,
    max_memory: Mapping[Any, int] | None = None,
    **fsdp_kwargs,
):
    """The NF4 model of ``model_dir`` (with LoRA as ``lora``, a peft ``LoraConfig``, says), built
    layer by layer: the model is built empty (meta device), then each decoder layer's tensors are
    read from the safetensors shards (experts one at a time), quantised, given their LoRA
    weights and, when there are several processes (``mesh``, or the default process group),
    sharded by FSDP2 before the next layer is read; embeddings, final norm and LM head come last,
    then the root is sharded. Each process holds one layer's quantisation at a time besides its
    shards. The result equals ``nf4_lora(quantize_nf4(from_pretrained(model_dir)), lora)`` with
    the same seed; ``attn_implementation`` as ``from_pretrained`` takes it (None: its default).

    Sharded, the processes of a shard group quantise each weight together, each 1 / their number
    of it (``to_nf4``), on the mesh's device (the GPU, when there is one).
    ``expert_group``: a process group for expert parallelism, each of whose processes reads and
    holds only its share of every layer's experts, whole (``NF4Experts``), outside FSDP2's
    shards; the LoRA weights stay FSDP2-sharded like the rest. ``max_memory`` (device -> bytes,
    one process): the layers spread over those devices as a device map spreads them
    (``place_layers``), each read and quantised on its own device, and accelerate's hooks move
    the activations from device to device (``hf_device_map`` set, as transformers sets it)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attn_implementation
        )
    model.config.use_cache = False
    skip = set(skip)
    layers = decoder_layers(model)
    placement = None
    if max_memory is not None:
        inside = {p for layer in layers for p in layer.parameters()}
        first = model.get_input_embeddings().weight.nbytes
        rest = sum(p.nbytes for p in model.parameters() if p not in inside) - first
        placement = place_layers(
            [_nf4_bytes(layer, skip, dtype) for layer in layers], max_memory, first=first, last=rest
        )
    if lora is not None:
        lora, plan = _lora_plan(model, lora, is_fused_experts)
        model = _peft_linears(model, lora, adapter, empty=True)
    inner = model.get_base_model() if lora is not None else model
    sharded = mesh is not None or (dist.is_initialized() and dist.get_world_size() > 1)
    if sharded and max_memory is not None:
        raise ValueError("load_staged: max_memory spreads one process's model; it is not sharded")
    # the processes holding the shards of one copy quantise it together
    group = None
    if sharded:
        group = mesh.get_group(mesh.ndim - 1) if mesh is not None else dist.group.WORLD
    on_gpu = mesh is not None and mesh.device_type == "cuda"
    read = _Checkpoint(model_dir, dtype, device="cuda" if on_gpu else "cpu")
    part = (0, 1)
    if expert_group is not None:
        part = (dist.get_rank(expert_group), dist.get_world_size(expert_group))
    counts = {"linear": 0, "experts": 0}
    # experts placed whole by expert parallelism: neither sharded nor moved by FSDP2
    placed: set[nn.Parameter] = set()
    together = f" (1/{group.size()} of it here)" if group is not None and group.size() > 1 else ""
    for index, layer in enumerate(decoder_layers(model)):
        prefix = f"model.layers.{index}."
        if placement is not None:
            read.device = placement[index]
        for kind, n in _read_layer(layer, prefix, read, shards, skip, part, group).items():
            counts[kind] += n
        if lora is not None:
            mine = {k.removeprefix(prefix): v for k, v in plan.items() if k.startswith(prefix)}
            _wrap_experts(layer, mine, lora, adapter)
            _init_lora(layer, seed + index, lora, adapter)
            if placement is not None:
                layer.to(placement[index])  # the LoRA weights drawn on the CPU
        mine = set()
        if expert_group is not None:
            for module in layer.modules():
                if isinstance(module, NF4Experts):
                    module.group = expert_group
                    if mesh is not None:
                        module.to(mesh.device_type)
                    mine |= set(module.parameters())
            placed |= mine
        if sharded:
            _check_shardable(layer, _shard_count(mesh))
            fully_shard(layer, mesh=mesh, ignored_params=mine or None, **fsdp_kwargs)
        # the bf16 copies went with the replaced modules; the files' pages go with their maps
        read.close()
        where = f" on {placement[index]}" if placement is not None else ""
        log(f"layer {index}: read, quantised{together}{where}{', sharded' if sharded else ''}")
    if placement is not None:
        read.device = placement[-1]  # the final norm and LM head; the embeddings moved below
    _read_rest(inner, "", read)
    read.close()
    _release_freed_memory()
    if config.get_text_config().tie_word_embeddings:
        inner.tie_weights()
    for name, module in list(inner.named_modules()):
        # a rotary embedding's frequencies are computed, not saved
        computed = "Rotary" in type(module).__name__
        if computed and any(b.is_meta for b in module.buffers(recurse=False)):
            _set(inner, name, type(module)(config=inner.config))
    missing = [n for n, t in [*inner.named_parameters(), *inner.named_buffers()] if t.is_meta]
    if missing:
        raise ValueError(f"{model_dir}: nothing read or computed for {missing[:10]}")
    if sharded:
        fully_shard(model, mesh=mesh, ignored_params=placed or None, **fsdp_kwargs)
    if placement is not None:
        _dispatch(inner, placement)
    held = f", {part[1]}-way expert parallel" if expert_group is not None else ""
    log(f"NF4 model: {counts['linear']} linear layers, {counts['experts']} experts modules{held}")
    return model


def _dispatch(model: nn.Module, placement: list) -> None:
    """``model``'s modules moved to their devices by ``placement`` (each decoder layer's; the
    embeddings, rotary embedding and a tied LM head on the first, the final norm and an untied
    LM head on the last), with accelerate's hooks that move each module's inputs to its device:
    transformers' own device_map dispatch. The layers are on theirs already."""
    from accelerate import dispatch_model

    decoder = model.get_decoder()
    path = {m: n for n, m in model.named_modules()}
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    first = {embeddings} | {m for m in decoder.children() if "Rotary" in type(m).__name__}
    if head.weight is embeddings.weight:
        first.add(head)
    device_map = {path[layer]: d for layer, d in zip(decoder.layers, placement, strict=True)}
    for module in [*decoder.children(), *model.children()]:
        if module is not decoder and module is not decoder.layers:
            device_map[path[module]] = placement[0] if module in first else placement[-1]
            module.to(device_map[path[module]])
    dispatch_model(model, device_map=device_map)


def save_adapter(model, out_dir, *, write: bool = True) -> dict[str, torch.Tensor]:
    """Gather the adapter of ``model`` (``nf4_lora``'s, sharded or not; every rank must call) and,
    when ``write`` (rank 0), save it in PEFT's format to ``out_dir``. Returns the gathered LoRA
    tensors under the model's parameter names."""
    from .adapters import gather_adapter

    state = gather_adapter(model)
    if write:
        save_pretrained(model, out_dir, state_dict=state)
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
