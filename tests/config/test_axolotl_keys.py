"""Every training key a user of the MoE guide writes, as the guide and Axolotl's MoE examples spell
it, is either taken (same name, same meaning) or refused naming where its setting goes here, why
there is none, or what this repository does not ship: never the bare "unknown key"."""

import re
import typing

import pytest
from pydantic import BaseModel

from stillroom.config import ConfigError, StageParams, Train
from stillroom.config.experiment import Experiment

# The MoE guide: Axolotl's fine-tuning guide for Beam, the 501B MoE (issue 40's seed 000).
GUIDE = "the Beam MoE guide"
# Axolotl's MoE example configs and config schema, read at this commit.
AX = "axolotl-ai-cloud/axolotl@067b021c8b87a9e5e380b9173c704cf7340e30f5:"
EP_LORA = AX + "examples/expert_parallel/qwen3_30ba3b_ep_lora_4gpu.yaml"
EP_FSDP = AX + "examples/expert_parallel/qwen3_30ba3b_ep_fsdp_fft_4gpu.yaml"
QWEN35 = AX + "examples/qwen3.5/35b-a3b-moe-qlora-fsdp.yaml"
QWEN3_NEXT = AX + "examples/qwen3-next/qwen3-next-80b-a3b-qlora.yaml"
DSV4 = AX + "examples/deepseek-v4/v4-flash-nvfp4-lora.yaml"
DSV2 = AX + "examples/deepseek-v2/qlora-fsdp-2_5.yaml"
GEMMA4 = AX + "examples/gemma4/26b-a4b-moe-bnb-lora.yaml"
DBRX = AX + "examples/archived/dbrx/16bit-lora.yaml"
MIXTRAL = AX + "examples/mistral/mixtral/mixtral-qlora-fsdp.yml"
GPT_OSS = AX + "examples/gpt-oss/gpt-oss-20b-sft-lora-singlegpu.yaml"

