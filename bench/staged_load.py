"""Load time of the staged NF4 loader (stillroom/runtime/nf4.py load_staged) on 2 gloo ranks, for
this checkout and, with --before, another one (e.g. a worktree of an earlier commit), on the same
random checkpoint in the same run.

A random-weight Qwen3-MoE (bf16, experts saved one by one as transformers saves them; the writer
of bench/moe_qlora_memory.py) of --layers decoder layers is loaded by 2 CPU ranks (torchrun, gloo,
one thread each, as the launcher starts them) with LoRA r=8 on attention and on the fused experts.
Each rank reports its wall and CPU seconds for the load and the parameters it holds in NF4 (the
whole model's quantised weights, sharded over the ranks). The rate printed is the model's
quantised parameters per second of load wall time on each rank, and, for the extrapolation, per
CPU-second of one process: Beam (cost.estimate.models.reflection/beam's architecture in the
shipped overlays, ~498B quantised parameters) on the 8 processes of one node, each on a CPU core
as here. Prints numbers only.

    .venv/bin/python bench/staged_load.py [--layers 16] [--experts 16] [--hidden 1024]
        [--moe-intermediate 512] [--before DIR] [--dir DIR]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Beam's quantised parameters (attention and experts of its 48 layers) under the overlays'
# architecture figures; stillroom.plan.estimate computes the same from them
BEAM_QUANTISED = 48 * (6144 * (2 * 8192 + 2 * 1024) + 256 * 3 * 6144 * 2176)
NODE_PROCESSES = 8


def worker(model_dir: str) -> None:
    """One rank: load; rank 0 prints every rank's numbers as a JSON line."""
    import torch
    import torch.distributed as dist
    from moe_qlora_memory import lora_config, report
    from torch.distributed.tensor import DTensor
    from torchao.quantization import NF4Tensor

    from stillroom.runtime.nf4 import load_staged

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    lora = lora_config()
    lines: list[str] = []
    dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    model = load_staged(model_dir, lora, dtype=torch.bfloat16, log=lines.append)
    mine = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    # the loader says when the ranks split each weight's quantisation between them
    mine["split"] = any("of it here" in line for line in lines)
    quantised = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        quantised += p.numel() if isinstance(local, NF4Tensor) else 0
    mine["quantised"] = quantised
    report(mine)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16, help="decoder layers")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--moe-intermediate", type=int, default=512)
    ap.add_argument("--before", help="another checkout of the repository, measured the same way")
    ap.add_argument("--dir", help="write the checkpoint here (default: a temporary directory)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "bench"))
    from moe_qlora_memory import moe_config, on_two_ranks, write_checkpoint

    def config_of(depth: int):
        return moe_config(depth, args.experts, args.hidden, args.moe_intermediate)

    codes = {"this checkout": REPO}
    if args.before:
        codes = {f"before ({args.before})": Path(args.before).resolve(), **codes}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        model_dir = write_checkpoint(Path(tmp), [args.layers], config_of)[args.layers]
        print(
            f"{args.layers} layers, {args.experts} experts, hidden {args.hidden}, "
            f"moe_intermediate {args.moe_intermediate}; 2 gloo ranks, 1 thread each"
        )
        print(
            "code | rank | split | quantised params | load wall s | load CPU s | "
            "M params quantised / CPU s of this process | Beam's load on 8 processes (h)"
        )
        for label, code in codes.items():
            for rank, m in enumerate(on_two_ranks(__file__, model_dir, code)):
                share = 1 / 2 if m["split"] else 1
                per_cpu = m["quantised"] * share / m["cpu_s"]
                # the wall time scales with the parameters a process quantises
                beam_s = m["wall_s"] * BEAM_QUANTISED / m["quantised"]
                beam_s *= (2 / NODE_PROCESSES) if m["split"] else 1
                print(
                    f"{label} | {rank} | {'yes' if m['split'] else 'no'} | "
                    f"{m['quantised'] / 1e6:.1f}M | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | "
                    f"{per_cpu / 1e6:.2f} | {beam_s / 3600:.1f}"
                )


if __name__ == "__main__":
    main()
