"""Teacher generation: which teacher answers at which efforts, how each backend is reached, and
how the SFT dataset is chosen from the graded answers."""

from __future__ import annotations

from string import Template
from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, model_serializer, model_validator

from .base import Effort, Plain, PositiveInt, Probability, Section, placeholders, tag
from .data import KernelBookSource


class Generation(Section):
    teacher: str = Field(
        description="a key of teachers: the teacher of every effort not in effort_teachers, and "
        "the reference the other teachers are compared with"
    )
    efforts: Annotated[list[Effort], Field(min_length=1)] = Field(
        description="the effort levels every prompt is answered at, and the student learns as tags"
    )
    samples_per_prompt: Annotated[int, Field(ge=1, le=1024)] = Field(
        description="answers the teacher writes per prompt and effort"
    )
    shards: Annotated[int, Field(ge=1, le=100_000)] = Field(
        description="parts the pool is split into: one generation job per shard and effort (or "
        "effort group)"
    )
    effort_groups: list[Annotated[list[Effort], Field(min_length=2)]] = Field(
        [],
        description="efforts generated together: one job and one file per shard and group",
    )
    effort_shards: dict[Effort, PositiveInt] = Field(
        {}, description="effort -> how many shards it runs on (a hash-random subset); unlisted: all"
    )
    effort_teachers: dict[Effort, str] = Field(
        {},
        description="effort -> a key of teachers that generates it; unlisted: teacher. Mixing "
        "teachers across efforts mixes their styles and lengths into the effort levels",
    )
    servers: Annotated[int, Field(ge=1, le=999)] = Field(
        1,
        description="servers of each self-hosted (sglang) teacher, one allocation each, started "
        "once and serving their share of the shards (shard i goes to server i mod servers) to "
        "the generation jobs in that allocation; more servers, shorter wall time, one start each",
    )

    @model_validator(mode="after")
    def _efforts(self) -> Generation:
        problems = []
        if len(set(self.efforts)) != len(self.efforts):
            problems.append(f"efforts: each effort may be listed once, got {self.efforts}")
        for effort, n in self.effort_shards.items():
            if effort not in self.efforts:
                problems.append(f"effort_shards.{effort}: '{effort}' is not in efforts")
            elif n > self.shards:
                problems.append(f"effort_shards.{effort}: {n} is more than shards ({self.shards})")
        seen: set[str] = set()
        for i, group in enumerate(self.effort_groups):
            if set(group) - set(self.efforts) or set(group) & seen or len(set(group)) < len(group):
                problems.append(
                    f"effort_groups.{i}: {group} must list distinct efforts of efforts, "
                    "each in at most one group"
                )
            seen |= set(group)
            if len({self.shards_of(e) for e in group}) > 1:
                problems.append(
                    f"effort_groups.{i}: efforts of one group need the same effort_shards"
                )
            # One job generates a group from one server, and a server is one teacher's: splitting
            # the group per teacher would quietly undo the one job it asks for.
            by = {e: self.teacher_of(e) for e in group}
            if len(set(by.values())) > 1:
                problems.append(
                    f"effort_groups.{i}: {group} mixes teachers "
                    f"({', '.join(f'{e}: {t}' for e, t in by.items())}); a group is one job "
                    "with one server, so its efforts need one teacher: put the efforts of each "
                    "teacher in a group of their own"
                )
        problems += self._teacher_problems()
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _teacher_problems(self) -> list[str]:
        problems = [
            f"effort_teachers.{e}: '{e}' is not in efforts"
            for e in self.effort_teachers
            if e not in self.efforts
        ]
        if not problems and self.teacher not in self.used_teachers:
            problems.append(
                f"effort_teachers: every effort goes to another teacher, so teacher "
                f"('{self.teacher}'), the reference the others are compared with, generates "
                "nothing: make one of them teacher"
            )
        return problems

    def shards_of(self, effort: str) -> int:
        return self.effort_shards.get(effort, self.shards)

    def teacher_of(self, effort: str) -> str:
        return self.effort_teachers.get(effort, self.teacher)

    @property
    def used_teachers(self) -> list[str]:
        """The teachers that generate, generation.teacher first, then in the order of efforts."""
        used = [self.teacher_of(e) for e in self.efforts]
        return [t for t in dict.fromkeys([self.teacher, *used]) if t in used]

    @property
    def mixed(self) -> bool:
        """More than one teacher generates: efforts mix their styles; the teachers table is
        built."""
        return len(self.used_teachers) > 1

    def efforts_of(self, teacher: str) -> list[str]:
        return [e for e in self.efforts if self.teacher_of(e) == teacher]

    def mixing_warning(self, table: str) -> str | None:
        """What a config that mixes teachers across efforts is told when the workflow is built."""
        if not self.mixed:
            return None
        who = "; ".join(f"{', '.join(self.efforts_of(t))} by {t}" for t in self.used_teachers)
        return (
            f"generation mixes teachers across efforts ({who}). A teacher's style and length go "
            "into every trace it writes (the distillation seed's self-hosted Beam wrote ~35% "
            "longer reasoning than its API at the same accuracy), so the student's effort levels "
            "would also learn a change of teacher, and the length spacing between efforts shifts. "
            f"{table} compares the teachers' trace lengths on the prompts they share; to avoid "
            "the shift, generate every effort with one teacher (generation.effort_teachers)."
        )


