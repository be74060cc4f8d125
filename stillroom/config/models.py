"""The models an experiment compares, each a typed identity built once from the config: its name
(the directory under ckpt/ and eval/, the row of a table), what it is, and the numbers that make
it. Paths, params, tables and plots read the fields; nothing parses a name back into a number."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Section

ModelKind = Literal["base", "sft", "select", "grpo", "merge"]


class ModelId(Section):
    name: str = Field(description="the model's directory under ckpt/ and eval/, its table row")
    kind: ModelKind
    ratio: float | None = Field(
        None, description="merge: its ratio, the fine-tune's share of the interpolated weights"
    )
    selection: str | None = Field(
        None, description="select: the dataset selection of the ablation it was fine-tuned on"
    )

    @classmethod
    def base(cls) -> ModelId:
        return cls(name="base", kind="base")

    @classmethod
    def sft(cls) -> ModelId:
        return cls(name="sft", kind="sft")

    @classmethod
    def grpo(cls) -> ModelId:
        return cls(name="grpo", kind="grpo")

    @classmethod
    def select(cls, selection: str) -> ModelId:
        return cls(name=f"select-{selection}", kind="select", selection=selection)

    @classmethod
    def merge(cls, ratio: float) -> ModelId:
        # the name is Python's shortest repr of the ratio (0.5, 0.3333333, 1e-05), written once
        # here; the ratio itself travels as this field
        return cls(name=f"merge-{float(ratio)!r}", kind="merge", ratio=float(ratio))

    @property
    def weight(self) -> float | None:
        """The fine-tune's share of the weights, where it is known: base 0, sft 1, a merge its
        ratio (a plot's x axis)."""
        return {"base": 0.0, "sft": 1.0}.get(self.kind, self.ratio)