# (key, a value the source writes, the source)
ELSEWHERE = [
    ("base_model", "Qwen/Qwen3-30B-A3B-Instruct-2507", EP_LORA),
    ("learning_rate", 0.0002, QWEN35),
    ("num_epochs", 1, QWEN35),
    ("micro_batch_size", 1, QWEN35),
    ("gradient_accumulation_steps", 2, QWEN35),
    ("sequence_len", 2048, QWEN35),
    ("optimizer", "adamw_torch_4bit", QWEN35),
    ("adapter", "qlora", GUIDE),
    ("lora_r", 16, QWEN35),
    ("lora_alpha", 32, QWEN35),
    ("lora_dropout", 0, QWEN35),
    ("lora_target_modules", ["q_proj", "k_proj", "v_proj", "o_proj"], QWEN35),
    ("lora_target_parameters", ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], GUIDE),
    ("lora_target_linear", True, MIXTRAL),
    ("expert_parallel_size", 4, EP_LORA),
    ("dp_shard_size", 2, EP_FSDP),
    ("fsdp", ["full_shard", "auto_wrap"], MIXTRAL),
    ("fsdp_config", {"fsdp_version": 2, "offload_params": True}, QWEN35),
    ("fsdp_version", 2, DSV4),
    ("warmup_steps", 0.1, EP_LORA),
    ("flash_attention", True, EP_LORA),
    ("bf16", "auto", QWEN35),
    ("seed", 42, EP_LORA),
    ("saves_per_epoch", 1, QWEN35),
    ("resume_from_checkpoint", None, QWEN35),
]
NOTHING_TO_SET = [
    ("sample_packing", True, QWEN35),
    ("pad_to_sequence_len", False, MIXTRAL),
    ("strict", False, QWEN35),
    ("load_in_8bit", False, QWEN3_NEXT),
    ("fp16", None, AX + "examples/kimi-linear/kimi-48b-lora.yaml"),
    ("tf32", True, QWEN35),
    ("gradient_checkpointing_kwargs", {"use_reentrant": False}, QWEN35),
    ("experts_implementation", "grouped_mm", EP_LORA),
    ("model_type", "AutoModelForCausalLM", MIXTRAL),
    ("tokenizer_type", "AutoTokenizer", AX + "examples/jamba/qlora_fsdp_large.yaml"),
    ("trust_remote_code", True, MIXTRAL),
    ("model_config", {"output_router_logits": True}, MIXTRAL),
    ("lora_model_dir", None, QWEN3_NEXT),
    ("lora_modules_to_save", None, AX + "examples/llama-4/do-no-use-fa2/maverick-qlora-fsdp1.yaml"),
    (
        "unfrozen_parameters",
        ["transformer.blocks.[0-7]."],
        AX + "examples/archived/dbrx/fft-ds-zero3.yaml",
    ),
    ("torch_compile", True, AX + "examples/gemma4/26b-a4b-moe-qlora.yaml"),
    ("evals_per_epoch", 4, QWEN35),
    ("val_set_size", 0.0, QWEN35),
]
# (key, value, source, what the refusal names as missing)
NOT_SHIPPED = [
    ("autotune_profiles", {"scattermoe_lora": {"BLOCK_M": 128}}, GUIDE, "ScatterMoE"),
    ("autotune_neighborhood", 1, GUIDE, "ScatterMoE"),
    ("autotune_cache_path", "autotune/b200.json", GUIDE, "ScatterMoE"),
    ("use_sonicmoe", True, GUIDE, "quack-kernels"),
    ("nvfp4_merge_aware", True, GUIDE, "quack-kernels"),
    (
        "cut_cross_entropy",
        True,
        AX + "src/axolotl/integrations/cut_cross_entropy/args.py",
        "Cut Cross Entropy",
    ),
    ("use_scattermoe", True, DSV4, "ScatterMoE"),
    ("use_kernels", True, DSV4, "kernels hub"),
    ("lora_mlp_kernel", True, DSV4, "fused LoRA Triton kernels"),
    ("lora_qkv_kernel", True, EP_LORA, "fused LoRA Triton kernels"),
    ("lora_o_kernel", True, EP_LORA, "fused LoRA Triton kernels"),
    ("liger_rms_norm", True, GEMMA4, "Liger Kernel"),
    ("liger_glu_activation", True, GEMMA4, "Liger Kernel"),
    ("liger_layer_norm", True, GEMMA4, "Liger Kernel"),
    ("liger_rope", True, GEMMA4, "Liger Kernel"),
    ("liger_rms_norm_gated", True, GEMMA4, "Liger Kernel"),
    ("liger_fused_linear_cross_entropy", True, DSV2, "Liger Kernel"),
    ("activation_offloading", True, GPT_OSS, "activation offloading"),
    ("model_quantization_config", "Mxfp4Config", GPT_OSS, "Mxfp4Config"),
    (
        "deepspeed",
        "deepspeed_configs/zero3_bf16.json",
        AX + "examples/archived/dbrx/fft-ds-zero3.yaml",
        "DeepSpeed",
    ),
    (
        "llama4_linearized_experts",
        True,
        AX + "examples/llama-4/do-no-use-fa2/maverick-qlora-fsdp1.yaml",
        "Llama 4",
    ),
]
# (plugin as the source lists it, the source, what is missing)
PLUGINS = [
    ("axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin", QWEN35, "Cut Cross Entropy"),
    ("CutCrossEntropyPlugin", "issue 40's finding", "Cut Cross Entropy"),
    ("axolotl.integrations.liger.LigerPlugin", DSV2, "Liger Kernel"),
    ("axolotl.integrations.kernels.KernelsPlugin", DSV4, "kernels plugin"),
    ("axolotl.integrations.expert_parallel.ExpertParallelPlugin", EP_LORA, "expert_parallel_size"),
    (
        "axolotl.integrations.swanlab.SwanLabPlugin",
        AX + "examples/swanlab/lora-swanlab-profiling.yml",
        "Axolotl's plugins",
    ),
]
# Keys train takes under the same name and meaning, with the value the source writes.
TAKEN = [
    ("load_in_4bit", True, GUIDE),
    ("quantize_moe_experts", True, GUIDE),
    ("gradient_checkpointing", True, QWEN35),
    ("attn_implementation", "flash_attention_2", QWEN35),
    ("lr_scheduler", "cosine", QWEN35),
    ("warmup_ratio", 0.1, QWEN35),
    ("weight_decay", 0.0, QWEN35),
    ("logging_steps", 1, QWEN35),
    ("max_steps", 50, EP_LORA),
    ("save_steps", 100, GUIDE),
    ("expert_parallel_backend", "torch", GUIDE),
]
QLORA = {
    "method": "qlora",
    "load_in_4bit": True,
    "lora": {"r": 16, "alpha": 32, "target_modules": ["q_proj"]},
}


def refusal(key, value) -> list[str]:
    with pytest.raises(ConfigError) as err:
        Train.parse({key: value, **({} if key == "lr" else {"lr": 1e-4})}, where="train")
    lines = [line.strip() for line in str(err.value).splitlines()[1:]]
    assert not any("unknown key" in line for line in lines), lines
    return lines


