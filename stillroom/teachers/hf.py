"""A local transformers model as the teacher: batched sampling on CPU or one GPU, for tiny runs and
tests.

Requests arrive one sample at a time from the generation driver (as for a server); a batcher
collects up to ``batch_size`` of them and runs one ``generate`` call in a worker thread. Built on
the openai backend's request path, so efforts (as a system prompt), the context guard (with the
model's own tokenizer) and the token budget work the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..config import HFSpec
from ..provenance.sidecars import Notes
from .base import Completion
from .openai import OpenAITeacher


class HFTeacher(OpenAITeacher):
    Spec = HFSpec

    def __init__(self, name: str, spec: Mapping[str, Any], notes: Notes | None = None):
        super().__init__(name, spec, notes)
        self.lm = None
        self.queue: asyncio.Queue | None = None
        self.batcher: asyncio.Task | None = None

    async def astart(self) -> None:
        from ..runtime.lm import LocalLM

        self.lm = await asyncio.to_thread(LocalLM, self.spec["model_path"], self.spec["threads"])
        self.notes.add_model(self.spec["model_path"], f"teacher:{self.name}")
        self.queue = asyncio.Queue()
        self.batcher = asyncio.create_task(self._batch_forever())

    async def _send(
        self,
        body: dict[str, Any],
        problem: Mapping[str, Any],
        effort: str,
        sample_index: int,
        seed: int,
    ) -> Completion:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put((body, future))
        return await future

    async def _batch_forever(self) -> None:
        while True:
            batch = [await self.queue.get()]
            # let the other in-flight requests join this batch
            await asyncio.sleep(0.01)
            while not self.queue.empty() and len(batch) < self.spec["batch_size"]:
                batch.append(self.queue.get_nowait())
            first = batch[0][0]
            try:
                results = await asyncio.to_thread(
                    self.lm.sample,
                    [self.lm.render(body["messages"]) for body, _ in batch],
                    temperature=first.get("temperature", 1.0),
                    top_p=first.get("top_p", 1.0),
                    max_new_tokens=max(body.get("max_tokens", 512) for body, _ in batch),
                    seed=first["seed"],
                )
            except Exception as exc:
                # every waiting request learns about it
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (body, future), (sample,) in zip(batch, results, strict=True):
                found = self.THINK.findall(sample.text)
                future.set_result(
                    Completion(
                        text=sample.text,
                        finish_reason=sample.finish_reason,
                        prompt_tokens=sample.prompt_tokens,
                        completion_tokens=sample.completion_tokens,
                        model=self.spec["model"],
                        reasoning=found[-1] if found else None,
                        extra={
                            "attempts": 1,
                            "sampling": {k: v for k, v in body.items() if k != "messages"},
                        },
                    )
                )

    async def aclose(self) -> None:
        if self.batcher is not None:
            self.batcher.cancel()
            self.batcher = None
        await super().aclose()
