"""The interface every teacher backend implements: (problem, effort, sample index) ->
Completion."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from ..config import Section
from ..provenance.sidecars import Notes


@dataclass
class Completion:
    # what the teacher wrote, reasoning included (<think>…</think> answer)
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    model: str  # the model id the backend reports
    reasoning: str | None = None  # the reasoning part alone, when the backend separates it
    extra: dict[str, Any] = field(default_factory=dict)


class TeacherError(RuntimeError):
    """A sample that failed for good; the driver records it with its error instead of dropping
    it."""

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


class SkipSample(Exception):
    """A sample deliberately not requested (e.g. its prompt cannot fit the context); recorded with
    the reason."""


class Teacher:
    """The base of every backend. A backend implements ``complete`` (synchronous) or ``acomplete``
    (asynchronous); ``astart`` and ``aclose`` are optional hooks that do nothing here. ``notes``
    gets what the teacher reads besides the prompts (its model, tokenizer, reference solutions),
    for the provenance of the job that drives it (None: not kept)."""

    Spec: type[Section]  # the backend's config (stillroom.config.generation)

    def __init__(self, name: str, spec: Mapping[str, Any], notes: Notes | None = None):
        self.name = name
        self.notes = Notes() if notes is None else notes
        backend = get_args(self.Spec.model_fields["backend"].annotation)[0]  # the class says it
        spec = {"backend": backend, **spec}
        self.spec = self.Spec.parse(spec, where=f"teachers.{name}").dump()

    @property
    def concurrency(self) -> int:
        """Requests in flight per shard job."""
        return self.spec["concurrency"]

    def complete(
        self, problem: Mapping[str, Any], effort: str, sample_index: int, seed: int
    ) -> Completion:
        """One sample for one problem at one effort level (backends implement this or
        ``acomplete``)."""
        raise TypeError(
            f"teacher '{self.name}' ({type(self).__name__}) is asynchronous: use acomplete"
        )

    async def acomplete(
        self, problem: Mapping[str, Any], effort: str, sample_index: int, seed: int
    ) -> Completion:
        return self.complete(problem, effort, sample_index, seed)

    async def astart(self) -> None:
        """Acquire what the backend needs (e.g. start a server); the driver calls it before the
        first sample. By default there is nothing to acquire."""
        return None

    async def aclose(self) -> None:
        """Release connections and servers; the driver calls it once the shard is done, also on
        failure. By default there is nothing to release."""
        return None
