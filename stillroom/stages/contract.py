"""A stage's contract, declared once beside its function: the CLI name (its rule's name), the typed
params, the inputs and outputs the CLI takes, and its help. ``cli.STAGES`` is built from these, and
every rule's shell line is generated from them (``Contract.shell``).

Kept free of heavy imports: the CLI imports every stage module to list the stages in ``--help``.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..config import StageParams

# What a stage function may take besides its inputs, outputs and params: the job's thread count, the
# progress logger and the job's provenance notes (what it reads besides its inputs), each only where
# the function declares it.
EXTRAS = ("threads", "log", "notes")

F = TypeVar("F", bound=Callable[..., Any])

# Inputs that are a shared server's service file (rules/serve.smk), not an artifact: no sidecar
# records them.
SERVICE_INPUTS = frozenset({"server"})
# The rule's param holding its job's params (its stage's StageParams as JSON), for `--params`.
PARAMS = "stage_params"


@dataclass(frozen=True)
class Contract:
    name: str  # the CLI stage (`stillroom NAME`), named like its rule where it has one
    function: Callable[..., dict[str, Any] | None]
    params: type[StageParams]
    # Flags `--NAME PATH`; a trailing "*" takes several NAME=PATH (or PATH) values (an experiment
    # may have none), "?" is optional. The function takes each as a keyword named NAME.
    inputs: tuple[str, ...]
    # Flags `--out-NAME PATH`, all required; a trailing "*" takes one path or more. The function
    # takes each as `out_NAME`.
    outputs: tuple[str, ...]
    help: str
    extras: tuple[str, ...] = field(init=False)  # which of EXTRAS the function takes

    def __post_init__(self) -> None:
        signature = inspect.signature(self.function)
        where = f"stage '{self.name}' ({self.function.__module__}.{self.function.__qualname__})"
        taken = set(signature.parameters)
        if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            raise TypeError(f"{where}: takes **kwargs; name each input and output instead")
        declared = {*self.input_names, *(f"out_{n}" for n in self.output_names), "params"}
        missing = declared - taken
        unknown = taken - declared - set(EXTRAS)
        if missing or unknown:
            raise TypeError(
                f"{where}: its signature does not match its contract: "
                + "; ".join(
                    f"{what}: {', '.join(sorted(names))}"
                    for what, names in (("not taken", missing), ("not declared", unknown))
                    if names
                )
            )
        object.__setattr__(self, "extras", tuple(e for e in EXTRAS if e in taken))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.rstrip("*?") for spec in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.rstrip("*") for spec in self.outputs)

    def shell(self, rule: str | None = None, *, optional: Iterable[str] = ()) -> str:
        """The command line of a rule that runs this stage, as a Snakemake shell template: each
        input `--NAME {input.NAME:q}`, each output `--out-NAME {output.NAME:q}`, then the optional
        inputs the rule declares (``optional``, by name, `--NAME={input.NAME:q}`), the rule's name
        (default: the stage's), threads and params. A "*" spec's values are the rule's param NAME,
        `NAME=PATH` pairs or paths (an input list would drop the names)."""
        chosen = set(optional)
        unknown = chosen - {s.rstrip("*?") for s in self.inputs if s.endswith("?")}
        if unknown:
            raise ValueError(
                f"stage '{self.name}': no optional input {', '.join(sorted(unknown))} "
                f"(its inputs: {', '.join(self.inputs)})"
            )
        args = [_arg(f"--{flag(s)}", "input", s) for s in self.inputs if not s.endswith("?")]
        args += [_arg(f"--out-{flag(s)}", "output", s) for s in self.outputs]
        # `--NAME=VALUE`: a job of the rule without the input (an empty list) passes `--NAME=`
        args += [
            _arg(f"--{flag(s)}", "input", s, "=") for s in self.inputs if s.rstrip("*?") in chosen
        ]
        tail = f"--rule {rule or self.name} --threads {{threads}} --params {{params.{PARAMS}:q}}"
        return " ".join([f"stillroom {self.name}", *args, tail])


def flag(spec: str) -> str:
    """The flag of an input or output spec, without its dashes (``chat_template?``:
    ``chat-template``); the CLI's parser and the rules' shell lines both take it from here."""
    return spec.rstrip("*?").replace("_", "-")


def _arg(option: str, kind: str, spec: str, sep: str = " ") -> str:
    """One flag of a shell template and its value: a "*" spec's from the rule's param of its name
    (written space-separated), any other from the rule's input or output of its name, quoted."""
    name = spec.rstrip("*?")
    return f"{option} {{params.{name}}}" if "*" in spec else f"{option}{sep}{{{kind}.{name}:q}}"


def shell_problems(rule: str, shell: str, declared: Mapping[str, Collection[str]]) -> list[str]:
    """What is wrong with a rule's shell template, given the names the rule declares of each kind
    (input, output, params): each `{input.NAME}`, `{output.NAME}` or `{params.NAME}` it takes that
    the rule does not declare, and a `--rule` naming another rule (a placeholder is the job's)."""
    taken = re.findall(r"\{(input|output|params)\.(\w+)", shell)
    missing = [f"{kind}.{name}" for kind, name in taken if name not in declared.get(kind, ())]
    problems = [f"takes {', '.join(missing)}, which the rule does not declare"] if missing else []
    named = re.search(r" --rule ([^{\s]\S*)", shell)
    if named and named[1] != rule:
        problems.append(f"names rule '{named[1]}' (--rule), not its own")
    return problems


def stage(
    name: str,
    *,
    params: type[StageParams],
    inputs: Iterable[str] = (),
    outputs: Iterable[str],
    help: str,
) -> Callable[[F], F]:
    """Declare the decorated function a stage; its signature is checked against the contract now,
    when its module is imported, rather than when a job calls it."""

    def declare(function: F) -> F:
        function.contract = Contract(  # type: ignore[attr-defined]
            name, function, params, tuple(inputs), tuple(outputs), help
        )
        return function

    return declare


def contracts(*modules: types.ModuleType) -> dict[str, Contract]:
    """The stages the modules declare, by CLI name, in the order of their modules and functions."""
    found: dict[str, Contract] = {}
    for module in modules:
        for value in vars(module).values():
            contract = getattr(value, "contract", None)
            if not isinstance(contract, Contract) or contract.function is not value:
                continue
            if contract.name in found:
                other = found[contract.name].function
                raise TypeError(
                    f"stage '{contract.name}' declared twice: {other.__module__}."
                    f"{other.__qualname__} and {module.__name__}.{value.__qualname__}"
                )
            found[contract.name] = contract
    return found