def assert_key_exists(dotted: str) -> None:
    """A full key (train.lora.r, student.pretrained, seed) names a field of the config."""
    model = Experiment
    for name in dotted.split("."):
        annotation = model.model_fields[name].annotation
        kinds = typing.get_args(annotation) or (annotation,)
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)


@pytest.mark.parametrize("key, value, source", ELSEWHERE)
def test_an_axolotl_key_set_elsewhere_here_is_refused_naming_where(key, value, source):
    (line,) = refusal(key, value)
    found = re.match(rf"train\.{key}: Axolotl's key; here it is ((\w+)(\.\w+)*)", line)
    assert found, line
    assert_key_exists(found[1])


@pytest.mark.parametrize("key, value, source", NOTHING_TO_SET)
def test_an_axolotl_key_with_nothing_to_set_is_refused_saying_why(key, value, source):
    (line,) = refusal(key, value)
    assert re.match(rf"train\.{key}: Axolotl's key, nothing to set here: .+; drop it$", line), line


@pytest.mark.parametrize("key, value, source, missing", NOT_SHIPPED)
def test_an_axolotl_key_of_software_not_shipped_is_refused_naming_it(key, value, source, missing):
    (line,) = refusal(key, value)
    assert re.match(rf"train\.{key}: this repository does not ship .*{missing}", line), line


@pytest.mark.parametrize("plugin, source, missing", PLUGINS)
def test_each_axolotl_plugin_is_refused_naming_what_it_needs(plugin, source, missing):
    """plugins is a list: its entries name what is missing, each on its own line."""
    other = (
        "axolotl.integrations.diffusion.DiffusionPlugin"  # examples/llama-3/diffusion/sft-1b.yaml
    )
    lines = refusal("plugins", [plugin, other])
    assert re.match(
        rf"train\.plugins: {re.escape(plugin)}: this repository does not ship .*{missing}",
        lines[0],
    ), lines
    assert lines[1] == f"train.plugins: {other}: this repository does not ship Axolotl's plugins"


def test_the_findings_five_keys_name_what_is_missing():
    """The five keys issue 40 found refused only as unknown."""
    for key, value in (
        ("autotune_profiles", {"scattermoe_lora": {"BLOCK_M": 128}}),
        ("autotune_neighborhood", 1),
        ("plugins", ["CutCrossEntropyPlugin"]),
        ("cut_cross_entropy", True),
        ("use_scattermoe", True),
    ):
        (line,) = refusal(key, value)
        assert re.match(rf"train\.{key}: (.+: )?this repository does not ship ", line), line


def test_cut_cross_entropy_is_refused_as_not_needed():
    """Axolotl's Cut Cross Entropy (the key and the plugin) saves the logits' memory, which the
    loss here (TRL's fused LM head, tests/runtime/test_sft_loss.py) never holds either: the
    refusal says so, never that the loss here holds full logits."""
    plugin = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
    for key, value in (("cut_cross_entropy", True), ("plugins", [plugin])):
        (line,) = refusal(key, value)
        assert "nor needs it: the loss here is TRL's fused LM head" in line, line
        assert "never holds the logits" in line and "full logits" not in line, line


def test_keys_taken_under_the_same_name_and_meaning():
    train = Train.parse(
        {
            **QLORA,
            **{key: value for key, value, _ in TAKEN},
            "distributed": {"gpus_per_node": 2, "fsdp_size": 2},
        }
    )
    assert all(getattr(train, key) == value for key, value, _ in TAKEN)


def test_every_table_entry_is_tested_here():
    """A key added to the tables (stillroom/config/axolotl.py) gets its source and case here."""
    from stillroom.config import axolotl as ax

    assert {k for k, *_ in ELSEWHERE} == set(ax.ELSEWHERE)
    assert {k for k, *_ in NOTHING_TO_SET} == set(ax.NOTHING_TO_SET)
    shipped = {k for k, *_ in NOT_SHIPPED} | {"plugins"}
    assert set(ax.NOT_SHIPPED) <= shipped <= set(Train.not_shipped)


def test_a_sections_own_field_is_never_taken_for_axolotls():
    """A stage's params add the experiment's seed to train's keys: that seed is theirs, not
    Axolotl's seed refused."""

    class StageTrain(StageParams, Train):
        pass

    assert StageTrain.parse({"seed": 3}).seed == 3
    with pytest.raises(ConfigError, match=r"train.seed: Axolotl's key; here it is seed"):
        Train.parse({"seed": 3}, where="train")
