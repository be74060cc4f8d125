"""The launch rules on the values the replay measured (launch_checks.py, replay.Analysis): a load's
coalescing from the addresses its lanes touched, instructions as executed (run-time loops once,
compile-time ones unrolled), and on CPU every access checked against the launch's buffers."""

from __future__ import annotations

import numpy as np
import pytest

from stillroom.kernels import evaluate
from stillroom.kernels.launch_checks import MAX_SECTOR_RATIO
from stillroom.kernels.replay import Analysis

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


def sector_ratio(addresses, mask=None, itemsize: int = 4) -> float:
    """touched / fewest sectors that replay.Analysis measures of one access of element offsets."""
    analysis = Analysis()
    analysis.recording = True
    analysis.access("tl.load", np.asarray(addresses) * itemsize, mask, itemsize)
    (entry,) = analysis.sites.values()
    return entry["touched"] / entry["fewest"]


def middle_dim_blocks(s0: int, s1: int, s2: int, xblock: int = 8, rblock: int = 16):
    """Every [XBLOCK, RBLOCK] block of offsets (and mask) an Inductor reduction over the middle
    dimension of a contiguous (s0, s1, s2) tensor loads: ``x0 + s2 * r + s1 * s2 * x1`` with
    ``x0 = xindex % s2``, ``x1 = xindex // s2`` (tests/kernels/corpus/inductor_style.py)."""
    xnumel = s0 * s2
    for start in range(0, xnumel, xblock):
        x = start + np.arange(xblock)[:, None]
        for r_start in range(0, s1, rblock):
            r = r_start + np.arange(rblock)[None, :]
            offsets = np.broadcast_to(x % s2 + s2 * r + s1 * s2 * (x // s2), (xblock, rblock))
            yield offsets, np.broadcast_to((x < xnumel) & (r < s1), (xblock, rblock))


@pytest.mark.parametrize("shape", [(4, 32, 16), (5, 33, 17), (4, 32, 17), (17, 9, 25), (3, 5, 40)])
def test_a_modulo_that_wraps_at_a_rows_edge_keeps_lanes_along_the_contiguous_axis(shape):
    # an odd size cuts the runs of xindex % s2 off the block's alignment: Triton compiles that
    # size with lanes along r, but on a size 8 divides it lays them along x and they coalesce;
    # the rule charges neither the row's edge nor that layout
    worst = max(sector_ratio(a, m) for a, m in middle_dim_blocks(*shape))
    assert worst <= MAX_SECTOR_RATIO, (shape, worst)


ELEMENT = np.arange(1024)


@pytest.mark.parametrize(
    ("offsets", "ratio"),
    [
        ((ELEMENT // 2) * 64 + ELEMENT % 2, 4.0),  # pairs: a jump every 2 elements is no row's edge
        ((ELEMENT // 4) * 64 + ELEMENT % 4, 2.0),  # quads: a jump every 4
        ((ELEMENT % 32) * 32 + ELEMENT // 32, 6.56),  # a transpose: no unit step at all
    ],
    ids=["pairs", "quads", "transpose"],
)
def test_jumps_denser_than_one_a_sector_are_charged(offsets, ratio):
    assert sector_ratio(offsets) == pytest.approx(ratio, abs=0.01)


def test_a_row_edge_does_not_hide_a_strided_axis_or_a_broadcast_one():
    lanes = np.arange(256)
    strided = (lanes % 32) * 8 + lanes // 32
    # a broadcast axis of 32 beside a strided one: lanes stay on the strided axis (the last)
    assert sector_ratio(np.broadcast_to(strided[None, :], (32, 256))) > 6
    # pairs in lines of 4: one jump in 16 bytes, less than a sector, so it is charged
    pairs = np.arange(256)[:, None] * 64 + np.array([0, 1, 32, 33])[None, :]
    assert sector_ratio(pairs) == 2.0


def test_a_remembered_access_pattern_is_judged_as_a_fresh_one_at_any_alignment():
    # Analysis remembers each pattern's sectors (addresses relative to the first, the first's
    # place in its sector, the mask): one analysis over many shifted and masked accesses must
    # keep per site what a fresh analysis of each access alone measures
    rng = np.random.default_rng(0)
    shared = Analysis()
    shared.recording = True
    patterns = [ELEMENT, (ELEMENT // 4) * 64 + ELEMENT % 4, (ELEMENT % 32) * 32]
    masks = [rng.random(ELEMENT.shape) < 0.9 for _ in patterns]
    worst = 0.0
    for shift in [0, 4, 8, 12, 16, 28, 32, 64, 4096 + 4]:
        for offsets, mask in zip(patterns, masks, strict=True):
            addresses = np.asarray(offsets) * 4 + shift
            shared.access("tl.load", addresses, mask, 4)
            fresh = Analysis()
            fresh.recording = True
            fresh.access("tl.load", addresses, mask, 4)
            (entry,) = fresh.sites.values()
            worst = max(worst, entry["touched"] / entry["fewest"])
            (kept,) = shared.sites.values()
            assert kept["touched"] / kept["fewest"] == pytest.approx(worst)
    # judged once per pattern and place in a sector: 0, 32 and 64 share one, as do 4 and 4100
    assert len(shared.judged) == 6 * len(patterns)
