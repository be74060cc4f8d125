"""What expert parallelism does to the tiny MoE on every rank of a launcher job: the model loaded
by the training path (stillroom.runtime.sft.load_model) and how its experts are laid out, then
PEFT's LoRA on the fused experts and the error its forward raises. test_expert_parallel spawns it
on 2 gloo ranks."""

import os


def probe(*, base, params, threads, out_dir, log):
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.distributed.tensor import DTensor

    from stillroom.config import Train
    from stillroom.runtime.sft import load_model

    torch.set_num_threads(threads)
    p = Train.parse(params, where="train")
    model = load_model(base, p)
    experts = model.model.layers[0].mlp.experts
    weight = experts.gate_up_proj
    dense = model.model.layers[0].self_attn.q_proj.weight
    layout = {
        "world_size": int(os.environ["WORLD_SIZE"]),
        "local_experts": experts.num_experts,
        "experts_global": list(weight.shape),
        "experts_local": list(weight.to_local().shape),
        "experts_mesh": list(weight.device_mesh.mesh_dim_names),
        "dense_local": list(dense.to_local().shape),
        "dense_global": list(dense.shape),
        "dense_is_dtensor": isinstance(dense, DTensor),
    }
    lora = LoraConfig(
        r=4,
        lora_alpha=8,
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )
    ids = torch.arange(16).view(1, 16)
    try:
        get_peft_model(model, lora)(input_ids=ids, labels=ids).loss.backward()
        error = None
    except RuntimeError as exc:
        error = str(exc)
    log(f"layout {layout}; LoRA on the experts: {error}")
    return {"layout": layout, "expert_lora_error": error}


if __name__ == "__main__":
    # the entry point of the workers the tests spawn (stillroom.runtime.launch.spawn)
    from stillroom.runtime.launch import serve

    serve(probe)
