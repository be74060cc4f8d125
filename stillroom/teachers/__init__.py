"""Teacher backends: one interface, chosen per teacher in config.

A backend turns (problem, effort, sample index) into a ``Completion``. The embedded default uses
the offline ``procedural`` teacher; real teachers (an OpenAI-compatible API, a self-hosted SGLang
server, local transformers) plug in here with the same interface.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Completion:
    text: str  # what the teacher wrote, reasoning included (<think>…</think> answer)
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    model: str  # the model id the backend reports
    reasoning: str | None = None  # the reasoning part alone, when the backend separates it
    extra: dict[str, Any] = field(default_factory=dict)


class TeacherError(RuntimeError):
    """A sample that failed for good; the driver records it with its error instead of dropping it."""

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


class SkipSample(Exception):
    """A sample deliberately not requested (e.g. its prompt cannot fit the context); recorded with the reason."""


class Teacher(ABC):
    def __init__(self, name: str, spec: Mapping[str, Any]):
        self.name, self.spec = name, dict(spec)

    def complete(
        self, problem: Mapping[str, Any], effort: str, sample_index: int, seed: int
    ) -> Completion:
        """One sample for one problem at one effort level (backends implement this or ``acomplete``)."""
        raise TypeError(
            f"teacher '{self.name}' ({type(self).__name__}) is asynchronous: use acomplete"
        )

    async def acomplete(
        self, problem: Mapping[str, Any], effort: str, sample_index: int, seed: int
    ) -> Completion:
        return self.complete(problem, effort, sample_index, seed)

    async def astart(self) -> None:
        """Acquire what the backend needs (e.g. start a server); the driver calls it before the first sample."""

    async def aclose(self) -> None:
        """Release connections and servers; the driver calls it once the shard is done, also on failure."""


def make_teacher(name: str, spec: Mapping[str, Any]) -> Teacher:
    backend = spec.get("backend")
    if backend == "procedural":
        from .procedural import ProceduralTeacher

        return ProceduralTeacher(name, spec)
    if backend == "openai":
        from .openai import OpenAITeacher

        return OpenAITeacher(name, spec)
    if backend == "hf":
        from .hf import HFTeacher

        return HFTeacher(name, spec)
    if backend == "sglang":
        from .sglang import SGLangTeacher

        return SGLangTeacher(name, spec)
    raise ValueError(
        f"teacher '{name}': unknown backend {backend!r} (available: procedural, openai, sglang, hf)"
    )
