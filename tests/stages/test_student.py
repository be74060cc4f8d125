"""The student stages: `stillroom tiny`, a random-weight model of a real one's architecture,
shrunk."""

import json

import yaml

from stillroom.config import Experiment, merge_configs
from stillroom.plan.dag import model_source
from stillroom.stages import student

from ..conftest import REPO, default_config, recipe_files


def test_tiny_model_like_a_real_one_keeps_its_architecture(moe, tmp_path):
    """`stillroom tiny` reads only the reference's config and tokenizer (here the tiny MoE stands in
    for a real checkpoint) and shrinks it further, keeping the family and the routing."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from stillroom.cli import main

    root, _ = moe
    params = (
        '{"like": "%s", "shrink": {"num_hidden_layers": 1, "num_experts": 2, "hidden_size": 16}}'
        % (root / "base")
    )
    assert main(["tiny", "--out-model", str(tmp_path / "tiny"), "--params", params]) == 0
    ref, tiny = (
        AutoConfig.from_pretrained(root / "base"),
        AutoConfig.from_pretrained(tmp_path / "tiny"),
    )
    assert tiny.model_type == ref.model_type == "qwen3_moe"
    assert (
        tiny.num_hidden_layers,
        tiny.num_experts,
        tiny.hidden_size,
        tiny.num_experts_per_tok,
    ) == (1, 2, 16, 2)
    assert tiny.vocab_size == ref.vocab_size
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    assert model.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 2
    assert (tmp_path / "tiny" / "tokenizer.json").exists()
    # its sidecar tells the tables that a student `pretrained` from it has random weights
    from stillroom.stages.student import random_weights

    assert random_weights(str(tmp_path / "tiny"))
    assert (
        main(
            [
                "tiny",
                "--out-model",
                str(tmp_path / "bad"),
                "--params",
                '{"like": "%s", "shrink": {"num_loops": 2}}' % (root / "base"),
            ]
        )
        == 2
    )


def test_random_weights_names_a_base_built_from_scratch_or_by_the_tiny_stage(tmp_path):
    from stillroom.provenance.sidecars import sidecar_path
    from stillroom.stages.student import random_weights

    assert random_weights(None)  # student.pretrained unset: the base stage's random init
    tiny, real = tmp_path / "tiny", tmp_path / "real"
    for model, stage in ((tiny, "tiny"), (real, "pretrained")):
        model.mkdir()
        sidecar_path(model).write_text(json.dumps({"stage": stage}))
    assert random_weights(str(tiny))
    assert not random_weights(str(real))
    assert not random_weights("Qwen/Qwen3-8B-Base")  # a hub id: pretrained


def test_the_student_jobs_params_are_the_student_section_s():
    exp = Experiment.parse(default_config())
    tokenizer = json.loads(student.tokenizer_job_params(exp).as_param())
    assert tokenizer == {"seed": exp.seed, **exp.student.tokenizer.dump()}
    base = json.loads(student.base_job_params(exp).as_param())
    assert base == {"seed": exp.seed, "model": exp.student.model.dump()}
    # a pretrained student: its source as resolved against the repository
    config: dict = {}
    for path in recipe_files(REPO / "config/experiments/beam-distill.yaml"):
        config = merge_configs(config, yaml.safe_load(path.read_text()))
    beam = Experiment.parse(config)
    source = model_source(beam.student.pretrained, REPO)
    job = json.loads(student.pretrained_job_params(beam, source).as_param())
    assert job == {"seed": beam.seed, "pretrained": beam.student.pretrained}