class Price(Section):
    """Dollars per million tokens; each shard's cost goes into its provenance."""

    input_per_mtok: float = Field(0.0, ge=0, description="dollars per million prompt tokens")
    output_per_mtok: float = Field(0.0, ge=0, description="dollars per million generated tokens")


class _TeacherSpec(Section):
    concurrency: PositiveInt = Field(
        1,
        description="requests in flight per shard job (a shared server sees this times the jobs "
        "its allocation holds)",
    )
    price: Price = Field(Price(), description="the teacher's token prices, for each shard's cost")
    max_failed_fraction: Probability = Field(
        0.0, description="samples allowed to fail for good before the shard job fails"
    )


# The procedural teacher's reasoning length per effort (0 core step .. 3 everything, checked twice).
PROCEDURAL_DETAIL = {"low": 0, "medium": 1, "high": 2, "xhigh": 3}


class ProceduralSpec(_TeacherSpec):
    """The offline stand-in for a reasoning teacher (stillroom/teachers/procedural.py)."""

    backend: Literal["procedural"] = Field(description="the offline procedural teacher")
    error_rate: Probability | dict[Effort, Probability] = Field(
        0.0, description="chance of a slip, for every effort or per effort"
    )
    detail: dict[Effort, Annotated[int, Field(ge=0, le=3)]] = Field(
        {}, description=f"effort -> reasoning detail 0..3, over the defaults {PROCEDURAL_DETAIL}"
    )
    detail_spread: int = Field(
        0,
        ge=0,
        le=3,
        description="each sample's detail drawn within +- this of its effort's (within 0..3), so "
        "a prompt's samples differ in length as a real teacher's do (0: every sample alike)",
    )

    @property
    def levels(self) -> dict[str, int]:
        return {**PROCEDURAL_DETAIL, **self.detail}

    @model_validator(mode="after")
    def _known_efforts(self) -> ProceduralSpec:
        rates = self.error_rate if isinstance(self.error_rate, dict) else {}
        unknown = sorted(set(rates) - set(self.levels))
        if unknown:  # a misspelt effort would slip at rate 0
            raise ValueError(
                f"error_rate.{unknown[0]}: '{unknown[0]}' is not an effort of this teacher "
                f"({', '.join(self.levels)}; add it to detail)"
            )
        return self


class Sampling(Section):
    """Sampling fields of each request; ``extra`` holds a server's own fields, sent as they are."""

    temperature: float | None = Field(
        None, ge=0, description="sampling temperature (null: the backend's default)"
    )
    top_p: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None,
        description="nucleus sampling: the smallest set of tokens with this much probability "
        "(null: the backend's default)",
    )
    top_k: int | None = Field(
        None, description="sample among the k most likely tokens (null: the backend's default)"
    )
    min_p: Probability | None = Field(
        None,
        description="drop tokens below this share of the most likely one's probability (null: the "
        "backend's default)",
    )
    max_tokens: PositiveInt | None = Field(
        None, description="tokens generated at most per answer (null: the backend's default)"
    )
    presence_penalty: float | None = Field(
        None, description="OpenAI presence penalty (null: the backend's default)"
    )
    frequency_penalty: float | None = Field(
        None, description="OpenAI frequency penalty (null: the backend's default)"
    )
    repetition_penalty: float | None = Field(
        None, gt=0, description="repetition penalty, 1 is none (null: the backend's default)"
    )
    stop: str | list[str] | None = Field(
        None, description="string(s) that end an answer (null: the backend's default)"
    )
    extra: dict[str, Plain] = Field(
        {}, description="a server's own request fields, sent as they are"
    )

    unknown_hint = "; a server's own sampling fields go under extra"

    @model_validator(mode="after")
    def _extra_own(self) -> Sampling:
        typed = sorted(set(self.extra) & set(type(self).model_fields) - {"extra"})
        if typed:  # body() would send extra's value over the typed one, unchecked
            raise ValueError(
                f"extra.{typed[0]}: a typed sampling field; set sampling.{typed[0]} instead"
            )
        return self

    @model_serializer(mode="wrap")
    def _given(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None and v != {}}

    def body(self) -> dict[str, Any]:
        """The request fields these settings add."""
        fields = {k: v for k, v in self.dump().items() if k != "extra"}
        return {**fields, **self.extra}


