"""MoE routers, one definition for every check that keeps them out of adapters and quantisation:
the config's refusal by spelling (config/training.py Lora), the check of what targets resolve to on
the model (runtime/adapters.py), the NF4 loader's skip list (runtime/nf4.py) and the GPU check of
the merged checkpoint (gpucheck/flagship.py). No torch here: the config imports it."""

from __future__ import annotations

import re

# A router module by its own name in a MoE block, with what it is: the router (mlp.gate; mlp.router
# in other families) and the shared expert's gate (Qwen2-MoE, Qwen3-Next: a per-token sigmoid that
# weighs the shared expert against the routed ones, so adapting it shifts the experts' mix as the
# router's does). A dense MLP's gate_proj and the experts' gate_up_proj are other names.
ROUTERS = {
    "gate": "the router",
    "router": "the router",
    "shared_expert_gate": "the shared expert's gate",
}
ROUTER_NAMES = tuple(ROUTERS)

# A router module by its class, wherever it sits (transformers 5: Qwen3MoeTopKRouter,
# Qwen2MoeTopKRouter, ...).
ROUTER_CLASS = re.compile(r"Router|TopK")

# A name (target, module, parameter or checkpoint tensor) with a router as one of its dotted
# components: mlp.gate, gate.weight, model.layers.3.mlp.router.weight, mlp.shared_expert_gate.
ROUTER_SPELLING = re.compile(rf"(^|\.)({'|'.join(ROUTER_NAMES)})(\.|$)")


def router_role(name: str) -> str | None:
    """What the router that ``name`` reaches is ("the router", "the shared expert's gate"), or
    None when no dotted component of ``name`` is a router's name."""
    found = ROUTER_SPELLING.search(name)
    return ROUTERS[found[2]] if found else None
