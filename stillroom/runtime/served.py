"""Evaluation through a served model: the same interface as ``LocalLM`` (render, encode, decode,
complete) over an OpenAI-compatible ``/v1/completions`` endpoint, so continue_truncated and budget
forcing run unchanged on a cluster.

Raw completions, not chat: the prompt is rendered here with the checkpoint's own chat template, and
a continuation is the exact text so far (prompt + answer) sent back as the prompt (the evaluate
stage's ``open_lm`` picks the backend, and starts an sglang server with the teachers' launcher).
Every request carries the checkpoint's stop set (stops.py), as ids or strings as ``stop_by`` says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .lm import ChatTokens, Sample
from .stops import stop_set

RETRIES = 4


class ServedLM(ChatTokens):
    def __init__(
        self,
        model_dir: str,
        base_url: str,
        model: str,
        *,
        concurrency: int,
        api_key: str | None = None,
        timeout_s: float = 3600.0,
        stop_by: str = "strings",
    ):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.stops = stop_set(model_dir, self.tok)
        # the request's stop list: token ids for SGLang and vLLM, which match stop strings against
        # text decoded without special tokens; strings for servers that take only OpenAI's fields
        self.stop_field = (
            {"stop_token_ids": list(self.stops.ids)}
            if stop_by == "token_ids"
            else {"stop": list(self.stops.strings)}
        )
        self.base_url, self.model, self.concurrency = base_url.rstrip("/"), model, concurrency
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        self.name = model
        self.served_by: dict[str, Any] | None = None  # a shared server's identity (service.py)

    def complete(
        self,
        prefixes: Sequence[Sequence[int]],
        *,
        temperature: float,
        top_p: float = 1.0,
        max_new_tokens: int,
        seed: int,
    ) -> list[Sample]:
        # Special tokens stay in the prompt text: they are the chat template's turn markers.
        texts = [self.tok.decode(list(p), skip_special_tokens=False) for p in prefixes]
        body = {
            "model": self.model,
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            **self.stop_field,
        }
        return asyncio.run(self._all(texts, [len(p) for p in prefixes], body, seed))

    async def _all(
        self, texts: list[str], lengths: list[int], body: dict[str, Any], seed: int
    ) -> list[Sample]:
        import aiohttp

        gate = asyncio.Semaphore(self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as session:

            async def one(i: int) -> Sample:
                async with gate:
                    data = await self._post(session, {**body, "prompt": texts[i], "seed": seed + i})
                choice = data["choices"][0]
                text = choice.get("text") or ""
                ids = self.encode(text)
                used = (data.get("usage") or {}).get("completion_tokens", len(ids))
                finish = choice.get("finish_reason")
                # an abort or error is no finished answer
                if finish not in ("stop", "length", "eos"):
                    raise RuntimeError(
                        f"{self.base_url}/completions: finish_reason {finish!r} for prompt {i}"
                    )
                reason = "length" if finish == "length" else "stop"
                return Sample(text, reason, lengths[i], used, ids)

            return list(await asyncio.gather(*(one(i) for i in range(len(texts)))))

    async def _post(self, session, payload: dict[str, Any]) -> dict[str, Any]:
        import aiohttp

        for attempt in range(RETRIES):
            try:
                async with session.post(self.base_url + "/completions", json=payload) as resp:
                    if resp.status < 400:
                        return await resp.json()
                    if resp.status != 429 and resp.status < 500:  # refused: retrying won't help
                        hint = (
                            " (a server that takes no stop_token_ids needs "
                            "eval.backend.stop_by: strings)"
                            if "stop_token_ids" in payload
                            else ""
                        )
                        raise ValueError(
                            f"{self.base_url}/completions refused the request: HTTP "
                            f"{resp.status}: {(await resp.text())[:300]}{hint}"
                        )
                    detail = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                detail = repr(exc)
            if attempt + 1 < RETRIES:
                await asyncio.sleep(2**attempt)
        raise RuntimeError(f"{self.base_url}/completions failed {RETRIES} times; last: {detail}")
