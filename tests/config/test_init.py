"""The config as the workflow resolves it: the embedded default is valid, a bad config names the key
and what was wrong, and the config hash is canonical."""

import pytest
import yaml

from stillroom.config import (
    ConfigError,
    Experiment,
    config_hash,
    load_yaml,
    merge_configs,
    resolve,
    schema,
    workflow_config,
)

from ..conftest import REPO, default_config, recipe_files


def test_default_config_is_valid():
    resolve(default_config(), root=REPO)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda c: c["train"].update(lr_typo=1), r"train: unknown key 'lr_typo'"),
        (lambda c: c["train"].update(lr="fast"), r"train.lr: Input should be a valid number"),
        (
            lambda c: c["merge"].update(ratios=[0.5, 1.5]),
            r"merge.ratios.1: Input should be less than 1",
        ),
        (
            lambda c: c["generation"].update(samples_per_prompt=0),
            r"generation.samples_per_prompt: Input should be greater than or equal to 1",
        ),
        (lambda c: c.update(colour="blue"), r"unknown key 'colour'"),
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
            r"student.effort_tag: String should match",
        ),
        (
            lambda c: c["sources"].append({"name": "x", "kind": "jsonl"}),
            r"sources.3.path: required key missing",
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
            r"merge.select_on: 'aime' is neither heldout nor dev nor",
        ),
        (
            lambda c: c["train"].update(method="qlora8"),
            r"train.method: Input should be 'full', 'lora' or 'qlora'",
        ),
        (
            lambda c: c["student"].update(weight_hooks=[{"fn": "renorm_rows"}]),
            r"student.weight_hooks.0.match: required key missing",
        ),
        (
            lambda c: c["dataset"].update(select="first"),
            r"dataset.select: Input should be 'shortest', 'random', 'longest', 'all' or",
        ),
        (
            lambda c: c["dataset"].update(ablation=["random", "random"]),
            r"dataset.ablation: each selection may be listed once",
        ),
        (
            lambda c: c["dataset"].update(ablation=["shortest"]),
            r"dataset.ablation: 'shortest' is dataset.select, the fine-tune itself",
        ),
        (
            lambda c: (
                c["dataset"].update(ablation=["random"]),
                c["train"].pop("epochs"),
                c["train"].update(phases=[{"name": "a", "epochs": 1}, {"name": "b", "epochs": 1}]),
            ),
            r"dataset.ablation: each selection is fine-tuned in one run of train's settings",
        ),
    ],
)
def test_bad_config_names_the_key(mutate, message):
    cfg = default_config()
    mutate(cfg)
    with pytest.raises(ConfigError, match=message):
        resolve(cfg, root=REPO)


def test_each_selection_of_the_ablation_is_a_model_after_sft():
    cfg = default_config()
    cfg["dataset"]["ablation"] = ["unfiltered", "random"]
    exp = resolve(cfg, root=REPO)
    models = Experiment.parse(exp).models
    assert models[:4] == ["base", "sft", "select-unfiltered", "select-random"]


def test_config_hash_is_canonical():
    a, b = default_config(), default_config()
    b = dict(reversed(list(b.items())))
    assert config_hash(a) == config_hash(b)
    a["seed"] += 1
    assert config_hash(a) != config_hash(b)


def test_yaml_errors_name_the_file_and_line(tmp_path):
    tabbed = tmp_path / "tabbed.yaml"
    tabbed.write_text("experiment: x\nseed: 1\n\tsources: []\n")
    with pytest.raises(ConfigError, match=rf"^{tabbed}:3:1: not valid YAML: found character '\\t'"):
        load_yaml(tabbed)
    nested = tmp_path / "nested.yaml"
    nested.write_text("train:\n  lr: 0.1\n  epochs: 2\n  lr: 0.2\n")
    with pytest.raises(
        ConfigError, match=rf"{nested}:4: key 'lr' is given twice \(first on line 2\)"
    ):
        load_yaml(nested)
    listed = tmp_path / "listed.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping of config sections, got list"):
        load_yaml(listed)
    with pytest.raises(ConfigError, match="cannot read"):
        load_yaml(tmp_path / "missing.yaml")


def test_the_workflow_config_is_the_default_under_overrides_or_the_given_files(tmp_path):
    default = REPO / "config" / "config.yaml"
    # No config file: the embedded default, with --config values merged into it key by key.
    resolved = workflow_config({"seed": 7, "train": {"lr": 0.01}}, [], default, REPO)
    assert resolved["seed"] == 7 and resolved["train"]["lr"] == 0.01
    assert resolved["train"]["epochs"] == default_config()["train"]["epochs"]
    # Config files: what Snakemake merged is resolved; each file is read again for duplicates.
    given = tmp_path / "given.yaml"
    given.write_text((default.read_text()).replace("seed: 1234", "seed: 5"))
    config = {**default_config(), "seed": 5}
    assert workflow_config(config, [given], default, REPO)["seed"] == 5
    given.write_text(given.read_text() + "seed: 6\n")
    with pytest.raises(ConfigError, match="key 'seed' is given twice"):
        workflow_config(config, [given], default, REPO)


