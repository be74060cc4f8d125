"""Evaluation and the tables: how models are sampled (in process or served), graded
(multiple-choice letters, the kernel validator) and compared (paired bootstrap), and what the cost
ledger charges."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, model_validator

from .base import (
    Boxed,
    Effort,
    Letters,
    Name,
    PositiveInt,
    Probability,
    Section,
    StageParams,
    tag,
)
from .generation import Server
from .models import ModelId

# the kernel validator's generated test cases (stillroom/kernels/cases.py)
GeneratedCase = Literal["mixed_sign", "negative", "zero", "large", "odd_shape"]
TEST_CASES: tuple[str, ...] = get_args(GeneratedCase)


class ValidatorOptions(Section):
    """How the kernel validator runs a candidate (stillroom.kernels.evaluate)."""

    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="cpu: Triton's interpreter; cuda: compiled kernels, speedup timed"
    )
    trials: PositiveInt = Field(3, description="fresh random inputs per candidate")
    timeout_s: float = Field(
        60.0,
        gt=0,
        description="hard limit of each of a candidate's two processes: the extraction (its "
        "code) and the replay (its program)",
    )
    # the rule reward's launch limits (AutoTriton's validate_syntax; kernels/launch_checks.py)
    max_block_size: PositiveInt = Field(
        2048, description="largest block size (a power of two) a launch may use"
    )
    max_threads_per_block: PositiveInt = Field(
        1024, description="num_warps x 32 of a launch may not exceed it"
    )
    max_instructions: PositiveInt = Field(
        2000, description="static estimate of a kernel's instructions (loops unrolled) at most"
    )
    cases: list[GeneratedCase] = Field(
        list(TEST_CASES),
        description="generated test cases run beyond the trials (stillroom/kernels/cases.py), each "
        "kept where the reference's outputs stay finite: mixed_sign, negative, zero and large "
        "(x1e3, atol scaled by the outputs' magnitude) redraw the floating inputs; odd_shape "
        "changes sizes to odd ones; [] runs the trials only",
    )


class Kernels(ValidatorOptions):
    """Kernel track: the validator's options for grading and GRPO, and the kernel tables."""

    fast_p: list[Annotated[float, Field(ge=0)]] = Field(
        [0.0, 1.0, 2.0], description="speedup thresholds p of the fast_p table columns (GPU)"
    )
    benchmarks: list[str] | None = Field(
        None, description="eval benchmarks that get kernel tables (default: all)"
    )

    @property
    def validator(self) -> ValidatorOptions:
        return ValidatorOptions(**{k: getattr(self, k) for k in ValidatorOptions.model_fields})


class HFBackend(Section):
    """The checkpoint in this process: batched sampling on CPU or one GPU."""

    backend: Literal["hf"] = Field(
        "hf", description="the checkpoint loaded by transformers in the evaluation job"
    )


class _Served(Section):
    model: str | None = Field(None, description="the served name (default: the checkpoint path)")
    concurrency: PositiveInt = Field(64, description="requests in flight")


STOP_BY = (
    "how requests carry the checkpoint's stop set: token_ids (stop_token_ids: SGLang, vLLM) or "
    "strings (stop: any OpenAI-compatible server)"
)


class OpenAIBackend(_Served):
    """An OpenAI-compatible server already running at ``base_url``."""

    backend: Literal["openai"] = Field(
        description="an OpenAI-compatible server already running at base_url"
    )
    stop_by: Literal["token_ids", "strings"] = Field("strings", description=STOP_BY)
    base_url: str = Field(
        pattern=r"^https?://", description="the server's API root, e.g. http://host:30000/v1"
    )
    api_key_env: str | None = Field(
        None,
        description="name of the environment variable holding the key (never the key; null: no "
        "key)",
    )


class SGLangBackend(_Served):
    """A server per checkpoint, started once (rule serve_model) for all of that checkpoint's
    evaluation jobs, from ``server.command`` (with ``{model_path}`` and ``{port}``)."""

    backend: Literal["sglang"] = Field(
        description="a server per checkpoint, started once for all of its evaluation jobs"
    )
    server: Server = Field(description="the server started for each checkpoint")
    stop_by: Literal["token_ids", "strings"] = Field("token_ids", description=STOP_BY)

    @model_validator(mode="after")
    def _placeholders(self) -> SGLangBackend:
        missing = self.server.missing({"model_path"})
        if missing:
            fields = ", ".join("{" + m + "}" for m in missing)
            raise ValueError(f"server.command: no value for {fields}")
        if "{model_path}" not in self.server.command:
            raise ValueError("server.command: must serve {model_path}, the checkpoint evaluated")
        return self


