"""Teacher backends, one interface (base.py), chosen per teacher in config: the offline
``procedural`` stand-in, an OpenAI-compatible API, a self-hosted SGLang server, local
transformers."""

from collections.abc import Mapping
from typing import Any

from ..provenance.sidecars import Notes
from .base import Completion, SkipSample, Teacher, TeacherError

__all__ = ["Completion", "SkipSample", "Teacher", "TeacherError", "make_teacher"]


def make_teacher(
    name: str, spec: Mapping[str, Any], notes: Notes | None = None, service: str | None = None
) -> Teacher:
    """The backend ``spec`` names; ``notes``: as ``Teacher``'s; ``service``: the service file of
    the server a self-hosted teacher's job is a client of (none: it starts its own)."""
    backend = spec.get("backend")
    if backend == "procedural":
        from .procedural import ProceduralTeacher

        return ProceduralTeacher(name, spec, notes)
    if backend == "openai":
        from .openai import OpenAITeacher

        return OpenAITeacher(name, spec, notes)
    if backend == "hf":
        from .hf import HFTeacher

        return HFTeacher(name, spec, notes)
    if backend == "sglang":
        from .sglang import SGLangTeacher

        return SGLangTeacher(name, spec, notes, service)
    raise ValueError(
        f"teachers.{name}.backend: {backend!r} is not one of procedural, openai, sglang, hf"
    )
