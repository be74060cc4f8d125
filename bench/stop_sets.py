"""Answer lengths and cap-hit rates with a model's stop set against the rule it replaced (the
ChatML ``<|im_end|>`` when the tokenizer has it, else the tokenizer's eos), on the tiny
Llama-3-style and Gemma-style students of the tests (tests/chat_students.py), sampled in the same
run with the same seeds.

    python bench/stop_sets.py [--problems 32] [--samples 4] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stillroom.runtime.lm import LocalLM  # noqa: E402 - after the path of this checkout
from stillroom.runtime.stops import StopSet  # noqa: E402
from tests.chat_students import STYLES, build  # noqa: E402


def old_rule(lm: LocalLM) -> StopSet:
    """The single stop token LocalLM used before stop sets."""
    eos = lm.tok.convert_tokens_to_ids("<|im_end|>")
    if eos is None or eos == lm.tok.unk_token_id:
        eos = lm.tok.eos_token_id
    return StopSet((eos,), (lm.tok.decode([eos], skip_special_tokens=False),))


def measure(lm: LocalLM, stops: StopSet, prompts, k: int, cap: int) -> dict:
    lm.stops = stops
    out = [
        s
        for group in lm.sample(prompts, k=k, temperature=1.0, max_new_tokens=cap, seed=0)
        for s in group
    ]
    return {
        "stops": list(stops.strings),
        "answers": len(out),
        "tokens_per_answer": round(sum(s.completion_tokens for s in out) / len(out), 2),
        "cap_hit_rate": round(sum(s.finish_reason == "length" for s in out) / len(out), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        for style in STYLES:
            lm = LocalLM(str(build(Path(root), style)))
            prompts = [
                lm.render([{"role": "user", "content": f"What is {i} + {i % 7}?"}])
                for i in range(args.problems)
            ]
            after = lm.stops
            report = {
                "before": measure(lm, old_rule(lm), prompts, args.samples, args.max_new_tokens),
                "after": measure(lm, after, prompts, args.samples, args.max_new_tokens),
            }
            print(json.dumps({"student": style, **report}))


if __name__ == "__main__":
    main()