class EffortSpec(Section):
    """How an effort level is sent: a request field, a system prompt ($effort), extra body
    fields."""

    field: str | None = Field(
        None,
        description="the request field the effort name is sent in (e.g. reasoning_effort; null: "
        "none)",
    )
    system: str | None = Field(
        None, description="a system prompt, $effort replaced by the effort name (null: none)"
    )
    extra_body: dict[str, Plain] = Field(
        {}, description="request fields added as they are, $effort replaced in strings"
    )

    @model_validator(mode="after")
    def _templates(self) -> EffortSpec:
        for key, text in [("system", self.system)] + list(self.extra_body.items()):
            if isinstance(text, str):
                try:
                    Template(text).substitute(effort="x")
                except (KeyError, ValueError) as exc:
                    raise ValueError(f"{key}: only $effort may be substituted ({exc!r})") from None
        return self


class Budget(Section):
    """A daily output-token budget shared by every shard job of one teacher."""

    daily_output_tokens: PositiveInt = Field(
        description="output tokens all shard jobs of the teacher may use per day"
    )
    reset_hour_utc: Annotated[int, Field(ge=0, le=23)] = Field(
        0, description="the hour (UTC) the budget's day starts"
    )
    ledger: str | None = Field(
        None,
        description="ledger file on a filesystem all jobs share "
        "(default results/budget/<teacher>.json)",
    )


class OpenAISpec(_TeacherSpec):
    """Any OpenAI-compatible server: a hosted API, SGLang, vLLM, ``transformers serve``."""

    backend: Literal["openai"] = Field(
        description="an OpenAI-compatible server already running at base_url"
    )
    base_url: str = Field(
        pattern=r"^https?://", description="the server's API root, e.g. https://api.example.com/v1"
    )
    model: str = Field(description="the model name sent in each request")
    api_key_env: str | None = Field(
        None, description="name of the environment variable holding the key (never the key)"
    )
    endpoint: Literal["chat", "completions"] = Field(
        "chat",
        description="chat: /chat/completions with messages; completions: /completions with the "
        "messages joined into one prompt",
    )
    sampling: Sampling = Field(Sampling(), description="the sampling fields of each request")
    effort: EffortSpec = Field(
        EffortSpec(field="reasoning_effort"), description="how the effort level is sent"
    )
    timeout_s: float = Field(
        600.0, gt=0, description="seconds one request may take before it is retried"
    )
    max_attempts: PositiveInt = Field(8, description="tries per request before the sample fails")
    backoff_base_s: float = Field(
        1.0,
        ge=0,
        description="seconds before the first retry, doubled at each next one (with jitter)",
    )
    backoff_max_s: float = Field(120.0, ge=0, description="most seconds between two tries")
    context_length: PositiveInt | None = Field(
        None, description="prompt + max_tokens must fit; see on_overflow"
    )
    on_overflow: Literal["clamp", "skip"] = Field(
        "clamp", description="clamp max_tokens, or skip the sample (recorded with the reason)"
    )
    tokenizer: str | None = Field(
        None, description="path or hub id counting prompt tokens (else a conservative estimate)"
    )
    budget: Budget | None = Field(None, description="a daily output-token budget (null: none)")

    @model_validator(mode="after")
    def _budget(self) -> OpenAISpec:
        if self.budget and not (self.sampling.max_tokens or self.context_length):
            raise ValueError(
                "budget: needs sampling.max_tokens or context_length (each request's worst case)"
            )
        return self


class Server(Section):
    """A server started from ``command``, a str.format template, once for the jobs it serves (rules
    serve_teacher and serve_model; a job without one starts its own). ``{port}`` (free, chosen
    at each start) and ``{python}`` are filled in; every other key here fills its ``{key}``."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, Plain]

    command: str = Field(
        description="the shell command that starts the server, a str.format template"
    )
    health_path: str = Field("/health", description="the path polled until the server answers 200")
    startup_timeout_s: float = Field(
        1800.0, gt=0, description="seconds the server may take to become healthy"
    )
    stop_timeout_s: float = Field(
        30.0, gt=0, description="seconds between SIGTERM and SIGKILL when the job stops the server"
    )
    host: str = Field("127.0.0.1", description="the address the server listens on and is polled at")
    env: dict[str, str | int | float] = Field(
        {}, description="environment variables added for the server"
    )
    tp: PositiveInt = Field(
        1, description="tensor parallel size: GPUs = tp x dp unless gpus is set"
    )
    dp: PositiveInt = Field(
        1, description="data-parallel replicas: GPUs = tp x dp unless gpus is set"
    )
    gpus: int | None = Field(None, ge=0, description="GPUs the server uses (default tp x dp)")

    @model_validator(mode="after")
    def _template(self) -> Server:
        extras = set(self.model_extra or {})
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, str | int | float):
                raise ValueError(f"{key}: a template value must be a string or a number")
        unused = sorted(extras - placeholders(self.command))
        if unused:
            raise ValueError(
                f"{', '.join(unused)}: not a server setting, nor a {{placeholder}} of command"
            )
        return self

    def missing(self, provided: set[str]) -> list[str]:
        """Placeholders of ``command`` that neither this server's values nor ``provided`` fill."""
        values = {**self.model_dump(), **(self.model_extra or {})}
        filled = {k for k, v in values.items() if isinstance(v, str | int | float)}
        return sorted(placeholders(self.command) - {"port", "python", *filled, *provided})

    @property
    def gpu_count(self) -> int:
        return self.gpus if self.gpus is not None else self.tp * self.dp


