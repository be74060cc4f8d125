"""Merge peak memory and wall time against model size: stillroom's streaming interpolate next to
the naive "load both models, lerp, save"; with --adapter, the streaming adapter merge
(stream_merge) next to the in-memory one it replaced (transformers + PeftModel.merge_and_unload).

Interpolation: for each size (millions of fp32 parameters) two random-weight Qwen3 checkpoints (tied
embeddings, different seeds, saved in 100 MB shards) are written to a temporary directory; each
merge at ratio 0.5 then runs in a fresh subprocess so its peak memory is its own. Peak
anonymous RSS is the max of RssAnon sampled every 10 ms: VmHWM (also printed) counts the page cache
of the mmapped safetensors inputs, which is reclaimable. The inputs were just written, so both
methods read them from a warm page cache. The two outputs are compared (max abs diff). Prints
numbers only.

What to expect: interpolate holds one output shard (2 GiB by default, so the whole output for
models under 2 GiB; --shard-mb 100 shows its floor). transformers 5's from_pretrained maps
safetensors copy-on-write, so "load both" holds anonymous memory only for the model it merges into,
not for both.

Adapter merge (--adapter): a random Qwen3-MoE of at least --moe-gb GiB in bf16 (--experts 64 of
--hidden 1024, at least 2 layers; saved in --shard-mb shards, one tensor per expert and projection
as transformers 5 writes them) and a random LoRA adapter (r 16) on attention and on the fused
experts (target_parameters), every lora_B non-zero.
Each merge runs in a fresh subprocess; VmHWM (the kernel's peak RSS, mapped files included) and the
sampled peak RssAnon are set against the largest shard and the whole model. The streaming merge
reads with read(), not mmap, so its VmHWM is its own memory. The outputs are compared.

    .venv/bin/python bench/merge_memory.py [--sizes 25,100,250] [--shard-mb MB]
    .venv/bin/python bench/merge_memory.py --adapter [--moe-gb 1.1] [--experts 64] [--hidden 1024]
        [--shard-mb 200]
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VOCAB = 32000


def status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class AnonPeak:
    """Max RssAnon sampled by a background thread (the kernel keeps no high-water mark for it)."""

    def __init__(self, interval: float = 0.01):
        self.interval, self.peak, self._stop = interval, status_kib("RssAnon"), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, status_kib("RssAnon"))
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, status_kib("RssAnon"))


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all processes, all cores)."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:9]]
    # less idle and iowait
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def qwen3_config(millions: float):
    """A Qwen3 shape near ``millions`` parameters: width by size, then as many layers as fit."""
    from transformers import Qwen3Config

    hidden = 512 if millions <= 50 else 1024
    heads = hidden // 64
    # q, k+v (half the heads), o; gate, up, down at 3x
    per_layer = 3 * hidden * hidden + 9 * hidden * hidden
    layers = max(1, round((millions * 1e6 - VOCAB * hidden) / per_layer))
    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        dtype="float32",
    )


def build(config, seed: int, out: Path) -> int:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    # save_pretrained's shard bar would clutter the table
    logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out, max_shard_size="100MB")
    return sum(p.numel() for p in model.parameters())


def worker(mode: str, base: str, tuned: str, out: str, shard_mb: int | None) -> None:
    """One merge in this (fresh) process; prints a JSON line of seconds and memory in KiB."""
    import torch
    from transformers import AutoModelForCausalLM

    from stillroom.runtime.adapter_merge import stream_merge
    from stillroom.runtime.merge import interpolate

    if mode.startswith("adapter"):
        from peft import PeftModel  # both adapter merges use PEFT: imported before the floor
    # after imports: the floor both methods share
    start_anon, start_rss = status_kib("RssAnon"), status_kib("VmRSS")
    t0 = time.perf_counter()
    with AnonPeak() as peak:
        if mode == "adapter-stream":
            stream_merge(base, tuned, out)
        elif mode == "adapter-load":
            # the merge this repository ran before stream_merge (the whole model in memory)
            model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
            model = PeftModel.from_pretrained(model, tuned).merge_and_unload()
            model.save_pretrained(out)
        elif mode == "stream":
            kwargs = {"max_shard_bytes": shard_mb * 2**20} if shard_mb else {}
            interpolate(base, tuned, out, 0.5, **kwargs)
        else:
            b = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            t = AutoModelForCausalLM.from_pretrained(tuned, dtype=torch.float32)
            tuned_sd, seen = t.state_dict(), set()
            with torch.no_grad():
                for key, tensor in b.state_dict().items():
                    # tied lm_head / embed_tokens: merge once
                    if tensor.data_ptr() in seen:
                        continue
                    seen.add(tensor.data_ptr())
                    # Same arithmetic as interpolate, so the outputs should match exactly.
                    tensor.mul_(0.5).add_(tuned_sd[key], alpha=0.5)
            b.save_pretrained(out)
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "seconds": seconds,
                "start_anon": start_anon,
                "start_rss": start_rss,
                "peak_anon": peak.peak,
                "hwm": status_kib("VmHWM"),
            }
        )
    )


def measure(mode: str, base: Path, tuned: Path, out: Path, shard_mb: int | None = None) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, str(base), str(tuned), str(out)]
    if shard_mb:
        cmd += ["--shard-mb", str(shard_mb)]
    t0, busy0, own0 = time.perf_counter(), busy_cpu_seconds(), sum(os.times()[2:4])
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        sys.exit(f"{mode} merge failed:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    others = (busy_cpu_seconds() - busy0 - (sum(os.times()[2:4]) - own0)) / (wall * os.cpu_count())
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "others": others}


def max_abs_diff(a: Path, b: Path) -> float:
    """Largest elementwise difference between two checkpoints, tensor by tensor."""
    from safetensors import safe_open

    from stillroom.runtime.merge import shard_map

    map_a, map_b = shard_map(a), shard_map(b)
    if map_a.keys() != map_b.keys():
        return float("nan")
    worst = 0.0
    for key in map_a:
        with (
            safe_open(a / map_a[key], framework="pt") as fa,
            safe_open(b / map_b[key], framework="pt") as fb,
        ):
            worst = max(worst, (fa.get_tensor(key) - fb.get_tensor(key)).abs().max().item())
    return worst


def moe_config(gib: float, experts: int = 64, hidden: int = 1024):
    """A Qwen3-MoE of ``experts`` experts with as many layers as make at least ``gib`` GiB in
    bf16 (at least 2)."""
    from transformers import Qwen3MoeConfig

    expert, head = hidden // 2, 64
    heads = hidden // head
    kv = max(1, heads // 4)
    per_layer = experts * 3 * hidden * expert + 2 * hidden * head * (heads + kv) + experts * hidden
    embeddings = 2 * VOCAB * hidden  # untied
    layers = max(2, math.ceil((gib * 2**30 / 2 - embeddings) / per_layer))
    return Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        moe_intermediate_size=expert,
        num_experts=experts,
        num_experts_per_tok=4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )


def build_moe(config, out: Path, adapter: Path, shard_mb: int) -> int:
    """The random bf16 MoE in ``out`` and a random LoRA adapter for it in ``adapter``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out, max_shard_size=f"{shard_mb}MB")
    n = sum(p.numel() for p in model.parameters())
    lora = LoraConfig(
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )
    model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # B starts at zero: a merge would change nothing
                p.normal_(std=0.02)
    model.save_pretrained(adapter)
    return n


