"""A LoRA / QLoRA adapter merged into its full-precision base checkpoint, streamed: the base's
safetensors shards are read and written tensor by tensor, so memory holds the adapter plus one
tensor in float32, never the model. The output is sharded exactly like the base (same files, same
tensor-to-file map, the same index), untouched tensors are copied byte for byte, and the merge never
targets 4-bit weights: it reads the checkpoint the adapter's base was loaded from.

Which base tensor each adapter tensor changes, and how, is what PEFT itself builds for the base's
config: the adapter's LoraConfig is applied to an empty (meta-device) copy of the model, so target
matching, ``rank_pattern`` / ``alpha_pattern``, ``use_rslora``, ``fan_in_fan_out`` and the layout
of LoRA on fused MoE experts (``target_parameters``) follow PEFT exactly. Checkpoint tensor names
are mapped to model parameters by transformers' own key conversion (``conversion_mapping``): a
transformers-5 MoE keeps its experts fused in memory (``mlp.experts.gate_up_proj``, experts x 2I x
H) but saves one tensor per expert and projection, and each of those gets its slice of the fused
delta. Merges PEFT computes otherwise (DoRA and other LoRA variants, a LoRA bias, modules_to_save,
trainable tokens) are refused, naming the key.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..io import atomic_dir
from .hooks import WeightHooks
from .merge import INDEX, is_weight_file, shard_map

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# what a PEFT save writes besides the weights, and the architecture (always the base's); the rest
# of an adapter directory (a tokenizer, a generation config) is what the merged model is served with
NOT_SERVED = {ADAPTER_CONFIG, ADAPTER_WEIGHTS, "adapter_model.bin", "README.md", "config.json"}
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}
COPY_BYTES = 64 * 2**20  # untouched tensors are copied in pieces of this size
# LoraConfig settings whose merge is not W + scaling * B @ A: refused when set
UNSUPPORTED = {
    "use_dora": "DoRA rescales every column by the norm of the merged weight",
    "lora_bias": "a LoRA bias also changes the base layer's bias",
    "modules_to_save": "whole modules trained beside the adapter",
    "trainable_token_indices": "trained token embeddings",
    "layer_replication": "layers duplicated from the base",
}


@dataclass(frozen=True)
class Target:
    """One adapted model parameter: its LoRA factors in the adapter file and PEFT's layout."""

    param: str  # the model's parameter name, e.g. model.layers.0.mlp.experts.gate_up_proj
    lora_a: str
    lora_b: str
    scaling: float
    num_experts: int  # 1: a 2-D weight, delta B @ A; else a fused expert stack
    fan_in_fan_out: bool  # a 2-D weight stored (in, out)
    swapped: bool  # experts stored (experts, out, in): PEFT's _did_swap_in_out_features

    def factors(
        self, a: torch.Tensor, b: torch.Tensor, expert: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, R) with the parameter's delta ``scaling * L @ R``: the whole of a 2-D weight, or one
        expert's of a fused stack (PEFT's ParamWrapper: lora_A is (experts x r, in) expert-major,
        lora_B is (out, r x experts) expert-minor)."""
        if self.num_experts == 1:
            return (a.T, b.T) if self.fan_in_fan_out else (b, a)
        a_e = a.reshape(self.num_experts, -1, a.shape[-1])[expert]  # (r, in)
        b_e = b.reshape(b.shape[0], -1, self.num_experts)[:, :, expert]  # (out, r)
        return (b_e, a_e) if self.swapped else (a_e.T, b_e.T)


@dataclass(frozen=True)
class Piece:
    """Where a checkpoint tensor sits in its model parameter: one expert of a stack (``expert``),
    then a slice along ``dim`` of the parts concatenated there (e.g. gate then up)."""

    param: str
    expert: int | None = None
    dim: int | None = None
    start: int = 0
    length: int = 0
    unsupported: str | None = None  # a conversion this merge cannot invert, named

    def of(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The factors of this piece's slice of the delta ``left @ right``."""
        if self.dim == 0:
            return left.narrow(0, self.start, self.length), right
        if self.dim == 1:
            return left, right.narrow(1, self.start, self.length)
        return left, right


