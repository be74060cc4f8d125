"""The generated test cases: what each one draws, that they are seeded, which the reference keeps,
and that the validator holds a candidate to every one of them."""

import textwrap

import pytest
import torch

from stillroom.kernels import evaluate
from stillroom.kernels.cases import CASES, LARGE, generate
from stillroom.kernels.channel import flatten

from .test_validator import HEADER, HONEST, RELU, candidate


def _cases(model, template, names=CASES, seed=0):
    def run(inputs):
        with torch.no_grad():
            return flatten(
                model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            )

    return {c.name: c for c in generate(model, template, names=names, seed=seed, run=run)}


def test_value_cases_redraw_the_floating_inputs_only():
    template = [torch.rand(8, 6), torch.randint(0, 6, (8,))]
    cases = _cases(lambda x, t: x.sum() + t.sum(), template)
    assert set(cases) == set(CASES)
    x = {name: cases[name].inputs[0] for name in ("mixed_sign", "negative", "zero", "large")}
    assert (x["mixed_sign"] < 0).any() and (x["mixed_sign"] > 0).any()
    assert (x["negative"] <= 0).all() and (x["zero"] == 0).all()
    assert x["large"].abs().max() > LARGE and cases["large"].scale_atol
    assert not any(cases[n].scale_atol for n in cases if n != "large")
    for name in x:  # the integer input is trial 0's
        assert torch.equal(cases[name].inputs[1], template[1])


def test_odd_shape_changes_a_shared_size_consistently_and_redraws_integers_in_range():
    template = [torch.rand(32, 48), torch.rand(48, 40), torch.randint(3, 9, (32,))]
    odd = _cases(lambda a, b, t: (a @ b).sum(1) + t, template, names=["odd_shape"])["odd_shape"]
    a, b, t = odd.inputs
    assert (a.shape, b.shape, t.shape) == ((33, 49), (49, 41), (33,))
    assert t.dtype == torch.int64 and 3 <= int(t.min()) and int(t.max()) <= 8
    # floating values are resampled from trial 0's: never negative here, as torch.rand
    assert (a >= 0).all() and set(a.flatten().tolist()) <= set(template[0].flatten().tolist())


def test_a_size_the_reference_refuses_is_left_as_it_was():
    linear = torch.nn.Linear(48, 40)  # in_features fixed: only the batch size may change
    odd = _cases(linear, [torch.randn(32, 48)], names=["odd_shape"])["odd_shape"]
    assert odd.inputs[0].shape == (33, 48) and odd.expected[0].shape == (33, 40)


def test_a_case_with_non_finite_reference_outputs_is_dropped():
    # log: NaN below 0, -inf at 0; the shape case resamples trial 0's positive values
    assert set(_cases(torch.log, [torch.rand(16, 8) + 0.5])) == {"odd_shape"}


def test_cases_are_seeded():
    template = [torch.randn(16, 10), torch.randn(10)]
    model = lambda x, y: x + y  # noqa: E731
    first, again, other = (_cases(model, template, seed=s) for s in (3, 3, 4))
    for name in CASES:
        assert all(
            torch.equal(p, q) for p, q in zip(first[name].inputs, again[name].inputs, strict=True)
        )
    assert not torch.equal(first["mixed_sign"].inputs[0], other["mixed_sign"].inputs[0])


def test_an_unknown_case_is_refused():
    with pytest.raises(ValueError, match="unknown test case"):
        evaluate(RELU, HONEST, cases=["tiny"])


# ReLU as KernelBench draws it: torch.rand, never negative, so that an identity passes every trial
NONNEGATIVE_RELU = RELU.replace("torch.randn(16, 256)", "torch.rand(16, 256)")
IDENTITY = candidate("""
    out = torch.empty_like(x)
    launch(x, out)  # launched, and its result thrown away
    return x.view_as(x)
""")


@pytest.mark.slow
def test_an_output_that_is_the_input_fails_the_value_cases():
    r = evaluate(NONNEGATIVE_RELU, IDENTITY, cases=[])
    # the trials' values alone cannot tell (why the cases exist); the aliasing rule can
    assert r.exec_reward == 1 and r.reward == 0, r
    r = evaluate(NONNEGATIVE_RELU, IDENTITY)
    assert r.exec_reward == 0 and r.cases == list(CASES)
    failed = {why.split(":")[0] for why in r.reasons}
    assert {"case mixed_sign", "case negative", "case large"} <= failed, r.reasons
    assert not any(why.startswith("trial") for why in r.reasons)


def test_a_kernel_that_assumes_divisible_sizes_fails_odd_shape():
    # no mask: the tail of an odd size is never written (and reads past the end are undefined)
    unmasked = HEADER.replace(
        "    mask = offs < n\n    x = tl.load(x_ptr + offs, mask=mask)\n"
        "    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)",
        "    x = tl.load(x_ptr + offs)\n    tl.store(out_ptr + offs, tl.maximum(x, 0.0))",
    ).replace("triton.cdiv(x.numel(), 1024)", "x.numel() // 1024")
    source = unmasked + textwrap.dedent(HONEST.split(HEADER)[1])
    r = evaluate(RELU, source, cases=["odd_shape"])
    assert r.reward == 0 and any(why.startswith("case odd_shape: ") for why in r.reasons), r.reasons


def test_large_inputs_meet_a_tolerance_scaled_to_the_outputs():
    matmul = textwrap.dedent('''
        """(M, K) @ (K, N)."""
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, a, b):
                return torch.matmul(a, b)


        def get_inputs():
            return [torch.randn(16, 64), torch.randn(64, 8)]


        def get_init_inputs():
            return []
        ''')
    blocked = textwrap.dedent("""
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl


        @triton.jit
        def mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr):
            rm = tl.program_id(0) * BM + tl.arange(0, BM)
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, K, BK):  # a blocked sum: a different order from torch's
                rk = k0 + tl.arange(0, BK)
                a = tl.load(a_ptr + rm[:, None] * K + rk[None, :],
                            mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
                b = tl.load(b_ptr + rk[:, None] * N + rn[None, :],
                            mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
                acc += tl.dot(a, b)
            tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc,
                     mask=(rm[:, None] < M) & (rn[None, :] < N))


        class ModelNew(nn.Module):
            def forward(self, a, b):
                a, b = a.contiguous(), b.contiguous()
                M, K = a.shape
                N = b.shape[1]
                c = torch.empty((M, N), device=a.device, dtype=torch.float32)
                mm_kernel[(triton.cdiv(M, 16), triton.cdiv(N, 16))](
                    a, b, c, M, N, K, BM=16, BN=16, BK=16)
                return c
        """)
    r = evaluate(matmul, blocked, trials=1, cases=["large"])
    assert r.reward == 1 and r.cases == ["large"], r.reasons
