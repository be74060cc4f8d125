"""Every rule's shell line against the contract its stage module declares (stages/contract.py): a
known stage, every required flag, no unknown one, and params its Params class accepts. The dry runs
of the default and every recipe check their lines in test_rules.py (one dry run serves both); these
tests check the checker and the contracts themselves."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from stillroom.cli import STAGES
from stillroom.config import ConfigError, StageParams
from stillroom.stages.contract import Contract, contracts, flag, stage


def command_problems(dry_run_output: str) -> tuple[int, list[str]]:
    """The `stillroom <stage>` shell lines of a `snakemake -n -p` output, checked: how many there
    are, and one problem per bad line (naming its rule and what is wrong)."""
    problems: list[str] = []
    count = 0
    rule = "?"
    for line in dry_run_output.splitlines():
        if line.startswith("rule ") and line.endswith(":"):
            rule = line[5:-1]
        if not line.startswith("Shell command: stillroom "):
            continue
        count += 1
        command = line.removeprefix("Shell command: ")
        problems += [f"rule {rule}: {p}" for p in check_command(command)]
    return count, problems


def check_command(command: str) -> list[str]:
    """What is wrong with one `stillroom <stage> ...` shell line (empty: nothing)."""
    tokens = shlex.split(command)
    if ">>" in tokens:  # the rule's log redirection
        tokens = tokens[: tokens.index(">>")]
    name = tokens[1]
    if name not in STAGES:
        return [f"unknown stage '{name}' (known: {', '.join(STAGES)})"]
    contract = STAGES[name]
    required, optional = contract.flags()
    values: dict[str, list[str]] = {}
    current = None
    for token in tokens[2:]:
        if token.startswith("--"):
            current = token
            values.setdefault(current, [])
        elif current is None:
            return [f"{name}: '{token}' before any flag"]
        else:
            values[current].append(token)
    problems = [f"{name}: missing {f}" for f in sorted(required - set(values))]
    problems += [f"{name}: unknown flag {f}" for f in sorted(set(values) - required - optional)]
    multi = {f"--{flag(s)}" for s in contract.inputs if s.endswith("*")}
    multi |= {f"--out-{flag(s)}" for s in contract.outputs if s.endswith("*")}
    for f, given in values.items():
        if f in multi:
            continue
        if len(given) != 1:
            problems.append(f"{name}: {f} takes one value, given {len(given)}")
    if "--params" not in values:
        problems.append(f"{name}: no --params")
    elif len(values["--params"]) == 1:
        try:
            contract.params.parse(json.loads(values["--params"][0]), where=name)
        except (ConfigError, json.JSONDecodeError) as exc:
            problems.append(f"{name}: --params: {exc}")
    return problems


GOOD = (
    "stillroom merge --base b --tuned t --out-model m --rule merge --threads 1 "
    """--params '{"seed": 1, "ratio": 0.5, "weight_hooks": []}' >> log 2>&1"""
)


def test_a_good_line_passes_and_each_kind_of_bad_line_is_named():
    assert check_command(GOOD) == []
    assert check_command(GOOD.replace("merge --base", "mrege --base"))[0].startswith(
        "unknown stage 'mrege'"
    )
    assert check_command(GOOD.replace("--tuned t ", "")) == ["merge: missing --tuned"]
    assert check_command(GOOD.replace("--tuned t", "--tuned t --tunned u")) == [
        "merge: unknown flag --tunned"
    ]
    assert check_command(GOOD.replace("--base b", "--base b c")) == [
        "merge: --base takes one value, given 2"
    ]
    bad = check_command(GOOD.replace("0.5", "2"))
    assert len(bad) == 1 and bad[0].startswith("merge: --params: ") and "ratio" in bad[0]
    bad = check_command(GOOD.replace('"seed": 1', '"sed": 1'))
    assert "unknown key 'sed' (did you mean 'seed'?)" in bad[0]


def test_the_dry_run_reader_names_the_rule():
    output = f"rule merge:\n    input: b\nShell command: {GOOD.replace('--tuned t ', '')}\n"
    output += "rule all:\nShell command: None\n"
    assert command_problems(output) == (1, ["rule merge: merge: missing --tuned"])


def test_every_stage_declares_a_stage_params_and_no_other_seed():
    for name, contract in STAGES.items():
        assert issubclass(contract.params, StageParams), name
        own = [c for c in contract.params.__mro__ if "seed" in vars(c).get("__annotations__", {})]
        assert own == [StageParams], f"{name}: seed declared again in {own}"
        assert contract.function.contract is contract, name


def test_a_rule_named_like_its_stage_where_it_has_one():
    # the step that picks a merge ratio: one name for the rule, the CLI stage and the function
    assert STAGES["select_merge"].function.__name__ == "select_merge"
    assert "select" not in STAGES


def _stage_of(function: Callable[..., Any], **kwargs: Any) -> Contract:
    stage("probe", params=StageParams, outputs=("model",), help="a probe", **kwargs)(function)
    return function.contract


def test_a_signature_must_match_its_contract():
    def good(*, base, out_model, params, log=print):
        return None

    assert _stage_of(good, inputs=("base?",)).extras == ("log",)

    def catch_all(*, base, out_model, params, **_):
        return None

    with pytest.raises(TypeError, match=r"stage 'probe' .*catch_all\): takes \*\*kwargs"):
        _stage_of(catch_all, inputs=("base",))

    def mismatched(*, model, out_model, params, threads=1):
        return None

    with pytest.raises(
        TypeError, match="does not match its contract: not taken: base; not declared: model"
    ):
        _stage_of(mismatched, inputs=("base",))


def test_a_stage_declared_twice_is_refused():
    import types

    one, two = types.ModuleType("one"), types.ModuleType("two")

    def first(*, out_model, params):
        return None

    def second(*, out_model, params):
        return None

    for module, function in ((one, first), (two, second)):
        function.__module__ = module.__name__
        _stage_of(function)
        setattr(module, function.__name__, function)
    assert list(contracts(one)) == ["probe"]
    with pytest.raises(TypeError, match="stage 'probe' declared twice: one.*first and two.*second"):
        contracts(one, two)


def test_the_cli_lists_the_stages_without_torch_or_sympy():
    # `stillroom --help` imports every stage module: what loads torch, transformers or sympy is
    # imported inside the stage functions
    code = "import sys, stillroom.cli; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    for heavy in ("torch", "transformers", "sympy", "math_verify"):
        assert f"'{heavy}'" not in loaded.stdout, heavy