def _read_header(path: Path) -> tuple[bytes, dict[str, Any]]:
    """A safetensors file's header: its raw bytes (length prefix included) and the parsed JSON."""
    with open(path, "rb") as fh:
        size = fh.read(8)
        if len(size) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", size)
        raw = fh.read(n)
    try:
        return size + raw, json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{path}: not a safetensors file (unreadable header)") from None


def _adapter_config(adapter: Path) -> dict[str, Any]:
    path = adapter / ADAPTER_CONFIG
    if not path.is_file() or not (adapter / ADAPTER_WEIGHTS).is_file():
        found = sorted(p.name for p in adapter.iterdir()) if adapter.is_dir() else "no directory"
        raise FileNotFoundError(
            f"{adapter}: not a PEFT adapter: expected {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}, "
            f"found {found}"
        )
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("peft_type") != "LORA":
        raise ValueError(
            f"{path}: peft_type is {config.get('peft_type')!r}; only LoRA adapters ('LORA') merge"
        )
    for key, why in UNSUPPORTED.items():
        if config.get(key):
            raise ValueError(
                f"{path}: {key} is {config[key]!r}, which the streaming merge does not support "
                f"({why}); only W + scaling * B @ A merges are"
            )
    return config


def _check_base(adapter: Path, base: Path, config: dict[str, Any]) -> None:
    """An adapter records the base it was loaded on: when that names another local checkpoint, the
    merge would put the update on weights it was not trained against."""
    recorded = config.get("base_model_name_or_path")
    if recorded and Path(recorded).is_dir() and Path(recorded).resolve() != base.resolve():
        raise ValueError(
            f"{adapter / ADAPTER_CONFIG}: base_model_name_or_path is {recorded}, not the base "
            f"given ({base}): merge the adapter into the checkpoint it was trained on"
        )


def _check_full_precision(base: Path) -> None:
    """Merging into 4-bit weights is not offered: rounding the update into NF4 codes would lose most
    of it, and the QLoRA recipe keeps the original checkpoint to merge into."""
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    quantized = config.get("quantization_config")
    if quantized:
        raise ValueError(
            f"{base / 'config.json'}: quantization_config ({quantized.get('quant_method', '?')}) "
            "is set: merge the adapter into the full-precision checkpoint the quantized model was "
            "loaded from"
        )


def meta_model(base: Path):
    """The base's architecture on the meta device: names and shapes, no weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))


def plan_targets(model, base: Path, adapter: Path) -> tuple[list[Target], dict[str, tuple]]:
    """The adapted parameters of ``model`` (the base's, on the meta device; PEFT wraps it in
    place) as PEFT lays the adapter out on it, and the shape of every tensor the adapter file
    must hold."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import Linear, LoraLayer, ParamWrapper
    from peft.utils import get_peft_model_state_dict

    lora = LoraConfig.from_pretrained(str(adapter))
    lora.inference_mode = True
    try:
        peft_model = get_peft_model(model, lora, low_cpu_mem_usage=True)
    except ValueError as exc:  # e.g. target_modules matching no module of this base
        raise ValueError(f"adapter {adapter} does not fit base {base}: {exc}") from None
    name = peft_model.active_adapter
    layers: dict[str, Any] = {}
    for module_name, module in peft_model.named_modules():
        if not isinstance(module, LoraLayer) or name not in module.lora_A:
            continue
        variant = getattr(module, "lora_variant", {}).get(name)
        if variant is not None:
            raise ValueError(
                f"{adapter / ADAPTER_CONFIG}: {module_name} is a {type(variant).__name__} LoRA "
                "variant, which the streaming merge does not support"
            )
        if not isinstance(module, Linear | ParamWrapper):
            raise ValueError(
                f"{adapter / ADAPTER_CONFIG}: {module_name} is a LoRA {type(module).__name__}; the "
                "streaming merge supports Linear layers and parameters (target_parameters)"
            )
        layers[module_name] = module
    prefix = "base_model.model."
    targets, expected = [], get_peft_model_state_dict(peft_model, adapter_name=name)
    for module_name, module in layers.items():
        owner = module_name.removeprefix(prefix).replace(".base_layer", "")
        wrapper = isinstance(module, ParamWrapper)
        targets.append(
            Target(
                param=f"{owner}.{module.parameter_name if wrapper else 'weight'}",
                lora_a=f"{module_name}.lora_A.weight",
                lora_b=f"{module_name}.lora_B.weight",
                scaling=float(module.scaling[name]),
                num_experts=module.num_experts if wrapper else 1,
                fan_in_fan_out=bool(module.fan_in_fan_out),
                swapped=bool(getattr(module, "_did_swap_in_out_features", False)),
            )
        )
    factors = {t.lora_a for t in targets} | {t.lora_b for t in targets}
    others = sorted(set(expected) - factors)
    if others:
        raise ValueError(
            f"adapter {adapter}: tensors other than LoRA factors ({', '.join(others[:4])}); the "
            "streaming merge supports lora_A / lora_B only"
        )
    return targets, {k: tuple(v.shape) for k, v in expected.items()}


