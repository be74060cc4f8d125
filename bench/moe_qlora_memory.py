"""Peak memory of the staged NF4 QLoRA loader (stillroom/runtime/nf4.py load_staged) on 2 gloo
ranks, against the model's size and one layer's, at two depths.

A random-weight Qwen3-MoE (bf16, experts saved one by one as transformers saves them, one
safetensors shard per decoder layer) is written once at the larger depth; the smaller depth is
the same files under an index and config that stop earlier. For each depth, 2 CPU ranks
(torchrun, gloo, as the launcher starts them) load it with the staged loader (LoRA r=8 on
attention and on the fused experts), then take one AdamW step on 64 tokens. Each rank samples its
RssAnon every 10 ms (VmHWM also counts the page cache of the mapped shards, which is
reclaimable): at start (imports done), its peak while loading, after loading, and its peak over
the step; and the bytes of its shards (NF4 weights, LoRA, frozen bf16 rest).

What to expect: after loading, a rank holds its half of the NF4 model (~28% of bf16 for the
quantised weights) plus its half of embeddings and LM head; the loading peak exceeds that by less
than one decoder layer in bf16 (a layer's attention and one expert's quantisation temporaries),
the same at both depths. The step's peak (CPU autograd, dequantised experts, the root's gathered
embeddings and LM head) is printed for reference. Prints numbers only.

    .venv/bin/python bench/moe_qlora_memory.py [--depths 8,16] [--experts 24] [--hidden 1024]
        [--moe-intermediate 768] [--dir DIR]
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# the RssAnon sampler of the merge bench
sys.path.insert(0, str(REPO / "bench"))

VOCAB = 32000


def moe_config(layers: int, experts: int, hidden: int, moe_intermediate: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * moe_intermediate,
        moe_intermediate_size=moe_intermediate,
        num_experts=experts,
        num_experts_per_tok=4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=hidden // 256,
        head_dim=128,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def write_checkpoint(root: Path, depths: list[int], config_of) -> dict[int, Path]:
    """One directory per depth, sharing the per-layer shard files of the deepest; returns them."""
    import torch
    from safetensors.torch import save_file

    deepest = max(depths)
    files = root / "shards"
    files.mkdir(parents=True, exist_ok=True)
    config = config_of(deepest)
    h, i, e = config.hidden_size, config.moe_intermediate_size, config.num_experts
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * 128
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    weight_map: dict[str, str] = {}
    rest = {
        "model.embed_tokens.weight": rand(VOCAB, h),
        "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "lm_head.weight": rand(VOCAB, h),
    }
    save_file(rest, files / "rest.safetensors")
    weight_map |= dict.fromkeys(rest, "rest.safetensors")
    for layer in range(deepest):
        p = f"model.layers.{layer}."
        tensors = {
            p + "self_attn.q_proj.weight": rand(q, h),
            p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h),
            p + "self_attn.o_proj.weight": rand(h, q),
            p + "self_attn.q_norm.weight": torch.ones(128, dtype=torch.bfloat16),
            p + "self_attn.k_norm.weight": torch.ones(128, dtype=torch.bfloat16),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "mlp.gate.weight": rand(e, h),
        }
        for x in range(e):
            tensors[f"{p}mlp.experts.{x}.gate_proj.weight"] = rand(i, h)
            tensors[f"{p}mlp.experts.{x}.up_proj.weight"] = rand(i, h)
            tensors[f"{p}mlp.experts.{x}.down_proj.weight"] = rand(h, i)
        name = f"layer-{layer:03d}.safetensors"
        save_file(tensors, files / name)
        weight_map |= dict.fromkeys(tensors, name)
    dirs = {}
    for depth in depths:
        out = root / f"depth-{depth}"
        out.mkdir(exist_ok=True)
        config_of(depth).save_pretrained(out)
        kept = {
            k: v
            for k, v in weight_map.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < depth
        }
        for name in set(kept.values()):
            if not (out / name).exists():
                (out / name).symlink_to(files / name)
        index = {"metadata": {}, "weight_map": kept}
        (out / "model.safetensors.index.json").write_text(json.dumps(index))
        dirs[depth] = out
    return dirs


def checkpoint_bytes(model_dir: Path) -> tuple[int, int]:
    """The checkpoint's bytes, and those of its first decoder layer."""
    from safetensors import safe_open

    weight_map = json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]
    total = layer = 0
    for name in set(weight_map.values()):
        with safe_open(model_dir / name, framework="pt") as fh:
            for key in fh.keys():
                if weight_map.get(key) != name:
                    continue
                n = 2 * math.prod(fh.get_slice(key).get_shape())
                total += n
                layer += n if key.startswith("model.layers.0.") else 0
    return total, layer


