"""The merge ratio is chosen on a dev split disjoint from every reported benchmark."""

import pytest

from stillroom.cli import main
from stillroom.config import ConfigError, Experiment, merge_configs
from stillroom.io import DataError, read_json, write_jsonl
from stillroom.stages.merge import Params, choose, job_params, select_merge

from ..conftest import default_config


def graded(path, correct):
    """Graded samples: problem i, 2 samples each, ``correct[i]`` of them right."""
    write_jsonl(
        path,
        [
            {
                "prompt_id": f"p{i}",
                "sample_index": s,
                "grade": {"correct": s < c},
                "completion_tokens": 5,
            }
            for i, c in enumerate(correct)
            for s in range(2)
        ],
    )
    return str(path)


def test_choose_prefers_accuracy_then_less_fine_tune():
    weights = {"merge-0.3": 0.3, "merge-0.5": 0.5, "merge-0.7": 0.7}
    assert choose({"merge-0.3": 0.2, "merge-0.5": 0.4, "merge-0.7": 0.3}, weights) == "merge-0.5"
    assert choose({"merge-0.3": 0.4, "merge-0.5": 0.4, "merge-0.7": 0.4}, weights) == "merge-0.3"


@pytest.fixture
def splits(tmp_path):
    write_jsonl(tmp_path / "dev.jsonl", [{"prompt": f"What is {i} + 1?"} for i in range(4)])
    write_jsonl(tmp_path / "heldout.jsonl", [{"prompt": f"What is {i} + 2?"} for i in range(4)])
    g = {
        "merge-0.3": graded(tmp_path / "a.jsonl", [0, 1, 0, 0]),
        "merge-0.7": graded(tmp_path / "b.jsonl", [2, 2, 1, 0]),
    }
    return tmp_path, g


def test_select_stage_writes_the_choice_with_provenance(splits):
    root, g = splits
    out = root / "selected.json"
    args = [
        "select_merge",
        "--graded",
        *(f"{k}={v}" for k, v in g.items()),
        "--dev",
        str(root / "dev.jsonl"),
        "--reported",
        f"heldout={root / 'heldout.jsonl'}",
        "--out-merge-choice",
        str(out),
        "--params",
        '{"benchmark": "dev", "ratios": {"merge-0.3": 0.3, "merge-0.7": 0.7}}',
    ]
    assert main(args) == 0
    sel = read_json(out)
    assert (
        sel["selected"] == "merge-0.7"
        and sel["ratio"] == 0.7
        and sel["accuracy"]["merge-0.3"] == 0.125
    )
    assert read_json(str(out) + ".prov.json")["stage"] == "select_merge"


def test_a_dev_split_overlapping_a_reported_benchmark_is_refused(splits):
    root, g = splits
    write_jsonl(
        root / "leaky.jsonl", [{"prompt": "what is 2  + 1?"}]
    )  # the same prompt after normalisation
    with pytest.raises(DataError, match="shares 1 prompts with reported benchmark 'leaky'"):
        select_merge(
            graded=g,
            dev=str(root / "dev.jsonl"),
            reported={"leaky": str(root / "leaky.jsonl")},
            out_merge_choice=str(root / "s.json"),
            params={"benchmark": "dev", "ratios": {"merge-0.3": 0.3, "merge-0.7": 0.7}},
            log=lambda _: None,
        )
    assert not (root / "s.json").exists()


def test_select_takes_each_merges_ratio_from_params_not_its_name(splits):
    root, g = splits
    # names that no parse could read a ratio from: the identity's ratio travels in params
    renamed = {"merge-1e-05": g["merge-0.3"], "odd": g["merge-0.7"]}
    out = root / "s.json"
    kwargs = dict(
        graded=renamed,
        dev=str(root / "dev.jsonl"),
        reported={"heldout": str(root / "heldout.jsonl")},
        out_merge_choice=str(out),
        log=lambda _: None,
    )
    select_merge(
        **kwargs, params={"benchmark": "dev", "ratios": {"merge-1e-05": 1e-05, "odd": 0.125}}
    )
    assert read_json(out)["selected"] == "odd" and read_json(out)["ratio"] == 0.125
    with pytest.raises(DataError, match=r"select: odd: no merge ratio in params.ratios"):
        select_merge(**kwargs, params={"benchmark": "dev", "ratios": {"merge-1e-05": 1e-05}})


def test_select_by_tokens_takes_the_cheapest_of_the_merges_tied_with_the_best(tmp_path):
    from stillroom.stages.merge import SelectParams, choose_by_tokens

    def grid(correct, tokens):
        rows = [
            {
                "prompt_id": f"p{i:03d}",
                "sample_index": 0,
                "grade": {"correct": bool(c)},
                "completion_tokens": tokens,
            }
            for i, c in enumerate(correct)
        ]
        path = tmp_path / f"{sum(correct)}-{tokens}.jsonl"
        write_jsonl(path, rows)
        from stillroom.analysis.grids import score_matrix

        return score_matrix(str(path))

    n = 60
    grids = {
        "merge-0.7": grid([1] * 40 + [0] * 20, 100),  # the most accurate
        "merge-0.5": grid([1] * 38 + [0] * 22, 60),  # tied with it, fewer tokens
        "merge-0.3": grid([1] * 10 + [0] * (n - 10), 20),  # cheapest, clearly worse
    }
    weights = {"merge-0.3": 0.3, "merge-0.5": 0.5, "merge-0.7": 0.7}
    p = SelectParams.parse(
        {"benchmark": "dev", "select_by": "tokens", "n_resamples": 2000, "ratios": weights}
    )
    assert choose_by_tokens(grids, weights, p) == "merge-0.5"
    assert choose({m: float(g[1].mean()) for m, g in grids.items()}, weights) == "merge-0.7"


@pytest.mark.parametrize("ratio", [-0.1, 0.0, 1.0, 1.5, float("nan")])
def test_a_merge_ratio_has_one_bound_for_the_config_and_the_job(ratio):
    # 0 and 1 are the base and sft themselves: the config and a hand-typed --params refuse both
    with pytest.raises(ConfigError, match=r"merge\.ratios\.0: Input should be"):
        Experiment.parse(merge_configs(default_config(), {"merge": {"ratios": [ratio]}}))
    with pytest.raises(ConfigError, match=r"merge\.ratio: Input should be"):
        Params.parse({"ratio": ratio}, where="merge")


def test_a_merge_job_takes_its_ratio_from_its_identity():
    exp = Experiment.parse(merge_configs(default_config(), {"merge": {"ratios": [0.125, 1e-05]}}))
    params = job_params(exp, "merge-1e-05")
    assert params.ratio == 1e-05 and params.seed == exp.seed
    assert params.as_param() == f'{{"ratio": 1e-05, "seed": {exp.seed}, "weight_hooks": []}}'