def _conversions(model):
    """transformers' checkpoint-key conversions for ``model``: (renamings, converters)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    mapping = get_model_conversion_mapping(model)
    return (
        [m for m in mapping if isinstance(m, WeightRenaming)],
        [m for m in mapping if isinstance(m, WeightConverter)],
    )


def checkpoint_pieces(model, keys: dict[str, tuple[int, ...]]) -> dict[str, Piece]:
    """Checkpoint tensor name -> where it sits in the model's parameters, by the conversions
    transformers applies when it loads the checkpoint (``keys``: name -> shape). Names the model
    does not load (e.g. buffers) are left out."""
    from transformers.core_model_loading import Concatenate, MergeModulelist, rename_source_key

    renamings, converters = _conversions(model)
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    meta = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None)
    pieces: dict[str, Piece] = {}
    # (param, expert) -> [(source index, key, concatenation dim)]: the parts concatenated there
    parts: dict[tuple[str, int | None], list[tuple[int, str, int]]] = defaultdict(list)
    for key in keys:
        param, pattern = rename_source_key(key, renamings, converters, prefix, meta)
        if param not in meta and key in meta:  # as transformers' loader falls back
            param, pattern = rename_source_key(key, [], [], prefix, meta)
        if param not in meta:
            continue
        if pattern is None:
            pieces[key] = Piece(param)
            continue
        converter = by_pattern[pattern]
        ops = list(converter.operations)
        expert = dim = None
        if ops and isinstance(ops[0], MergeModulelist) and ops[0].dim == 0:
            ops.pop(0)
            found = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), key)
            expert = int(found.group(1)) if found else None
        if ops and isinstance(ops[0], Concatenate) and len(ops) == 1:
            dim = ops.pop(0).dim - (expert is not None)  # the stack's dim 0 is the expert
        if ops or (expert is None and "*" in pattern) or (dim is not None and dim < 0):
            pieces[key] = Piece(param, unsupported=repr(converter))
            continue
        pieces[key] = Piece(param, expert)
        if dim is not None:
            parts[(param, expert)].append((converter.source_patterns.index(pattern), key, dim))
    for group in parts.values():
        start = 0
        for _, key, dim in sorted(group):
            length = keys[key][dim]
            pieces[key] = Piece(pieces[key].param, pieces[key].expert, dim, start, length)
            start += length
    return pieces


def _merged(
    w: torch.Tensor, target: Target, a: torch.Tensor, b: torch.Tensor, piece: Piece
) -> torch.Tensor:
    """The checkpoint tensor ``w`` plus its part of ``target``'s delta, in float32."""
    out = w.to(torch.float32, copy=True)
    if target.num_experts > 1 and piece.expert is None:
        # the whole expert stack in one tensor: expert by expert
        parts = [(out[e], target.factors(a, b, e)) for e in range(target.num_experts)]
    elif target.num_experts == 1 and piece.expert is not None:
        raise ValueError(f"{target.param}: a 2-D weight stored as a stack of tensors")
    else:
        parts = [(out, target.factors(a, b, piece.expert))]
    for dst, factors in parts:
        left, right = piece.of(*factors)
        if (left.shape[0], right.shape[1]) != tuple(dst.shape):
            raise ValueError(
                f"{target.param}: the adapter's delta is {[left.shape[0], right.shape[1]]} where "
                f"the checkpoint stores {list(dst.shape)}"
            )
        dst.addmm_(left, right, alpha=target.scaling)
    return out


