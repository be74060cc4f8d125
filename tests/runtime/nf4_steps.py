"""A few QLoRA steps with the base in NF4 (experts included), on one process or on every rank of
an FSDP2 job: the target test_nf4 runs in-process and through the launcher's workers."""

import os

import torch


def token_blocks(base, dataset, steps: int, rows: int, seq: int) -> torch.Tensor:
    """(steps, rows, seq) token ids of the dataset's text, repeated as needed: every row is full,
    so each rank's mean loss weighs as many tokens as every other's."""
    from transformers import AutoTokenizer

    from stillroom.io import read_jsonl

    text = " ".join(m["content"] for row in read_jsonl(dataset) for m in row["messages"])
    ids = torch.tensor(AutoTokenizer.from_pretrained(base)(text)["input_ids"])
    need = steps * rows * seq
    return ids.repeat(need // ids.numel() + 1)[:need].view(steps, rows, seq)


def qlora_steps(*, base, dataset, out_dir, lora, steps, rows, seq, lr, seed, staged, threads, log):
    """Train LoRA over the NF4 base for ``steps`` steps of ``rows`` rows (split over the ranks),
    save the adapter to ``out_dir``; the per-step mean losses and whether every router kept its
    exact weights. The model is loaded whole then quantised and sharded, or by the staged
    loader."""
    from pathlib import Path

    import torch.distributed as dist
    from peft import LoraConfig
    from safetensors.torch import load_file
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from stillroom.runtime.nf4 import (
        NF4Experts,
        NF4Linear,
        fully_shard_layers,
        load_staged,
        nf4_lora,
        quantize_nf4,
        save_adapter,
    )

    torch.set_num_threads(threads)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    blocks = token_blocks(base, dataset, steps, rows, seq)
    routers = {
        k: v
        for k, v in load_file(Path(base) / "model.safetensors").items()
        if k.endswith("mlp.gate.weight")
    }
    if staged:
        model = load_staged(base, LoraConfig(**lora), dtype=torch.float32, seed=seed, log=log)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model.config.use_cache = False
        quantize_nf4(model)
        model = nf4_lora(model, LoraConfig(**lora), seed=seed)
        if world > 1:
            fully_shard_layers(model)
    counts = {
        "linear": sum(isinstance(m, NF4Linear) for m in model.modules()),
        "experts": sum(isinstance(m, NF4Experts) for m in model.modules()),
    }
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for step in range(steps):
        batch = blocks[step].chunk(world)[rank]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        if world > 1:
            dist.all_reduce(mean)
            mean /= world
        losses.append(mean.item())
        log(f"step {step} loss {losses[-1]:.6f}")
    save_adapter(model, out_dir, write=rank == 0)
    after = {
        n.removeprefix("base_model.model."): (p.full_tensor() if isinstance(p, DTensor) else p)
        for n, p in model.named_parameters()
        if n.endswith("mlp.gate.weight")
    }
    unchanged = after.keys() == routers.keys() and all(
        torch.equal(routers[n], after[n]) for n in routers
    )
    if world > 1:
        # every rank past its last collective before any tears gloo down: a rank destroying the
        # group while another's gather is in flight aborted once ("terminate called without an
        # active exception", transformers 5.25's venv)
        dist.barrier()
        dist.destroy_process_group()
    return {"losses": losses, "quantized": counts, "routers_unchanged": unchanged}


def skewed_dispatch(*, threads, log, out_dir):
    """Expert-parallel NF4 experts on every rank against all of them in one process, with LoRA,
    when every row goes to rank 0's experts: rank 1 runs no expert yet takes part in the forward's
    and the backward's collectives. Returns the largest differences."""
    import torch.distributed as dist
    from torch import nn

    from stillroom.runtime.nf4 import NF4Experts

    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    experts, hidden, inner, r = 4, 64, 64, 2
    torch.manual_seed(0)
    gate_up, down = torch.randn(experts, 2 * inner, hidden), torch.randn(experts, hidden, inner)
    held = experts // world
    mine = slice(rank * held, (rank + 1) * held)
    whole = NF4Experts(gate_up.unbind(0), down.unbind(0), nn.SiLU())
    part = NF4Experts(
        gate_up[mine].unbind(0), down[mine].unbind(0), nn.SiLU(), first=mine.start, num_experts=4
    )
    part.group = dist.group.WORLD
    lora = {
        name: (torch.randn(experts * r, fan_in) / 8, torch.randn(out, r * experts) / 8, 2.0)
        for name, out, fan_in in (
            ("gate_up_proj", 2 * inner, hidden),
            ("down_proj", hidden, inner),
        )
    }
    torch.manual_seed(1 + rank)
    x = torch.randn(6, hidden)
    index = torch.randint(0, held, (6, 2))  # rank 0's experts only
    weights = torch.softmax(torch.randn(6, 2), dim=-1)
    diffs = {}
    outs, grads = [], []
    for module in (whole, part):
        xs = x.clone().requires_grad_()
        factors = {
            k: (a.clone().requires_grad_(), b.clone().requires_grad_(), s)
            for k, (a, b, s) in lora.items()
        }
        y = module(xs, index, weights, lora=factors)
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append([xs.grad, *(t.grad for a, b, _ in factors.values() for t in (a, b))])

    def rel(a, b):
        return ((a - b).abs().max() / a.abs().max()).item()

    diffs["output"] = rel(outs[0], outs[1])
    # LoRA gradients: the whole module's on this rank's rows, the expert-parallel one's from the
    # rank that ran each expert, summed over the ranks as FSDP2's reduction sums them
    lora_whole, lora_ep = grads[0][1:], grads[1][1:]
    for t in (*lora_whole, *lora_ep):
        dist.all_reduce(t)
    diffs["input_grad"] = rel(grads[0][0], grads[1][0])
    pairs = zip(lora_whole, lora_ep, strict=True)
    diffs["lora_grad"] = max(rel(a, b) for a, b in pairs)
    dist.barrier()
    dist.destroy_process_group()
    return diffs


def staged_shards(*, base, lora, threads, log, out_dir):
    """Every rank loads ``base`` with the staged loader; each of its NF4 shards is compared, bit
    for bit, with the same shard of the whole model quantised in one piece (``quantize_nf4`` on
    the loaded model, as one process does). Returns every rank's mismatches, the count of NF4
    shards compared and the loader's log lines."""
    import torch.distributed as dist
    from peft import LoraConfig
    from torch.distributed.tensor import DTensor
    from torchao.quantization import NF4Tensor
    from transformers import AutoModelForCausalLM

    from stillroom.runtime.nf4 import load_staged, nf4_lora, quantize_nf4

    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lines: list[str] = []
    staged = load_staged(base, LoraConfig(**lora), dtype=torch.float32, seed=3, log=lines.append)
    whole = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    quantize_nf4(whole)
    whole = dict(nf4_lora(whole, LoraConfig(**lora), seed=3).named_parameters())
    inner = ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean")
    mismatched, compared = [], 0
    for name, p in staged.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        if not isinstance(local, NF4Tensor):
            continue
        compared += 1
        want = torch.chunk(whole[name], world)[rank]
        if not all(torch.equal(getattr(local, t), getattr(want, t)) for t in inner):
            mismatched.append(f"rank {rank}: {name}")
    everyone = [None] * world
    dist.all_gather_object(everyone, (mismatched, compared, lines))
    dist.barrier()
    dist.destroy_process_group()
    return {
        "mismatched": [m for ms, _, _ in everyone for m in ms],
        "compared": [c for _, c, _ in everyone],
        "logs": [line for _, _, ls in everyone for line in ls],
    }


if __name__ == "__main__":
    # the entry point of the workers the tests spawn (stillroom.runtime.launch.spawn)
    from stillroom.runtime.launch import serve

    serve(qlora_steps, skewed_dispatch, staged_shards)
