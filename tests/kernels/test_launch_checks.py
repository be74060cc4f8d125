"""The launch rules on the values the replay measured (launch_checks.py, replay.Analysis): a load's
coalescing from the addresses its lanes touched, instructions as executed (run-time loops once,
compile-time ones unrolled), and on CPU every access checked against the launch's buffers."""

from __future__ import annotations

import pytest

from stillroom.kernels import evaluate

from .test_validator import HONEST, RELU

LOAD = "    x = tl.load(x_ptr + offs, mask=mask)"


def rules(source: str, **options):
    return evaluate(RELU, source, trials=1, cases=[], **options)


@pytest.mark.parametrize(
    ("offsets", "ok"),
    [
        ("offs", True),
        ("offs * 2", False),
        ("offs * one", True),  # one == 1 at this launch
        ("offs * three", False),
        ("offs + 3", True),  # misaligned: one more sector now and then
        ("(offs // 2) * 64 + offs % 2", False),  # pairs of neighbours, each pair 256 bytes apart
        ("(offs // 2) * 64", False),
        ("(offs // 64) % 4", True),  # a broadcast: a warp's lanes share one address
        ("offs * 2 + offs - offs * 2", True),  # terms that cancel to a unit stride
        ("offs * 3 + offs - offs", False),  # terms that cancel to a stride of 3
        ("tl.program_id(0)", True),  # a scalar: nothing to coalesce
    ],
)
def test_coalescing_is_judged_on_the_addresses_the_lanes_touch(offsets, ok):
    source = HONEST.replace("x_ptr, out_ptr, n,", "x_ptr, out_ptr, n, one, three,").replace(
        LOAD, f"    x = tl.load(x_ptr + {offsets}, mask=({offsets}) < n)"
    )
    source = source.replace(
        "(x, out, x.numel(), BLOCK=1024)", "(x, out, x.numel(), 1, 3, BLOCK=1024)"
    )
    r = rules(source)
    uncoalesced = [why for why in r.reasons if "no unit-stride axis" in why]
    assert (uncoalesced == []) == ok, (offsets, r.reasons)
    if not ok:  # the site, as the canonical source writes it
        assert uncoalesced[0].startswith("kernel relu_kernel: x = tl.load(x_ptr + "), r
        assert "touch" in uncoalesced[0] and "x the memory sectors" in uncoalesced[0], r


def test_a_run_time_loop_counts_once_and_a_compile_time_one_every_iteration():
    loop = "    for i in range(0, REPS):\n        x = x * 1.0 + 0.0\n"
    source = HONEST.replace("BLOCK: tl.constexpr", "REPS, BLOCK: tl.constexpr").replace(
        "    tl.store(", loop + "    tl.store("
    )
    run_time = source.replace(
        "(x, out, x.numel(), BLOCK=1024)", "(x, out, x.numel(), 5000, BLOCK=1024)"
    )
    assert rules(run_time).reward == 1
    constexpr = source.replace(
        "REPS, BLOCK: tl.constexpr", "REPS: tl.constexpr, BLOCK: tl.constexpr"
    )
    r = rules(
        constexpr.replace(
            "(x, out, x.numel(), BLOCK=1024)", "(x, out, x.numel(), 1000, BLOCK=1024)"
        )
    )
    assert r.exec_reward == 1 and r.rule_reward == 0, r
    (why,) = [w for w in r.reasons if "instructions" in w]
    assert int(why.split("about ")[1].split()[0]) > 2000 and why.endswith("more than 2000"), why
    assert (
        rules(
            constexpr.replace(
                "(x, out, x.numel(), BLOCK=1024)", "(x, out, x.numel(), 10, BLOCK=1024)"
            )
        ).reward
        == 1
    )


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            (LOAD, "    x = tl.load(x_ptr + offs + 64, mask=mask)"),
            "element(s) outside every buffer",
        ),
        # from the input's pointer to memory it does not own, unmasked
        ((LOAD, "    x = tl.load(x_ptr + offs + (1 << 40))"), "outside every buffer passed"),
    ],
)
def test_an_access_outside_the_launchs_buffers_stops_the_kernel_before_it_happens(change, why):
    r = evaluate(RELU, HONEST.replace(*change), trials=1, cases=[])
    assert r.reward == 0 and r.status == "scored", r
    assert any(why in reason for reason in r.reasons), r.reasons