def test_merge_configs_merges_mappings_and_replaces_the_rest():
    base = {"train": {"lr": 1, "distributed": {"nodes": 2}}, "merge": {"ratios": [0.5]}}
    over = {"train": {"distributed": {"gpus_per_node": 4}}, "merge": {"ratios": [0.3]}}
    assert merge_configs(base, over) == {
        "train": {"lr": 1, "distributed": {"nodes": 2, "gpus_per_node": 4}},
        "merge": {"ratios": [0.3]},
    }


def test_the_schema_agrees_with_the_typed_config():
    """The generated schema accepts every recipe resolved and refuses an unknown key, as the
    typed config does. (Typed only: a smoke twin's stand-in models are built by `stillroom
    stand-ins`, and resolve checks that they are there.)"""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    for path in [
        REPO / "config" / "config.yaml",
        *(REPO / "config" / "experiments").glob("*.yaml"),
    ]:
        files = recipe_files(path)
        raw = load_yaml(files[0])
        for overlay in files[1:]:
            raw = merge_configs(raw, load_yaml(overlay))
        validator.validate(Experiment.parse(raw).dump())
    bad = {**resolve(default_config(), root=REPO), "evals": {}}
    assert not validator.is_valid(bad)


def _loaded(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_yaml(path)


def test_merge_keys_merge_as_yaml_and_snakemake_read_them(tmp_path):
    # `<<` was built as a key before merging ("could not determine a constructor for the tag
    # 'tag:yaml.org,2002:merge'"); a key written beside it overrides the merged one.
    text = (
        "base: &base\n  lr: 0.1\n  epochs: 2\n"
        "train:\n  <<: *base\n  lr: 0.2\n"
        "size: &size {hidden_size: 8}\nheads: &heads {num_heads: 2}\n"
        "model: {<<: [*size, *heads], tie: true}\n"
        "twice: {<<: [*size, *size]}\n"
    )
    loaded = _loaded(tmp_path, text)
    assert loaded["train"] == {"lr": 0.2, "epochs": 2}
    assert loaded["model"] == {"hidden_size": 8, "num_heads": 2, "tie": True}
    assert loaded["twice"] == {"hidden_size": 8}
    assert loaded == yaml.load(text, Loader=yaml.FullLoader)  # what Snakemake's loader reads
    # a merged mapping with a merge of its own, merged again: no key of it is a duplicate
    nested = "a: &a {x: 1}\nb: &b\n  <<: *a\n  y: 2\nc:\n  <<: *b\n  x: 3\n"
    assert _loaded(tmp_path, nested)["c"] == {"x": 3, "y": 2}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # a real duplicate beside a merge is still refused
        (
            "a: &a {x: 1}\nb:\n  <<: *a\n  y: 1\n  y: 2\n",
            ":5: key 'y' is given twice (first on line 4)",
        ),
        ("a: {x: 1, x: 2}\n", ":1: key 'x' is given twice (first on line 1)"),
        (
            "a: &a {x: 1}\nb: &b {y: 1}\nc:\n  <<: *a\n  <<: *b\n",
            ":5: key '<<' is given twice (first on line 4) (merge several mappings with "
            "<<: [*a, *b])",
        ),
        # inside a mapping that is only ever merged
        ("a: {<<: &z {k: 1, k: 2}}\n", ":1: key 'k' is given twice (first on line 1)"),
        # two merged mappings giving one key: YAML takes the first, PyYAML the last
        (
            "a: &a {temperature: 1}\nb: &b {temperature: 2}\nc: {<<: [*a, *b]}\n",
            ":3: key 'temperature' is merged from two mappings (lines 1 and 2), and YAML loaders "
            "disagree on which wins: give 'temperature' in this mapping itself",
        ),
        (
            "z: &z {top_p: 1}\nb: &b\n  <<: *z\n  top_p: 2\nc:\n  <<: *b\n",
            ":6: key 'top_p' is merged from two mappings (lines 1 and 4)",
        ),
        ("a:\n  <<: 3\n", ":2:7: not valid YAML: expected a mapping or list of mappings"),
    ],
)
def test_duplicated_and_ambiguous_keys_are_refused_with_merge_keys(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        _loaded(tmp_path, text)
    assert str(err.value).startswith(str(tmp_path / "c.yaml") + message), str(err.value)


def test_a_key_of_the_mapping_settles_what_its_merges_disagree_on(tmp_path):
    # PyYAML 6 reads temperature 2 here (YAML says 1): refused above, settled by the mapping
    ambiguous = "a: &a {temperature: 1}\nb: &b {temperature: 2}\nc: {<<: [*a, *b]}\n"
    settled = ambiguous.replace("[*a, *b]}", "[*a, *b], temperature: 3}")
    assert _loaded(tmp_path, settled)["c"] == {"temperature": 3}
