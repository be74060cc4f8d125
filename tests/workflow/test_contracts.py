"""The contracts the stage modules declare (stages/contract.py) and the shell lines generated from
them: every rule's line is `Contract.shell`'s, and the workflow refuses, while its DAG is built, a
rule that lacks a name its line takes (test_rules.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from stillroom.cli import STAGES, build_parser
from stillroom.config import StageParams
from stillroom.stages.contract import PARAMS, Contract, contracts, shell_problems, stage


def _stage_of(function: Callable[..., Any], **kwargs: Any) -> Contract:
    kwargs.setdefault("outputs", ("model",))
    stage("probe", params=StageParams, help="a probe", **kwargs)(function)
    return function.contract


def _probe(*, graded, base, chat_template, out_model, out_shards, params):
    return None


def test_a_shell_line_takes_each_flag_from_the_rule_name_of_its_spec():
    contract = _stage_of(
        _probe, inputs=("graded*", "base", "chat_template?"), outputs=("model", "shards*")
    )
    head = "stillroom probe --graded {params.graded} --base {input.base:q}"
    outs = " --out-model {output.model:q} --out-shards {params.shards}"
    tail = f" --threads {{threads}} --params {{params.{PARAMS}:q}}"
    # an optional input only where the rule declares it, after the outputs; the rule named like
    # its stage unless it says otherwise
    assert contract.shell() == head + outs + " --rule probe" + tail
    optional = " --chat-template={input.chat_template:q}"
    with_template = contract.shell("probe_more", optional=["chat_template"])
    assert with_template == head + outs + optional + " --rule probe_more" + tail
    assert contract.shell("probe_more", optional={"chat_template": "t.jinja"}) == with_template
    with pytest.raises(ValueError, match=r"stage 'probe': no optional input base \(its inputs: "):
        contract.shell(optional=["base"])


def test_what_a_line_takes_that_its_rule_does_not_declare_is_named():
    line = STAGES["merge"].shell()
    declared = {"input": ["base", "base_prov"], "output": ["model"], "params": [PARAMS]}
    assert shell_problems("merge", line, declared) == [
        "takes input.tuned, which the rule does not declare"
    ]
    assert shell_problems("merge", line, {**declared, "input": ["base", "tuned"]}) == []
    assert shell_problems("merge_again", line, {}) == [
        f"takes input.base, input.tuned, output.model, params.{PARAMS}, which the rule does not "
        "declare",
        "names rule 'merge' (--rule), not its own",
    ]
    # a rule named by a placeholder is the job's (the rules a loop defines)
    assert shell_problems("generate_x", STAGES["merge"].shell("{params.rule_name}"), {}) == [
        f"takes input.base, input.tuned, output.model, params.rule_name, params.{PARAMS}, which "
        "the rule does not declare"
    ]


def _filled(line: str) -> list[str]:
    """A generated line as its job would run it: each `{kind.NAME}` a value naming what it came
    from, several `NAME=PATH` for a params list."""
    values = {"threads": "3", f"params.{PARAMS}": '{"seed": 1}'}

    def value(match: re.Match) -> str:
        key = match[1]
        if key in values:
            return shlex.quote(values[key])
        kind, name = key.split(".")
        return f"{name}-a={name}.1 {name}-b={name}.2" if kind == "params" else f"{kind}-{name}"

    return shlex.split(re.sub(r"\{([\w.]+)(?::q)?\}", value, line))


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_stages_line_is_what_its_cli_parses(name):
    # every optional input given: the line the CLI's parser (built from the same contract) reads
    contract = STAGES[name]
    optional = [s.rstrip("?") for s in contract.inputs if s.endswith("?")]
    tokens = _filled(contract.shell("a_rule", optional=optional))
    assert tokens[:2] == ["stillroom", name]
    args = vars(build_parser().parse_args(tokens[1:]))
    assert [args[k] for k in ("command", "rule", "threads", "params")] == [
        name, "a_rule", 3, '{"seed": 1}'
    ]  # fmt: skip

    def expected(kind: str, spec: str) -> str | list[str]:
        n = spec.rstrip("*?")
        return [f"{n}-a={n}.1", f"{n}-b={n}.2"] if "*" in spec else f"{kind}-{n}"

    for spec in contract.inputs:
        assert args[spec.rstrip("*?")] == expected("input", spec), spec
    for spec in contract.outputs:
        assert args["out_" + spec.rstrip("*")] == expected("output", spec), spec


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
