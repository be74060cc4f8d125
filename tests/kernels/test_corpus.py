"""The corpus of honest real-world Triton kernels (tests/kernels/corpus, issue 41): every entry
earns 1, or earns 0 with the reason its entry lists (a refusal a GPU compile would give too, a
cause another branch fixes, or an open one). The fast slice runs with GRPO's default options; the
rest is marked slow and runs with one trial and the odd-shape case."""

from __future__ import annotations

import pytest

from stillroom.kernels import evaluate

from .corpus import (
    BLOCK_LIMIT,
    BY_NAME,
    ENTRIES,
    FAST,
    RULE_LIMITS,
    RULES,
    expected_reason,
    options,
    problem_source,
)


def _params():
    return [
        pytest.param(e.name, id=e.name, marks=() if e.name in FAST else pytest.mark.slow)
        for e in ENTRIES
    ]


@pytest.mark.parametrize("name", _params())
def test_a_corpus_kernel_earns_1_or_its_listed_refusal(name):
    entry = BY_NAME[name]
    r = evaluate(problem_source(entry.problem), entry.candidate, **options(name))
    assert r.status == "scored", (name, r.status, r.reasons)
    expected = expected_reason(name)
    if expected is None:
        assert r.reward == 1, (name, r.reasons)
    else:
        assert r.reward == 0 and any(expected in reason for reason in r.reasons), (
            f"{name} was expected to earn 0 with {expected!r}: fixed? update the corpus's lists",
            r.reward,
            r.reasons,
        )


def test_the_corpus_spans_the_issue():
    """At least 100 kernels over at least 30 problems, from libraries and from every style; the
    lists name entries that exist, and the fast slice earns 1."""
    problems = {e.problem for e in ENTRIES}
    kinds = {e.kind for e in ENTRIES}
    assert len(ENTRIES) >= 100 and len(problems) >= 30, (len(ENTRIES), len(problems))
    assert {
        "library",
        "inductor-style",
        "tutorial-style",
        "unsloth-style",
        "attorch-style",
    } <= kinds
    listed = set(RULES) | set(FAST)
    assert listed <= set(BY_NAME), sorted(listed - set(BY_NAME))
    assert not set(FAST) & {n for n in BY_NAME if expected_reason(n)}
    for e in ENTRIES:
        problem_source(e.problem)  # raises for a problem that does not exist


@pytest.mark.slow  # imports Liger-Kernel (with transformers) and fla: seconds
def test_library_entries_load_the_kernel_from_the_installed_package():
    """A library entry's candidate imports the package (never a copy of its source), and the
    package imports here, outside the sandbox."""
    from .corpus import import_error

    for e in ENTRIES:
        if e.kind == "library":
            assert (
                f"from {e.requires} import" in e.candidate or f"import {e.requires}" in e.candidate
            )
            assert "@triton.jit" not in e.candidate, e.name
            assert import_error(e.requires) is None, (e.name, import_error(e.requires))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, why in RULES.items() if why == BLOCK_LIMIT])
def test_a_kernel_refused_by_the_block_limit_earns_1_under_its_configs_limit(name):
    """The block-limit refusals are the rule reward's, not a wrong kernel: under a limit that
    admits every config the library autotunes over, the same kernel earns 1."""
    entry = BY_NAME[name]
    r = evaluate(problem_source(entry.problem), entry.candidate, **options(name), **RULE_LIMITS)
    assert (r.status, r.reward) == ("scored", 1), (name, r.reasons)
