"""The base of every typed config section and stage params: unknown keys refused, strict types,
and errors that name the config key and what was expected."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from string import Formatter
from typing import Annotated, Any, ClassVar, Literal, Self

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config (or a stage's params) that cannot run; the message names every bad key."""


# Tags of the tagged unions (source kinds, teacher and evaluation backends): pydantic puts the tag
# in an error's location, which would read as a key of the config.
_UNION_TAGS: set[str] = set()


class Section(BaseModel):
    """A config section: frozen, strict (no "3" for 3), every key known, every float finite."""

    # allow_inf_nan=False: YAML's .inf and .nan are floats, and would run (a temperature of .inf
    # samples random tokens) or fail deep inside a job (epochs .inf overflows a step count).
    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, populate_by_name=True, allow_inf_nan=False
    )
    # Said after an unknown key of this section: where such a key belongs instead.
    unknown_hint: ClassVar[str] = ""
    # Keys (known or not) that need software this repository does not ship: key -> what is
    # missing, for any value; or key -> {value: what is missing}, for those values only (a list's
    # entries each, by their last dotted component: Axolotl's plugins; None: any other entry).
    # Refused naming it, instead of the generic unknown key or accepted and ignored.
    not_shipped: ClassVar[Mapping[str, str | Mapping[Any, str]]] = {}
    # Keys renamed: old key -> the new key's full name, refused naming it (an old config fails
    # once, with the fix, instead of as an unknown key).
    renamed: ClassVar[Mapping[str, str]] = {}
    # Keys of another tool's config (Axolotl's, as the MoE guide writes them): key -> the whole
    # refusal, saying where its setting goes here or why there is none.
    foreign: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            missing = {k: p for k, v in data.items() if (p := cls._not_shipped(k, v))}
            problems = list(missing.values())
            problems += [
                f"{k}: renamed {new} (same entries)" for k, new in cls.renamed.items() if k in data
            ]
            known = {name: f.alias or name for name, f in cls.model_fields.items()}
            # a subclass's own field (a stage's seed) is no other tool's key
            problems += [
                f"{k}: {why}"
                for k, why in cls.foreign.items()
                if k in data and k not in known and k not in known.values()
            ]
            unknown = [
                k
                for k in data
                if k not in known
                and k not in known.values()
                and k not in missing
                and k not in cls.renamed
                and k not in cls.foreign
            ]
            if unknown and cls.model_config.get("extra") == "forbid":
                problems.append(unknown_keys(unknown, known.values()) + cls.unknown_hint)
            if problems:
                raise ValueError("\n".join(problems))
        return data

    @classmethod
    def _not_shipped(cls, key: Any, value: Any) -> str | None:
        needs = cls.not_shipped.get(key)
        if needs is None:
            return None
        if not isinstance(needs, Mapping):
            return f"{key}: this repository does not ship {needs}; drop the key"
        lines = [
            f"{key}: {v}: this repository does not ship {what}"
            for v in (value if isinstance(value, list) else [value])
            if isinstance(v, str) and (what := needs.get(v.rpartition(".")[2], needs.get(None)))
        ]
        return "\n".join(lines) or None

    @classmethod
    def parse(cls, data: Any, where: str = "") -> Self:
        """``data`` (a mapping, or already this section) checked; ConfigError names each bad key
        under ``where`` (the section's place in the config, e.g. "train")."""
        if isinstance(data, cls):
            return data
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(explain(exc, where)) from None

    def dump(self) -> dict[str, Any]:
        """Plain JSON-ready values, every default filled in."""
        return self.model_dump(mode="json", by_alias=True)


def unknown_keys(unknown: Iterable[Any], known: Iterable[str]) -> str:
    known = sorted(known)
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), known, n=1)
        parts.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return f"unknown key {', '.join(parts)}; allowed: {', '.join(known)}"