def adapter_bench(gib: float, shard_mb: int, experts: int, hidden: int) -> None:
    mib = 1 / 1024
    config = moe_config(gib, experts, hidden)
    with tempfile.TemporaryDirectory(prefix="merge_memory_") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        n = build_moe(config, tmp / "base", tmp / "adapter", shard_mb)
        shards = [f.stat().st_size for f in (tmp / "base").glob("*.safetensors")]
        adapter = (tmp / "adapter" / "adapter_model.safetensors").stat().st_size
        print(
            f"random Qwen3-MoE: {n / 1e6:.0f}M parameters ({config.num_hidden_layers} layers, "
            f"{config.num_experts} experts), bf16: {sum(shards) / 2**20:.0f} MiB in {len(shards)} "
            f"shards (largest {max(shards) / 2**20:.0f} MiB); adapter {adapter / 2**20:.0f} MiB; "
            f"built in {time.perf_counter() - t0:.0f} s"
        )
        runs = {
            "streaming": measure("adapter-stream", tmp / "base", tmp / "adapter", tmp / "stream"),
            "in memory": measure("adapter-load", tmp / "base", tmp / "adapter", tmp / "load"),
        }
        diff = max_abs_diff(tmp / "stream", tmp / "load")
    print(
        "memory in MiB. RSS start: after the imports, before the merge (the same floor for both); "
        "merge: peak RSS (VmHWM) less that floor; x shard / x model: merge over the largest "
        "shard / the whole model"
    )
    print(
        f"{'method':<11}{'seconds':>9}{'RSS start':>11}{'VmHWM':>8}{'merge':>8}{'x shard':>9}"
        f"{'x model':>9}{'anon start':>12}{'peak anon':>11}{'others':>8}"
    )
    for name, r in runs.items():
        own = (r["hwm"] - r["start_rss"]) * 1024  # bytes
        print(
            f"{name:<11}{r['seconds']:>9.2f}{r['start_rss'] * mib:>11.0f}{r['hwm'] * mib:>8.0f}"
            f"{own / 2**20:>8.0f}{own / max(shards):>9.2f}{own / sum(shards):>9.2f}"
            f"{r['start_anon'] * mib:>12.0f}{r['peak_anon'] * mib:>11.0f}{r['others']:>8.0%}"
        )
    print(
        f"max abs diff between the two outputs: {diff:.3g} (bf16: the in-memory merge rounds the "
        "delta to bf16 before adding it, the streaming one rounds once)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="25,100,250", help="comma-separated millions of parameters")
    ap.add_argument(
        "--shard-mb",
        type=int,
        default=None,
        help="interpolate's output shard size (default: the library's, 2 GiB)",
    )
    ap.add_argument(
        "--adapter", action="store_true", help="measure the adapter merge (stream_merge) instead"
    )
    ap.add_argument("--moe-gb", type=float, default=1.1, help="--adapter: the MoE's GiB in bf16")
    ap.add_argument("--experts", type=int, default=64, help="--adapter: the MoE's experts")
    ap.add_argument("--hidden", type=int, default=1024, help="--adapter: the MoE's hidden size")
    ap.add_argument(
        "--worker", nargs=4, metavar=("MODE", "BASE", "TUNED", "OUT"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.worker:
        sys.path.insert(0, str(REPO))
        worker(*args.worker, args.shard_mb)
        return

    sys.path.insert(0, str(REPO))
    if args.adapter:
        adapter_bench(args.moe_gb, args.shard_mb or 200, args.experts, args.hidden)
        return
    # KiB -> MiB
    mib = 1 / 1024
    print(
        f"output shards: {args.shard_mb or 2048} MB (streaming); memory in MiB; "
        "RssAnon sampled every 10 ms"
    )
    print(
        "others: share of the machine's CPU used by other processes during the merge (skews times)"
    )
    for millions in [float(s) for s in args.sizes.split(",")]:
        config = qwen3_config(millions)
        with tempfile.TemporaryDirectory(prefix="merge_memory_") as tmp:
            tmp = Path(tmp)
            n = build(config, 0, tmp / "base")
            build(config, 1, tmp / "tuned")
            size = sum(f.stat().st_size for f in (tmp / "base").glob("*.safetensors"))
            stream = measure("stream", tmp / "base", tmp / "tuned", tmp / "stream", args.shard_mb)
            load = measure("load", tmp / "base", tmp / "tuned", tmp / "load", args.shard_mb)
            diff = max_abs_diff(tmp / "stream", tmp / "load")
        print(
            f"\n{n / 1e6:.1f}M parameters "
            f"({config.num_hidden_layers} layers x {config.hidden_size}), "
            f"{size / 2**20:.0f} MiB per checkpoint"
        )
        print(
            f"{'method':<12}{'seconds':>9}{'anon start':>12}{'peak anon':>11}{'peak-start':>12}"
            f"{'VmHWM':>9}{'others':>8}"
        )
        for name, r in (("streaming", stream), ("load both", load)):
            print(
                f"{name:<12}{r['seconds']:>9.2f}{r['start_anon'] * mib:>12.0f}"
                f"{r['peak_anon'] * mib:>11.0f}{(r['peak_anon'] - r['start_anon']) * mib:>12.0f}"
                f"{r['hwm'] * mib:>9.0f}{r['others']:>8.0%}"
            )
        net = (load["peak_anon"] - load["start_anon"]) / (
            stream["peak_anon"] - stream["start_anon"]
        )
        print(
            f"{'load/stream':<12}{load['seconds'] / stream['seconds']:>9.2f}{'':>12}"
            f"{load['peak_anon'] / stream['peak_anon']:>11.2f}{net:>12.2f}"
            f"{load['hwm'] / stream['hwm']:>9.2f}"
        )
        print(f"max abs diff between the two outputs: {diff:.3g}")


if __name__ == "__main__":
    main()
