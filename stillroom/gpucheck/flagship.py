"""Check ``qlora_fsdp_staged``: the flagship recipe on a tiny Qwen3-MoE (the train stage,
NF4 everywhere with the staged loader, LoRA on attention and the fused experts, FSDP2 over
every GPU found), then the streaming merge of the adapter in a process of its own."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config.routers import router_role
from .common import Log, attention, decreased, mib, verdict
from .harness import run_isolated

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
FUSED_EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# The merged model's logits against the base with the adapter applied by PEFT, both in float32:
# the same sums in another order, whose rounding lies orders of magnitude below this and the
# adapter's own effect as far above it.
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

    from ..runtime.adapter_merge import stream_merge
    from ..runtime.merge import shard_map

    shards = [Path(base) / s for s in set(shard_map(Path(base)).values())]
    before = _status_mib("VmRSS")
    summary = stream_merge(base, adapter, out)
    log(f"merged {summary['tensors_changed']} tensors in {summary['seconds']} s")
    return verdict(
        [],
        **summary,
        checkpoint_mib=mib(sum(s.stat().st_size for s in shards)),
        largest_shard_mib=mib(max(s.stat().st_size for s in shards)),
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

    from ..runtime.merge import shard_map

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
    return router_role(key) is not None


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

    from ..stages.train import run as train_stage

    cuda = device == "cuda"
    processes = torch.cuda.device_count() if cuda else 2
    impl = attention(device)
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
            f"{__name__}:measured_merge",
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
        "loss_decreased": decreased(losses),
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
    return verdict(failures, **out)