Backend = Annotated[HFBackend | OpenAIBackend | SGLangBackend, Field(discriminator="backend")]
tag("hf", "openai", "sglang")


class _BackendOf(Section):
    backend: Backend


def parse_backend(spec: Any) -> HFBackend | OpenAIBackend | SGLangBackend:
    """An evaluation backend from its config (eval.backend), checked."""
    if isinstance(spec, HFBackend | OpenAIBackend | SGLangBackend):
        return spec
    return _BackendOf.parse({"backend": spec}, where="eval").backend


class Forcing(Section):
    """How a thinking budget is enforced: thinking closed at the budget with the end-of-thinking
    marker and ``answer_cue``, then an answer within ``answer_tokens``."""

    answer_tokens: PositiveInt = Field(
        64, description="tokens the answer may take after a forced end of thinking"
    )
    answer_cue: str = Field(
        "\nThe answer is", description="after a forced end of thinking: the answer's opening"
    )


class BudgetForce(Forcing):
    """Accuracy-against-budget curves: every answer evaluated again at each thinking budget."""

    budgets: Annotated[list[PositiveInt], Field(min_length=1)] = Field(
        description="thinking budgets, in tokens, each evaluated"
    )
    models: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description="default: every model"
    )
    benchmarks: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description="default: every eval benchmark"
    )

    @model_validator(mode="after")
    def _unique(self) -> BudgetForce:
        if len(set(self.budgets)) != len(self.budgets):
            raise ValueError(f"budgets: each budget may be listed once, got {self.budgets}")
        return self


class Decoding(Section):
    """How every model answers an evaluation problem: k samples, their limits, the backend."""

    samples: Annotated[int, Field(ge=1, le=1024)] = Field(
        description="answers sampled per problem and model (at most 1024, as "
        "generation.samples_per_prompt: more is days of decoding per model and benchmark)"
    )
    temperature: float = Field(ge=0, description="sampling temperature (0: greedy)")
    top_p: float = Field(
        gt=0,
        le=1,
        description="nucleus sampling: the smallest set of tokens with this much probability",
    )
    max_new_tokens: PositiveInt = Field(description="the overall limit of an answer")
    request_tokens: PositiveInt | None = Field(
        None,
        description="per request; a cut-off answer is continued from its exact tokens up to "
        "max_new_tokens (continue_truncated)",
    )
    batch_size: PositiveInt = Field(
        description="answers decoded at once: batch_size // samples problems a batch"
    )
    effort: str | None = Field(
        None, description="tag eval prompts with this effort (null: untagged)"
    )
    backend: Backend = Field(
        HFBackend(),
        description="what decodes: hf (in the job), openai (a running server) or sglang (a server "
        "per checkpoint, started once for its evaluation jobs)",
    )
    context_length: PositiveInt | None = Field(
        None,
        description="prompt plus new tokens the evaluated model holds; default: the checkpoint's "
        "max_position_embeddings (set it when the server extends the context, e.g. YaRN)",
    )


class PerEffort(Section):
    """Models evaluated at each effort of generation.efforts (the student's effort tag in a system
    turn), compared with one reference effort."""

    models: Annotated[list[str], Field(min_length=1)] = Field(
        ["sft"], description="the models evaluated at each effort"
    )
    benchmarks: list[str] | None = Field(None, description="default: eval.benchmarks")
    reference: Effort = Field("medium", description="the effort every other is compared with")