def _copy_bytes(src, dst, n: int) -> None:
    while n > 0:
        chunk = src.read(min(n, COPY_BYTES))
        if not chunk:
            raise ValueError(f"{src.name}: truncated")
        dst.write(chunk)
        n -= len(chunk)


def _write_shard(src: Path, dst: Path, header: bytes, changes) -> int:
    """``src`` copied to ``dst`` with the tensors ``changes`` names (name -> function of the stored
    tensor giving its new value, same dtype and shape) replaced; returns how many were. The header
    is the same bytes: a merge changes no dtype, shape or offset."""
    layout = json.loads(header[8:])
    start = len(header)
    entries = sorted(
        ((k, v) for k, v in layout.items() if k != "__metadata__"),
        key=lambda kv: kv[1]["data_offsets"],
    )
    done = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(header)
        fin.seek(start)
        pos = 0
        for key, info in entries:
            begin, end = info["data_offsets"]
            _copy_bytes(fin, fout, begin - pos)
            change = changes.get(key)
            if change is None:
                _copy_bytes(fin, fout, end - begin)
            else:
                w = torch.empty(info["shape"], dtype=DTYPES[info["dtype"]])
                flat = w.reshape(-1).view(torch.uint8).numpy()
                if fin.readinto(flat) != end - begin:
                    raise ValueError(f"{src}: truncated in tensor {key}")
                new = change(w)
                if new.dtype != w.dtype or new.shape != w.shape:
                    raise ValueError(f"tensor {key}: the merge changed its dtype or shape")
                fout.write(new.contiguous().reshape(-1).view(torch.uint8).numpy())
                done += 1
            pos = end
        shutil.copyfileobj(fin, fout)  # anything after the last tensor, as it is
    return done