class SGLangSpec(OpenAISpec):
    """A server (SGLang, or any OpenAI-compatible one) started once per server allocation
    (generation.servers of them; rule serve_teacher) for the generation jobs of its shards."""

    backend: Literal["sglang"] = Field(  # type: ignore[assignment]
        description="a server the shard job starts from server.command"
    )
    base_url: str = Field("http://pending/v1", description="set once the server is up")
    server: Server = Field(description="the server each shard job starts")

    @model_validator(mode="after")
    def _filled(self) -> SGLangSpec:
        missing = self.server.missing(set())
        if missing:
            fields = ", ".join("{" + m + "}" for m in missing)
            raise ValueError(f"server.command: no value for {fields}")
        return self


class HFSpec(OpenAISpec):
    """A local transformers model answering in batches: for tiny runs and tests."""

    backend: Literal["hf"] = Field(  # type: ignore[assignment]
        description="a local transformers model in the shard job"
    )
    model_path: str = Field(description="a model directory or hub id")
    base_url: str = Field("http://local", description="unused: the model runs in the job itself")
    batch_size: PositiveInt = Field(16, description="requests per generate call")
    threads: PositiveInt = Field(1, description="torch threads")
    effort: EffortSpec = Field(
        EffortSpec(), description="how the effort level is sent (default: not at all)"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_model_path(cls, data: Any) -> Any:
        """Unset: the served name and the tokenizer are the model path's; a batch in flight."""
        if isinstance(data, dict) and "model_path" in data:
            data = dict(data)
            data.setdefault("model", data["model_path"])
            data.setdefault("tokenizer", data["model_path"])
            batch_size = data.get("batch_size", cls.model_fields["batch_size"].default)
            data.setdefault("concurrency", batch_size)
        return data


TeacherSpec = Annotated[
    ProceduralSpec | OpenAISpec | SGLangSpec | HFSpec, Field(discriminator="backend")
]
tag("procedural", "openai", "sglang", "hf")


# How the SFT dataset picks traces per (prompt, effort): among the correct ones, the shortest, a
# random one or the longest; every correct one ("all"); or every trace, correct or not
# ("unfiltered").
Selection = Literal["shortest", "random", "longest", "all", "unfiltered"]
SELECTIONS: tuple[str, ...] = get_args(Selection)


class DatasetSelection(Section):
    """The SFT dataset: the traces ``select`` picks per (prompt, effort), effort-tagged."""

    default_effort: Effort = Field(
        description="the effort whose examples untagged_fraction leaves untagged, and the effort "
        "of sft_sources' rows"
    )
    untagged_fraction: Probability = Field(
        description="default-effort examples left untagged, so untagged behaviour stays the default"
    )
    select: Selection = Field(
        "shortest",
        description="traces per (prompt, effort): shortest, random or longest correct one, all "
        "correct ones, or unfiltered (every trace, correct or not)",
    )
    ablation: list[Selection] = Field(
        [],
        description="other selections, each trained into a model select-<selection> (the student "
        "fine-tuned as sft is, from the base, on that dataset) and compared in every table",
    )
    sft_sources: list[KernelBookSource] = Field(
        [],
        description="SFT examples read as they are, beside the teacher's traces: kernelbook rows "
        "(PyTorch module, Inductor's Triton), each kept only if the kernel reward grades it 1",
    )

    @model_validator(mode="after")
    def _ablation(self) -> DatasetSelection:
        if len(set(self.ablation)) != len(self.ablation):
            raise ValueError(f"ablation: each selection may be listed once, got {self.ablation}")
        if self.select in self.ablation:
            raise ValueError(
                f"ablation: '{self.select}' is dataset.select, the fine-tune itself (sft)"
            )
        return self