def explain(exc: ValidationError, where: str = "") -> str:
    """One line per error: the dotted key, then what was wrong."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = _key_path(err["loc"])
        msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if loc[-1:] == ["[key]"]:  # a bad key of a mapping (a teacher's name): under its parent
            *loc, name, _ = loc
            msg = f"key {name!r}: {msg}"
        key = ".".join(([where] if where else []) + loc)
        if err["type"] == "missing":
            msg = "required key missing"
        elif (
            err["type"] not in ("value_error", "assertion_error")
            and "input" in err
            and _scalar(err["input"])
        ):
            msg += f" (got {err['input']!r:.80})" + _string_number(err)
        # A check over several keys writes one problem a line, each starting with its key
        # relative to the section that checks it.
        for m in msg.split("\n"):
            if not key:
                lines.append(m)
            elif _RELATIVE_KEY.match(m):
                lines.append(f"{key}.{m}")
            else:
                lines.append(f"{key}: {m}")
    return "invalid config:\n  " + "\n  ".join(dict.fromkeys(lines))


def _string_number(err: Any) -> str:
    """Where a number was expected and got a string that Python reads as one, how to write it: YAML
    1.1 reads 3e-3 as a string (a float needs a dot and a signed exponent), and "8" quoted."""
    text = err["input"]
    want = {"float_type": (int, float), "int_type": (int,)}.get(err["type"])
    if want is None or not isinstance(text, str):
        return ""
    try:
        number = float(text)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    text = text.strip()
    candidates = [text]  # a number as it stands: the string was quoted
    if err["type"] == "int_type":
        if not number.is_integer():
            return ""
        candidates.append(str(int(Decimal(text))))  # exact, where float(1e30) is not
    else:
        mantissa, _, exponent = text.replace("E", "e").partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        if exponent[:1] not in ("+", "-", ""):
            exponent = "+" + exponent
        candidates += [mantissa + (f"e{exponent}" if exponent else ""), repr(number)]
    for spelling in candidates:
        # only a spelling YAML reads back as this number, of a type the key takes
        read = _yaml_scalar(spelling)
        exact = Decimal(read) == Decimal(text) if type(read) is int else read == number
        if type(read) in want and exact:
            if spelling == text:
                return f": a string, as quoted; write {spelling} without quotes"
            return f": YAML reads {text} as a string; write {spelling}"
    return ": YAML reads it as a string"


def _yaml_scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _scalar(value: Any) -> bool:
    return not isinstance(value, Mapping | list)


_RELATIVE_KEY = re.compile(r"^[A-Za-z_][\w.]*: ")


def tag(*values: str) -> None:
    _UNION_TAGS.update(values)


# Where pydantic puts a tagged union's tag in an error's location: after a list index (sources), a
# name the user chose (teachers, benchmarks) or the union's own key (eval.backend, a stage's spec).
_NAMED = {"teachers", "benchmarks"}
_UNION_KEYS = {"backend", "spec"}
_LABEL = re.compile(
    r"^(str|int|float|bool|none|(list|dict|tuple)\[.*\]|(constrained|function)-.*)$"
)


def _key_path(loc: tuple[Any, ...]) -> list[str]:
    """A pydantic error location as config keys: without the tags and member labels that pydantic
    adds for the members of a union."""
    labels = {c.__name__ for c in _subclasses(Section)}
    out: list[Any] = []
    for part in loc:
        if out and out[-1] in _NAMED:  # a name the user chose: never a tag or a label
            out.append(part)
            continue
        tag_place = bool(out) and (
            isinstance(out[-1], int)
            or out[-1] in _UNION_KEYS
            or (len(out) > 1 and out[-2] in _NAMED)
        )
        if (tag_place and part in _UNION_TAGS) or (
            isinstance(part, str) and (part in labels or _LABEL.match(part))
        ):
            continue
        out.append(part)
    return [str(p) for p in out]


def _subclasses(cls: type) -> list[type]:
    return [sub for c in cls.__subclasses__() for sub in (c, *_subclasses(c))]


def _distinct_letters(letters: str) -> str:
    if len(set(letters)) != len(letters) or any(c.isspace() for c in letters):
        raise ValueError(f"letters must be distinct non-space characters, got {letters!r}")
    return letters


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"bad regular expression {pattern!r}: {exc}") from None
    return pattern


def placeholders(template: str) -> set[str]:
    """The ``{name}`` fields of a str.format template."""
    return {name for _, name, _, _ in Formatter().parse(template) if name}


def _segment(name: str) -> str:
    if not _SEGMENT.match(name) or name in (".", ".."):
        raise ValueError(
            "a plain directory name: letters, digits, '_', '-' and '.', not '.' or '..' "
            f"(got {name!r})"
        )
    return name


_SEGMENT = re.compile(r"^[A-Za-z0-9_.-]+$")


def _seed(seed: int) -> int:
    if not 0 <= seed < 2**32:
        raise ValueError(
            f"a seed is 0 <= seed < 2**32 = {2**32}, the range numpy and torch share (got {seed})"
        )
    return seed


def _finite(value: Any) -> Any:
    problems = list(_non_finite(value, ""))
    if problems:
        raise ValueError("\n".join(problems))
    return value


def _non_finite(value: Any, key: str) -> Iterable[str]:
    if isinstance(value, float) and not math.isfinite(value):
        yield (f"{key}: " if key else "") + f"Input should be a finite number (got {value!r})"
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _non_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _non_finite(v, f"{key}.{i}" if key else str(i))


# An untyped value (sent on to a server as it is, compared with rows): allow_inf_nan covers typed
# floats only, so .inf and .nan are refused here anywhere inside it.
Plain = Annotated[Any, AfterValidator(_finite)]
Probability = Annotated[float, Field(ge=0, le=1)]
# An effort level; no "+", which joins an effort group's efforts into its generation jobs' key
# (stillroom/plan/generation.py).
Effort = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")]
# A name the user chooses that becomes a path segment (results/<experiment>/gen/<teacher>/...).
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")]
# The experiment's directory under results/: '..' would write into the repository itself, '.'
# straight under results/ beside the other experiments.
Segment = Annotated[
    str,
    AfterValidator(_segment),
    Field(json_schema_extra={"pattern": r"^(?!\.\.?$)[A-Za-z0-9_.-]+$"}),
]
# numpy's and torch's common range: numpy refuses a seed of 2**32 and up, torch one of 2**64.
Seed = Annotated[
    int,
    AfterValidator(_seed),
    Field(
        description="0 <= seed < 2**32, the range numpy and torch share",
        json_schema_extra={"minimum": 0, "exclusiveMaximum": 2**32},
    ),
]


class StageParams(Section):
    """The params of every stage: the experiment's seed, recorded in each sidecar even where the
    stage has no randomness, and whatever the stage's own params add."""

    seed: Seed = 0
    # sections whose defaults the params write as {} when the experiment gives none (the kernel
    # validator's options without a kernels section): the job parses them back to the defaults
    empty_unless_given: ClassVar[tuple[str, ...]] = ()

    def as_param(self) -> str:
        """The job's ``--params``, which its rule passes: JSON with sorted keys, so the same params
        give the same command and only a real change reruns the job."""
        return json.dumps(self.param_values(), sort_keys=True)

    def param_values(self) -> dict[str, Any]:
        """What ``as_param`` writes: every value (a class some of whose values imply others
        leaves those out)."""
        unset = set(self.empty_unless_given) - self.model_fields_set
        return {**self.dump(), **dict.fromkeys(unset, {})}


def readable(params: Mapping[str, Any]) -> str:
    """A job's params as a person reads them (job log, audit): YAML, one key a line, keys sorted,
    where the rule passes them as one JSON string."""
    # width: a long value (a regex, a path) stays on its key's line instead of folding
    return yaml.safe_dump(
        dict(params), sort_keys=True, default_flow_style=False, allow_unicode=True, width=10**9
    )


PositiveInt = Annotated[int, Field(ge=1)]
Regex = Annotated[str, AfterValidator(_regex)]
DEFAULT_LETTERS = "ABCD"
Letters = Annotated[
    str,
    Field(
        default=DEFAULT_LETTERS,
        min_length=2,
        description="the multiple-choice letters, in order (e.g. ABCDEFGHIJ); read by grading only",
    ),
    AfterValidator(_distinct_letters),
]
# Which of a math answer's \boxed{} is graded: "7 is wrong, so \boxed{8}" answers 8, not {7, 8}.
Boxed = Annotated[
    Literal["last", "all"],
    Field(
        default="last",
        description="a math answer's last \\boxed{}, or all of them (math-verify joins them "
        "into a set)",
    ),
]