def stream_merge(
    base,
    adapter,
    out,
    *,
    hooks: WeightHooks | None = None,
) -> dict[str, Any]:
    """Write to ``out`` the checkpoint in ``base`` with the LoRA adapter in ``adapter`` (PEFT's
    format) merged in, each changed tensor computed in float32 and stored in its own dtype, and
    ``hooks`` applied to every tensor they match (checkpoint names). Config, generation config and
    tokenizer come from ``base``, overridden by any the adapter directory holds (a training job
    saves the ones its model is served with); the adapter itself is kept in ``out/adapter``.
    Returns a summary dict."""
    from safetensors.torch import load_file

    started = time.perf_counter()
    base, adapter, out = Path(base), Path(adapter), Path(out)
    if out.resolve() in (base.resolve(), adapter.resolve()):
        raise ValueError(f"output {out} must differ from the base and the adapter")
    _check_base(adapter, base, _adapter_config(adapter))
    _check_full_precision(base)
    weight_map = shard_map(base)
    shards = sorted(set(weight_map.values()))
    headers = {s: _read_header(base / s) for s in shards}
    infos = {k: headers[s][1][k] for k, s in weight_map.items()}
    hooks = hooks or WeightHooks(None)
    hooks.check_names(sorted(weight_map), str(base))

    model = meta_model(base)
    # the key conversion reads the plain model, before PEFT wraps its layers
    pieces = checkpoint_pieces(model, {k: tuple(v["shape"]) for k, v in infos.items()})
    targets, shapes = plan_targets(model, base, adapter)
    with open(adapter / ADAPTER_WEIGHTS, "rb") as fh:
        saved = {
            k: tuple(v["shape"])
            for k, v in json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0])).items()
            if k != "__metadata__"
        }
    unknown, missing = sorted(saved.keys() - shapes.keys()), sorted(shapes.keys() - saved.keys())
    problems = []
    if unknown:
        problems.append(f"{len(unknown)} of its tensors match nothing there (e.g. {unknown[0]})")
    if missing:
        problems.append(
            f"{len(missing)} tensors its config targets are missing (e.g. {missing[0]})"
        )
    if problems:
        raise ValueError(f"adapter {adapter} does not fit base {base}: " + "; ".join(problems))
    for key, shape in sorted(shapes.items()):
        if saved[key] != shape:
            raise ValueError(
                f"adapter {adapter} does not fit base {base}: {key} is {list(saved[key])} in the "
                f"adapter, {list(shape)} for this base (trained on another model?)"
            )

    by_param = {t.param: t for t in targets}
    found = {p.param for p in pieces.values()}
    absent = sorted(set(by_param) - found)
    if absent:
        raise ValueError(
            f"adapter {adapter} targets {absent[0]}, which checkpoint {base} does not store "
            "(tied to another tensor?)"
        )
    for key, piece in pieces.items():
        if piece.param in by_param and piece.unsupported:
            raise ValueError(
                f"checkpoint {base} stores {key} through a conversion the merge cannot invert "
                f"({piece.unsupported}), and the adapter targets {piece.param}"
            )

    factors = {k: v.float() for k, v in load_file(adapter / ADAPTER_WEIGHTS).items()}
    changes: dict[str, dict[str, Any]] = defaultdict(dict)
    n_targeted = 0
    for key, shard in weight_map.items():
        piece = pieces.get(key)
        target = by_param.get(piece.param) if piece else None
        hooked = hooks.matches(key)
        if target is None and not hooked:
            continue
        if infos[key]["dtype"] not in DTYPES:
            if target is not None:
                raise ValueError(
                    f"tensor {key} of {base}: dtype {infos[key]['dtype']} cannot merge"
                )
            continue  # hooks act on floating tensors
        n_targeted += target is not None

        def change(w, key=key, piece=piece, target=target):
            new = (
                w.to(torch.float32, copy=True)
                if target is None
                else _merged(w, target, factors[target.lora_a], factors[target.lora_b], piece)
            )
            return hooks.apply(key, new).to(w.dtype)

        changes[shard][key] = change

    n_changed = 0
    with atomic_dir(out) as tmp:
        for shard in shards:
            n_changed += _write_shard(base / shard, tmp / shard, headers[shard][0], changes[shard])
        if (base / INDEX).exists():
            shutil.copy2(base / INDEX, tmp / INDEX)
        for src in sorted(base.iterdir()):
            if src.is_file() and not is_weight_file(src):
                shutil.copy2(src, tmp / src.name)
        for src in sorted(adapter.iterdir()):
            if src.is_file() and src.name not in NOT_SERVED and not is_weight_file(src):
                shutil.copy2(src, tmp / src.name)
        (tmp / "adapter").mkdir()
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            shutil.copy2(adapter / name, tmp / "adapter" / name)
        file_bytes = sum((tmp / s).stat().st_size for s in shards)

    return {
        "tensors": len(weight_map),
        "tensors_merged": n_targeted,
        "tensors_changed": n_changed,
        "adapted_parameters": len(targets),
        "parameters": sum(math.prod(v["shape"]) for v in infos.values()),
        "bytes_written": file_bytes,
        "shards": len(shards),
        "seconds": round(time.perf_counter() - started, 3),
    }
