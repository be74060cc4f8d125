"""Weight merges: linear interpolation of two Hugging Face checkpoints of the same architecture
(here), and LoRA / QLoRA adapters merged into their full-precision base (adapter_merge.py). Both
apply the student's weight hooks (e.g. nGPT row re-normalisation) to the result, since a merge moves
weights off their constraint.

Interpolation streams tensor by tensor: memory holds one output shard plus one tensor, never the
whole model.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..io import atomic_dir, write_json
from .hooks import WeightHooks

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_WEIGHT_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf"}


def shard_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file name, from the index when there is one."""
    if (model_dir / INDEX).exists():
        return json.loads((model_dir / INDEX).read_text(encoding="utf-8"))["weight_map"]
    if (model_dir / SINGLE).exists():
        with safe_open(model_dir / SINGLE, framework="pt") as fh:
            return {key: SINGLE for key in fh.keys()}
    raise FileNotFoundError(f"{model_dir}: no {SINGLE} or {INDEX}")


def _check_keys(base: Path, tuned: Path, base_map: dict, tuned_map: dict) -> None:
    missing, extra = (
        sorted(base_map.keys() - tuned_map.keys()),
        sorted(tuned_map.keys() - base_map.keys()),
    )
    if missing or extra:
        hint = ""
        if any(k.endswith("lm_head.weight") for k in missing + extra):
            hint = " (tie_word_embeddings differs between the two models?)"
        raise ValueError(
            f"checkpoints have different tensors{hint}: base {base} vs tuned {tuned}; "
            f"missing from tuned: {missing[:10] or 'none'}; extra in tuned: {extra[:10] or 'none'}"
        )


def is_weight_file(path: Path) -> bool:
    return path.suffix in _WEIGHT_SUFFIXES or path.name.endswith(".index.json")


def interpolate(
    base,
    tuned,
    out,
    ratio: float,
    *,
    max_shard_bytes: int = 2 * 1024**3,
    hooks: WeightHooks | None = None,
) -> dict:
    """Write to ``out`` the model (1 - ratio) * base + ratio * tuned, with ``hooks`` applied to each
    merged tensor (a job's ratio is bounded by its params: config.training.MergeRatio). Config,
    generation config and tokenizer files come from ``tuned``. Returns a summary dict.
    """
    started = time.perf_counter()
    base, tuned, out = Path(base), Path(tuned), Path(out)
    w = float(ratio)
    if out.resolve() in (base.resolve(), tuned.resolve()):
        raise ValueError(f"output {out} must differ from the input checkpoints")
    base_map, tuned_map = shard_map(base), shard_map(tuned)
    _check_keys(base, tuned, base_map, tuned_map)
    hooks = hooks or WeightHooks(None)
    hooks.check_names(sorted(base_map), str(base))

    n_tensors = n_params = n_bytes = 0
    with atomic_dir(out) as tmp, contextlib.ExitStack() as stack:
        handles: dict[Path, object] = {}

        def read(model_dir: Path, shard: str, key: str) -> torch.Tensor:
            path = model_dir / shard
            if path not in handles:
                handles[path] = stack.enter_context(safe_open(path, framework="pt"))
            return handles[path].get_tensor(key)

        written: list[tuple[Path, list[str]]] = []  # shard files and the tensor names in each
        current: dict[str, torch.Tensor] = {}
        current_bytes = 0

        def flush() -> None:
            nonlocal current, current_bytes
            path = tmp / f"shard-{len(written):05d}.safetensors"
            save_file(current, path, metadata={"format": "pt"})
            written.append((path, list(current)))
            current, current_bytes = {}, 0

        # Read in shard order so each input file is visited sequentially.
        for key in sorted(base_map, key=lambda k: (base_map[k], k)):
            b, t = read(base, base_map[key], key), read(tuned, tuned_map[key], key)
            if b.shape != t.shape or b.dtype != t.dtype:
                raise ValueError(
                    f"tensor {key}: base {base} has {b.dtype} {tuple(b.shape)}, "
                    f"tuned {tuned} has {t.dtype} {tuple(t.shape)}"
                )
            if b.is_floating_point():
                # Explicit (1-w)*b + w*t rather than lerp: exact at w = 0 and w = 1.
                merged = hooks.apply(
                    key, b.to(torch.float32, copy=True).mul_(1.0 - w).add_(t, alpha=w)
                ).to(b.dtype)
            elif torch.equal(b, t):
                merged = t
            else:
                raise ValueError(
                    f"tensor {key}: non-floating tensors differ and cannot be interpolated"
                )
            del b, t
            size = merged.numel() * merged.element_size()
            if current and current_bytes + size > max_shard_bytes:
                flush()
            current[key] = merged.contiguous()
            current_bytes += size
            n_tensors, n_params, n_bytes = n_tensors + 1, n_params + merged.numel(), n_bytes + size
        flush()

        names = (
            [SINGLE]
            if len(written) == 1
            else [
                f"model-{i + 1:05d}-of-{len(written):05d}.safetensors" for i in range(len(written))
            ]
        )
        for (path, _), name in zip(written, names, strict=True):
            path.rename(tmp / name)
        if len(written) > 1:
            weight_map = {
                k: name for (_, keys), name in zip(written, names, strict=True) for k in keys
            }
            write_json(tmp / INDEX, {"metadata": {"total_size": n_bytes}, "weight_map": weight_map})
        for src in sorted(tuned.iterdir()):
            if src.is_file() and not is_weight_file(src):
                shutil.copy2(src, tmp / src.name)
        file_bytes = sum((tmp / name).stat().st_size for name in names)

    return {
        "tensors": n_tensors,
        "parameters": n_params,
        "bytes_written": file_bytes,
        "shards": len(names),
        "seconds": round(time.perf_counter() - started, 3),
    }
