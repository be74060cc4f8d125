"""Config validation: unit tests on the validator and parse-time failures of the real workflow."""

import pytest

from stillroom.config import ConfigError, config_hash, validate

from ..conftest import default_config, run_snakemake


def test_default_config_is_valid():
    validate(default_config())


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["train"].update(lr_typo=1), r"train: unknown key\(s\) 'lr_typo'"),
        (lambda c: c["train"].update(lr="fast"), r"train.lr: 'fast' is not of type 'number'"),
        (
            lambda c: c["merge"].update(ratios=[0.5, 1.5]),
            r"merge.ratios.1: 1.5 is greater than or equal to",
        ),
        (
            lambda c: c["generation"].update(samples_per_prompt=0),
            r"generation.samples_per_prompt: 0 is less than",
        ),
        (lambda c: c.update(colour="blue"), r"<top level>: unknown key\(s\) 'colour'"),
        (
            lambda c: c["generation"].update(teacher="gpt"),
            r"generation.teacher: 'gpt' is not a key of teachers",
        ),
        (
            lambda c: c["dataset"].update(default_effort="xhigh"),
            r"dataset.default_effort: 'xhigh' is not in",
        ),
        (lambda c: c["eval"].update(benchmarks=["aime"]), r"eval.benchmarks.0: 'aime' is neither"),
        (
            lambda c: c["student"].update(effort_tag="{effort}"),
            r"student.effort_tag: .* does not match",
        ),
        (
            lambda c: c["sources"].append({"name": "x", "kind": "jsonl"}),
            r"sources.3 \(x\): kind 'jsonl' needs key 'path'",
        ),
        (
            lambda c: c["eval"]["budget_force"].update(models=["sft", "merge-0.9"]),
            r"eval.budget_force.models.1: 'merge-0.9' is not one of base, sft, merge-0.3",
        ),
        (
            lambda c: c["merge"].update(select_on="heldout"),
            r"merge.select_on: 'heldout' is also a reported benchmark",
        ),
        (
            lambda c: c["heldout"].update(dev_size=0),
            r"merge.select_on: 'dev' needs heldout.dev_size > 0",
        ),
        (
            lambda c: c["merge"].update(select_on="aime"),
            r"merge.select_on: 'aime' is neither 'dev' nor",
        ),
        (lambda c: c["train"].update(method="qlora8"), r"train.method: 'qlora8' is not one of"),
        (
            lambda c: c["student"].update(weight_hooks=[{"fn": "renorm_rows"}]),
            r"student.weight_hooks.0: 'match' is",
        ),
    ],
)
def test_bad_config_names_the_key(mutate, message):
    cfg = default_config()
    mutate(cfg)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_config_hash_is_canonical():
    a, b = default_config(), default_config()
    b = dict(reversed(list(b.items())))
    assert config_hash(a) == config_hash(b)
    a["seed"] += 1
    assert config_hash(a) != config_hash(b)


@pytest.mark.slow
def test_snakemake_rejects_bad_config_before_any_job(tmp_path, small_cfg):
    small_cfg["train"]["lr"] = -1
    small_cfg["eval"]["temprature"] = 0.5
    proc = run_snakemake(tmp_path, small_cfg, "-n", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "train.lr" in out and "eval: unknown key(s) 'temprature'" in out
    assert not (tmp_path / "results" / "small" / "pool").exists()