def worker(model_dir: str) -> None:
    """One rank: load, one step; rank 0 prints every rank's numbers as a JSON line."""
    import torch
    import torch.distributed as dist
    from merge_memory import AnonPeak, status_kib

    from stillroom.runtime.nf4 import load_staged, storage_bytes

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    lora = lora_config()
    start = status_kib("RssAnon")
    t0 = time.perf_counter()
    with AnonPeak() as loading:
        model = load_staged(model_dir, lora, dtype=torch.bfloat16)
    seconds = time.perf_counter() - t0
    loaded = status_kib("RssAnon")
    shards = storage_bytes(model)
    ids = torch.randint(0, VOCAB, (1, 64), generator=torch.Generator().manual_seed(dist.get_rank()))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    with AnonPeak() as stepping:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
    mine = {
        "start": start,
        "load_peak": loading.peak,
        "loaded": loaded,
        "step_peak": stepping.peak,
        "hwm": status_kib("VmHWM"),
        "shard_bytes": shards,
        "seconds": seconds,
        "loss": loss.item(),
    }
    report(mine)


def report(mine: dict) -> None:
    """Every rank's numbers to rank 0, printed as one JSON line (what ``on_two_ranks`` reads);
    then the process group torn down."""
    import torch.distributed as dist

    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(every), flush=True)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


def lora_config():
    """LoRA r=8 on attention and on the fused experts, as the workers load the model with."""
    from peft import LoraConfig

    return LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        task_type="CAUSAL_LM",
    )


def on_two_ranks(script: str, model_dir: Path, code: Path = REPO) -> list[dict]:
    """``script --worker model_dir`` on 2 gloo ranks as the launcher starts them, with the
    stillroom of the checkout ``code`` first on the path; the JSON line rank 0 prints."""
    from stillroom.config import Train
    from stillroom.runtime.launch import command

    layout = Train.parse({"distributed": {"gpus_per_node": 2}}).layout
    cmd = command(layout, [script, "--worker", str(model_dir)])
    # the checkout's package first, not the one the environment installed
    env = {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=code, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        sys.exit(f"staged load ({code}) on 2 ranks failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def measure(model_dir: Path) -> list[dict]:
    return on_two_ranks(__file__, model_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="8,16", help="comma-separated decoder layer counts")
    ap.add_argument("--experts", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--moe-intermediate", type=int, default=768)
    ap.add_argument("--dir", help="write the checkpoints here (default: a temporary directory)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    depths = sorted(int(d) for d in args.depths.split(","))

    def config_of(depth: int):
        return moe_config(depth, args.experts, args.hidden, args.moe_intermediate)

    mib = 1 / 2**20
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        dirs = write_checkpoint(Path(tmp), depths, config_of)
        print(
            "depth | model bf16 MiB | layer bf16 MiB | rank | start | load peak | loaded | "
            "step peak | shards MiB | peak - start - shards | load s   (RssAnon, MiB)"
        )
        for depth in depths:
            total, layer = checkpoint_bytes(dirs[depth])
            for r, m in enumerate(measure(dirs[depth])):
                kib = 1 / 1024
                transient = m["load_peak"] * kib - m["start"] * kib - m["shard_bytes"] * mib
                print(
                    f"{depth:5d} | {total * mib:14.0f} | {layer * mib:14.1f} | {r:4d} | "
                    f"{m['start'] * kib:5.0f} | {m['load_peak'] * kib:9.0f} | "
                    f"{m['loaded'] * kib:6.0f} | {m['step_peak'] * kib:9.0f} | "
                    f"{m['shard_bytes'] * mib:10.0f} | {transient:21.0f} | {m['seconds']:6.1f}"
                )


if __name__ == "__main__":
    main()
