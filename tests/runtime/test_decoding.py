"""Continue-truncated and budget forcing on a real tiny model (greedy), plus the forcing rules on a
scripted model where the subject is which answers get forced."""

import pytest

from stillroom.runtime.decoding import END_THINK, budget_force, continue_truncated
from stillroom.runtime.lm import LocalLM, Sample

GREEDY = {"temperature": 0.0, "top_p": 1.0, "seed": 0}


@pytest.fixture(scope="module")
def lm(setup):
    return LocalLM(str(setup / "base"))


def prompt(lm, text="What is 2 + 3?"):
    return lm.encode(lm.render([{"role": "user", "content": text}]))


def test_continued_answer_reproduces_the_uninterrupted_generation(lm):
    p = prompt(lm)
    (whole,) = lm.complete([p], max_new_tokens=40, **GREEDY)
    first = lm.complete([p], max_new_tokens=12, **GREEDY)
    (answer,) = continue_truncated(lm, [p], first, limit=40, request_tokens=12, **GREEDY)
    assert answer.token_ids == whole.token_ids
    assert answer.finish_reason == whole.finish_reason
    if whole.finish_reason == "length":
        assert len(answer.segments) == 4 and [len(lm.encode(s)) > 0 for s in answer.segments]
        assert "".join(answer.segments) == lm.decode(whole.token_ids)


def test_continuation_stops_at_the_overall_limit(lm):
    ps = [prompt(lm), prompt(lm, "A much longer question about what 17 + 25 is, asked politely?")]
    first = lm.complete(ps, max_new_tokens=8, **GREEDY)
    answers = continue_truncated(lm, ps, first, limit=20, request_tokens=8, **GREEDY)
    for a in answers:
        assert a.completion_tokens <= 20
        assert a.finish_reason == "stop" or a.completion_tokens == 20


def test_budget_forcing_closes_thinking_exactly_at_the_budget(lm):
    p = prompt(lm)
    (free,) = lm.complete([p], max_new_tokens=10, **GREEDY)
    assert END_THINK not in free.text  # a random model never closes its thinking
    (answer,) = budget_force(lm, [p], budget=10, answer_tokens=6, cue="\nThe answer is", **GREEDY)
    forced = lm.encode(END_THINK + "\nThe answer is")
    assert answer.forced and answer.thinking_tokens == 10
    assert (
        answer.token_ids[:10] == free.token_ids
        and answer.token_ids[10 : 10 + len(forced)] == forced
    )
    assert answer.completion_tokens <= 10 + len(forced) + 6 and len(answer.segments) == 3


class Scripted:
    """A model whose first request returns scripted samples; later requests answer 'X' and stop."""

    def __init__(self, lm, texts):
        self.lm, self.texts, self.calls = lm, texts, []

    def encode(self, text):
        return self.lm.encode(text)

    def decode(self, ids):
        return self.lm.decode(ids)

    def complete(self, prefixes, *, max_new_tokens, **_):
        self.calls.append((len(prefixes), max_new_tokens))
        if len(self.calls) == 1:
            out = []
            for text, reason in self.texts:
                ids = self.encode(text)[:max_new_tokens]
                out.append(Sample(self.decode(ids), reason, 0, len(ids), ids))
            return out
        ids = self.encode(" X")
        return [Sample(" X", "stop", 0, len(ids), ids) for _ in prefixes]


def test_only_answers_still_thinking_at_the_budget_are_forced(lm):
    done = "<think>short</think>\\nThe answer is 5"
    texts = [
        (done, "stop"),
        ("<think>short</think>\\nThe answer", "length"),
        ("<think>long long long", "length"),
    ]
    model = Scripted(lm, texts)
    a, b, c = budget_force(model, [[1], [2], [3]], budget=30, answer_tokens=4, cue=" ok", **GREEDY)
    assert not a.forced and a.segments == [lm.decode(lm.encode(done))] and a.finish_reason == "stop"
    assert a.thinking_tokens == len(lm.encode("<think>short</think>"))
    assert (
        not b.forced and b.segments[-1] == " X"
    )  # finished thinking within B: may finish its answer
    assert (
        c.forced
        and c.segments[1] == END_THINK + " ok"
        and c.thinking_tokens == len(lm.encode(texts[2][0]))
    )
    assert model.calls == [(3, 30), (2, 4)]