class Eval(Decoding):
    benchmarks: Annotated[list[str], Field(min_length=1)] = Field(
        description="what every model is evaluated on and the tables report: keys of benchmarks, "
        "or a split of the pool (heldout, dev, train)"
    )
    letters: Letters
    boxed: Boxed
    budget_force: BudgetForce | None = Field(
        None, description="accuracy-against-thinking-budget curves (null: none)"
    )
    per_effort: PerEffort | None = Field(None, description="evaluation at each effort (null: none)")

    @model_validator(mode="after")
    def _limits(self) -> Eval:
        problems = []
        if len(set(self.benchmarks)) != len(self.benchmarks):
            problems.append(f"benchmarks: each benchmark may be listed once, got {self.benchmarks}")
        if self.context_length is not None and self.context_length <= self.max_new_tokens:
            problems.append(
                f"context_length: {self.context_length} leaves no room for the prompt beside "
                f"max_new_tokens ({self.max_new_tokens})"
            )
        if self.request_tokens and self.request_tokens > self.max_new_tokens:
            problems.append(
                f"request_tokens: {self.request_tokens} is more than max_new_tokens "
                f"({self.max_new_tokens}), the overall limit"
            )
        force = self.budget_force
        if force and max(force.budgets) > self.max_new_tokens:
            problems.append(
                f"budget_force.budgets: {max(force.budgets)} is more than max_new_tokens "
                f"({self.max_new_tokens}), the overall limit of an answer"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self


class Tables(Section):
    n_resamples: int = Field(
        10_000,
        ge=100,
        le=1_000_000,
        description="bootstrap resamples per confidence interval (a million puts the bootstrap's "
        "own error far below the interval's width; more only stalls)",
    )
    confidence: float = Field(
        0.95, gt=0, lt=1, description="the confidence level of every interval"
    )
    two_level: bool = Field(
        False,
        description="resample samples within problems too (off by default: the intervals then "
        "cover more often than the confidence level says)",
    )
    cap_hit_flag: float = Field(
        0.1,
        ge=0,
        le=1,
        description="a row whose share of answers cut off at the token cap is above this is "
        "flagged in its cell and the caption: its accuracy counts truncated answers as wrong",
    )


class SeededTables(StageParams, Tables):
    """A table's settings with the seed of its bootstraps."""

    @property
    def boot(self) -> dict[str, Any]:
        """The keyword arguments of ``paired_bootstrap`` for this table."""
        return {
            "n_resamples": self.n_resamples,
            "confidence": self.confidence,
            "seed": self.seed,
            "two_level": self.two_level,
        }


class PairedTables(SeededTables):
    """A paired table of one benchmark: every model against the two references."""

    benchmark: str
    models: list[ModelId] = Field(
        [],
        description="the compared models' identities: the references by kind, and each one's "
        "fine-tune weight (the merge sweep's x)",
    )
    base: str = Field(
        "", description="the model every other is compared with first (default: models' base)"
    )
    tuned: str = Field("", description="the fine-tune, the second reference (default: models' sft)")
    base_random: bool = Field(
        False,
        description="the base is a random-weight initialisation (student.pretrained unset), "
        "not a pretrained model: the caption says so",
    )

    @model_validator(mode="before")
    @classmethod
    def _references(cls, data: Any) -> Any:
        # a reference not named is the model of its kind among the identities
        if not isinstance(data, dict):
            return data
        kinds = {
            (m.kind if isinstance(m, ModelId) else m.get("kind")): (
                m.name if isinstance(m, ModelId) else m.get("name")
            )
            for m in data.get("models") or []
        }
        filled = dict(data)
        for key, kind in (("base", "base"), ("tuned", "sft")):
            if not filled.get(key):
                if kind not in kinds:
                    raise ValueError(
                        f"{key}: not given, and models has no model of kind '{kind}' "
                        f"(have {sorted(str(k) for k in kinds)})"
                    )
                filled[key] = kinds[kind]
        return filled

    def param_values(self) -> dict[str, Any]:
        """Without what follows from the rest: a reference that is the models' base or sft, and
        base_random when false (the default caption)."""
        kinds = {m.kind: m.name for m in self.models}
        implied = {
            k
            for k, kind in (("base", "base"), ("tuned", "sft"))
            if kinds.get(kind) == getattr(self, k)
        }
        if not self.base_random:
            implied.add("base_random")
        return {k: v for k, v in super().param_values().items() if k not in implied}

    @property
    def weights(self) -> dict[str, float]:
        """Each model's share of fine-tuned weights, where known (the merge sweep's x): base 0,
        the tuned reference 1, a merge its ratio."""
        known = {m.name: m.weight for m in self.models if m.weight is not None}
        return {**known, self.base: 0.0, self.tuned: 1.0}


PositiveFloat = Annotated[float, Field(gt=0)]
Seconds = Annotated[float, Field(ge=0)]


class _Figures(Section):
    """Figures of which some are assumptions, not measured or reported: ``assumed`` names them, and
    the bill lists them as such."""

    assumed: list[str] = Field(
        [], description="which of these figures are assumptions (the bill lists them as such)"
    )

    @model_validator(mode="after")
    def _assumed(self) -> _Figures:
        figures = [k for k in type(self).model_fields if k != "assumed"]
        unknown = [k for k in self.assumed if k not in figures]
        if unknown:
            raise ValueError(
                f"assumed: {', '.join(unknown)} is not a figure here; one of {', '.join(figures)}"
            )
        return self

    def assumptions(self, where: str) -> list[str]:
        """``key value`` of each assumed figure, its key under ``where``."""

        def shown(value: Any) -> str:
            if isinstance(value, Section):
                value = value.dump()
            if isinstance(value, dict):
                return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
            return f"{value:g}" if isinstance(value, float) else str(value)

        return [f"{where}.{k} {shown(getattr(self, k))}" for k in self.assumed]


class Architecture(Section):
    """A model's shape under its config.json names (transformers' Qwen3 / Qwen3-MoE keys): what the
    training memory estimate sizes LoRA, activations and logits from. Read from the model's
    config.json when the model is a local directory; given here for a hub model."""

    hidden_size: PositiveInt = Field(description="width of the residual stream")
    num_hidden_layers: PositiveInt = Field(description="decoder layers")
    num_attention_heads: PositiveInt = Field(description="query heads per layer")
    num_key_value_heads: PositiveInt = Field(
        description="key/value heads per layer (grouped-query attention)"
    )
    head_dim: PositiveInt = Field(description="width of one attention head")
    vocab_size: PositiveInt = Field(description="tokens of the vocabulary (the logits' width)")
    intermediate_size: PositiveInt | None = Field(
        None, description="the dense MLP's width, in every layer of a model without experts"
    )
    num_experts: PositiveInt | None = Field(
        None, description="routed experts of every layer (a MoE: each layer's MLP is its experts)"
    )
    num_experts_per_tok: PositiveInt | None = Field(None, description="experts each token runs")
    moe_intermediate_size: PositiveInt | None = Field(None, description="one expert's width")
    tie_word_embeddings: bool = Field(
        False, description="the output layer shares the input embedding's weights"
    )

    @model_validator(mode="after")
    def _mlp(self) -> Architecture:
        moe = (self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size)
        if any(x is not None for x in moe) and None in moe:
            raise ValueError(
                "num_experts, num_experts_per_tok and moe_intermediate_size: give all three (a "
                "MoE) or none"
            )
        if moe[0] is None and self.intermediate_size is None:
            raise ValueError("intermediate_size: needed by a model without experts")
        return self


class ModelFigures(_Figures):
    """One model's size, which every job holding it is checked against, and the throughputs of
    its jobs where they differ from cost.estimate's own (a 501B model trains and answers far
    slower than a 4B one)."""

    params_b: PositiveFloat = Field(description="parameters, in billions")
    serve_bytes_per_param: PositiveFloat = Field(
        2.0,
        description="bytes per parameter of the weights as a server holds them: bf16 2, fp8 1, "
        "NVFP4 about 0.56 (4 bits and a scale per 16)",
    )
    train_tokens_per_gpu_s: PositiveFloat | None = Field(
        None, description="cost.estimate.train_tokens_per_gpu_s of this model's training jobs"
    )
    train_start_s: Seconds | None = Field(
        None, description="cost.estimate.train_start_s of this model's training jobs"
    )
    eval_tokens_per_s: PositiveFloat | None = Field(
        None, description="cost.estimate.eval_tokens_per_s of this model's evaluation jobs"
    )
    eval_start_s: Seconds | None = Field(
        None, description="cost.estimate.eval_start_s of this model's evaluation jobs"
    )
    merge_s: Seconds | None = Field(None, description="cost.estimate.merge_s of its merges")
    teacher_tokens_per_s: PositiveFloat | None = Field(
        None, description="cost.estimate.teacher_tokens_per_s of a teacher serving this model"
    )
    teacher_start_s: Seconds | None = Field(
        None, description="cost.estimate.teacher_start_s of a teacher serving this model"
    )
    nf4_params_per_s: PositiveFloat | None = Field(
        None, description="cost.estimate.nf4_params_per_s of its staged loads (e.g. on a GPU)"
    )
    architecture: Architecture | None = Field(
        None,
        description="its shape, which a training job's memory estimate needs (LoRA, optimizer "
        "state, activations, logits); a local model's config.json gives it",
    )


class Estimate(_Figures):
    """The figures ``stillroom estimate`` (and the ledger's estimate columns) predict a run's bill
    from: throughputs, lengths and sizes the rest of the config does not fix. Job counts, GPUs per
    job, prompts, samples, epochs and prices come from the config itself
    (stillroom/plan/estimate.py).
    """

    teacher_tokens_per_s: PositiveFloat = Field(
        10_000.0,
        description="output tokens per second of one teacher server, whatever the jobs it serves "
        "(sglang), or of one generation job (hf, an API) at the teacher's concurrency. Default: "
        "a self-hosted reasoning MoE on one node (8-12k/s reported for NVFP4 Beam on 2 GPUs "
        "with SGLang)",
    )
    teacher_start_s: Seconds = Field(
        600.0,
        description="seconds from a start to the teacher's first token: paid once per server of a "
        "served teacher (sglang: generation.servers, each serving its shards' jobs), by every "
        "generation job of a teacher run in the job (hf), never by an API or the procedural "
        "teacher; default: a large model's weights loaded from a local cache",
    )
    teacher_output_tokens: PositiveInt | dict[Effort, PositiveInt] = Field(
        2000,
        description="mean output tokens of a teacher sample (reasoning and answer), for every "
        "effort or per effort of generation.efforts (others left unused); capped at the "
        "teacher's sampling.max_tokens",
    )
    prompt_tokens: PositiveInt = Field(
        200,
        description="mean tokens of a prompt with its chat template: the API's input tokens, and "
        "part of every training example",
    )
    correct_fraction: Probability | dict[Effort, Probability] = Field(
        0.8,
        description="chance a teacher sample is graded correct, for every effort or per effort "
        "(others left unused): a prompt enters the dataset at an effort when one of its samples "
        "is",
    )
    train_tokens_per_gpu_s: PositiveFloat = Field(
        5000.0,
        description="tokens trained per second per GPU (packed rows, forward and backward); "
        "default: full SFT of a few-billion-parameter student at long sequence length",
    )
    train_start_s: Seconds = Field(
        120.0,
        description="seconds from job start to a training job's first step (the model loaded, "
        "sharded, the dataset packed)",
    )
    eval_tokens_per_s: PositiveFloat = Field(
        5000.0,
        description="output tokens per second of one evaluated model's server, whatever the jobs "
        "it serves (sglang, at eval.backend.concurrency), or of one evaluation job (openai; hf "
        "at eval.batch_size)",
    )
    eval_start_s: Seconds = Field(
        120.0,
        description="seconds from a start to the evaluated model's first token: paid once per "
        "evaluated model when eval.backend is sglang (one server serves all its evaluation "
        "jobs), by every evaluation job with backend hf (the model in process), never by openai",
    )
    eval_output_tokens: PositiveInt | dict[str, PositiveInt] = Field(
        2000,
        description="mean output tokens of an evaluation sample, for every benchmark or per "
        "benchmark evaluated (a split included; others left unused); capped at "
        "eval.max_new_tokens, or under budget forcing at the thinking budget plus "
        "answer_tokens, and scaled at each effort of "
        "per_effort by teacher_output_tokens' ratio to the reference effort (the student inherits "
        "the teacher's spacing)",
    )
    merge_s: Seconds = Field(
        120.0,
        description="seconds per merge job (two checkpoints read); an adapter merge (one "
        "checkpoint and the adapter) is billed the same",
    )
    reported_usd_per_mtok: (
        Annotated[list[PositiveFloat], Field(min_length=2, max_length=2)] | None
    ) = Field(
        None,
        description="the source's own cost of a million teacher output tokens, [low, high]: shown "
        "beside the bill's generation dollars per million output tokens (not used to bill)",
    )
    grpo_step_s: PositiveFloat = Field(
        60.0, description="seconds per GRPO step (generation, rewards and update)"
    )
    parallel_jobs: PositiveInt | None = Field(
        None,
        description="jobs of one part of the pipeline (generation, merges, evaluation) running "
        "at once: the nodes you can get; null: all of them",
    )
    benchmark_sizes: dict[Name, PositiveInt] = Field(
        {},
        description="problems of a benchmark before its limit: needed for a hub benchmark without "
        "a limit, whose size is not known offline (a local file is counted, before any where "
        "filter)",
    )
    source_rows: dict[Name, PositiveInt] = Field(
        {},
        description="rows a hub dataset source yields after its where filter: needed for one "
        "without a limit (a local file is counted, before any where filter)",
    )
    models: dict[str, ModelFigures] = Field(
        {},
        description="figures by model: the student's pretrained id, a teacher's server "
        "model_path (else its model). Once any is given, every model a GPU job holds needs one: "
        "the estimate refuses a job whose GPUs cannot hold its model, and bills its jobs at its "
        "own throughputs",
    )
    memory_fraction: float = Field(
        0.8,
        gt=0,
        le=1,
        description="share of each GPU's memory what the estimate counts may fill: a served "
        "model's weights (the rest holds its KV cache), or a training job's weights, adapter, "
        "gradients, optimizer state and activations (the rest: the CUDA context, NCCL buffers, "
        "the allocator's fragmentation, the weights a layer dequantises to compute)",
    )
    nf4_params_per_s: PositiveFloat = Field(
        7e6,
        description="weights one process quantises to NF4 per second in the staged loader "
        "(quantize_moe_experts; on the GPU when there is one): the processes of an FSDP2 shard "
        "group each quantise 1 / their number of every weight, so a training job's start "
        "(train_start_s) gains the model's quantised parameters / (this x fsdp_size; one "
        "device-map process alone). Default: measured on one CPU core by bench/staged_load.py",
    )

    @model_validator(mode="after")
    def _reported(self) -> Estimate:
        low_high = self.reported_usd_per_mtok
        if low_high and low_high[0] > low_high[1]:
            raise ValueError(f"reported_usd_per_mtok: [low, high], got {list(low_high)}")
        return self


class GpuType(_Figures):
    usd_per_hour: float = Field(ge=0, description="price of one GPU-hour")
    memory_gb: PositiveFloat = Field(description="memory of one GPU, in GB (1e9 bytes)")


class Cost(Section):
    """The cost ledger's rates. GPU time is sacct's when a SLURM job id was recorded, else wall time
    x GPUs of the rule's job; a GPU-hour costs its GPU type's price (or gpu_hour_usd)."""

    gpu_hour_usd: float = Field(
        0.0, ge=0, description="price of a GPU-hour of every rule, without gpu_types"
    )
    gpu_types: dict[Name, GpuType] = Field(
        {}, description="price and memory of each GPU type the rules run on"
    )
    gpu_type: Name | None = Field(
        None, description="the GPU type of every GPU rule not in gpu_type_by_rule"
    )
    gpu_type_by_rule: dict[str, Name] = Field(
        {}, description="GPU type by rule (e.g. generate, the teacher's jobs, on another type)"
    )
    gpus: dict[str, Annotated[int, Field(ge=0)]] = Field(
        {},
        description="GPUs per job, by rule; default: the job shapes of stillroom/plan/cluster.py",
    )
    estimate: Estimate = Field(
        Estimate(),
        description="figures of the bill before the run (stillroom estimate), which the ledger "
        "compares with what was spent",
    )

    @model_validator(mode="after")
    def _types(self) -> Cost:
        problems = []
        if self.gpu_types and self.gpu_hour_usd:
            problems.append(
                "gpu_hour_usd: exclusive with gpu_types (each GPU type has its price); give one"
            )
        if self.gpu_types and self.gpu_type is None:
            problems.append("gpu_type: the GPU type of the GPU rules, one of gpu_types")
        named = {"gpu_type": self.gpu_type} if self.gpu_type else {}
        named.update((f"gpu_type_by_rule.{r}", t) for r, t in self.gpu_type_by_rule.items())
        for key, name in named.items():
            if name not in self.gpu_types:
                problems.append(
                    f"{key}: '{name}' is not one of gpu_types "
                    f"({', '.join(self.gpu_types) or 'none given'})"
                )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def gpu_type_of(self, rule: str) -> str | None:
        """The GPU type a rule's jobs run on (None without gpu_types); ``train-<phase>``, a
        training phase with a layout of its own, runs on train's."""
        return self.gpu_type_by_rule.get(rule.split("-")[0], self.gpu_type)

    def gpu_rate(self, rule: str) -> float:
        """The price of a GPU-hour of ``rule``'s jobs."""
        kind = self.gpu_type_of(rule)
        return self.gpu_hour_usd if kind is None else self.gpu_types[kind].usd_per_hour
