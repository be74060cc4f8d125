"""Honest Triton written the many ways people write it earns 1: autotuned and heuristic kernels
(on CPU the replay runs the first config), triton.language under any alias, in constants and
annotations too (with or without postponed annotations), names imported from it, helpers, grid
lambdas, defaults, atomics into a zeroed buffer, host copies, a constant buffer of the module,
several outputs."""

from __future__ import annotations

import textwrap

import pytest

from stillroom.kernels import evaluate

from .test_validator import RELU

IMPORTS = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"

FORWARD = """

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        {launch}
        return out
"""


def relu(kernel: str, launch: str, imports: str = IMPORTS) -> str:
    return imports + "\n\n" + textwrap.dedent(kernel).strip() + "\n" + FORWARD.format(launch=launch)


HONEST = {
    "autotune with two configs": relu(
        """
        @triton.autotune(
            configs=[triton.Config({"BLOCK": 256}, num_warps=4), triton.Config({"BLOCK": 512})],
            key=["n"],
        )
        @triton.jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
        """,
        "relu_kernel[lambda meta: (triton.cdiv(x.numel(), meta['BLOCK']),)](x, out, x.numel())",
    ),
    "heuristics": relu(
        """
        @triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"]) // 4})
        @triton.jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
        """,
        "relu_kernel[lambda meta: (triton.cdiv(x.numel(), meta['BLOCK']),)](x, out, x.numel())",
    ),
    "a module constant through an alias of triton.language": relu(
        """
        FLOOR = L.constexpr(0.0)
        WIDTH = 1024


        @triton.jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: L.constexpr):
            offs = L.program_id(0) * BLOCK + L.arange(0, BLOCK)
            mask = offs < n
            L.store(out_ptr + offs, L.maximum(L.load(x_ptr + offs, mask=mask), FLOOR), mask=mask)
        """,
        "relu_kernel[(triton.cdiv(x.numel(), WIDTH),)](x, out, x.numel(), BLOCK=WIDTH)",
        imports="import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as L\n",
    ),
    "an annotation through an alias, postponed": relu(
        """
        @jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: lang.constexpr):
            offs = lang.program_id(0) * BLOCK + lang.arange(0, BLOCK)
            mask = offs < n
            x = lang.load(x_ptr + offs, mask=mask)
            lang.store(out_ptr + offs, lang.where(x > 0, x, 0.0), mask=mask)
        """,
        "relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)",
        imports="from __future__ import annotations\n\nimport torch\nimport torch.nn as nn\n"
        "import triton\nfrom triton import jit, language as lang\n",
    ),
    "an annotation through an alias": relu(
        """
        @jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: lang.constexpr):
            offs = lang.program_id(0) * BLOCK + lang.arange(0, BLOCK)
            mask = offs < n
            x = lang.load(x_ptr + offs, mask=mask)
            lang.store(out_ptr + offs, lang.maximum(x, 0.0), mask=mask)
        """,
        "relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)",
        imports="import torch\nimport torch.nn as nn\nimport triton\n"
        "from triton import jit, language as lang\n",
    ),
    "names imported from triton.language": relu(
        """
        @triton.jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: constexpr):
            offs = program_id(0) * BLOCK + arange(0, BLOCK)
            mask = offs < n
            store(out_ptr + offs, maximum(load(x_ptr + offs, mask=mask), 0.0), mask=mask)
        """,
        "relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)",
        imports=IMPORTS
        + "from triton.language import arange, constexpr, load, maximum, program_id, store\n",
    ),
    "a helper, a default, a static loop, a 2-D grid": relu(
        """
        @triton.jit
        def _clamp(v, low: tl.constexpr = 0.0):
            return tl.maximum(v, low)


        @triton.jit
        def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr = 256, PARTS: tl.constexpr = 2):
            base = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * BLOCK * PARTS
            for part in tl.static_range(PARTS):
                offs = base + part * BLOCK + tl.arange(0, BLOCK)
                mask = offs < n
                tl.store(out_ptr + offs, _clamp(tl.load(x_ptr + offs, mask=mask)), mask=mask)
        """,
        "relu_kernel[(triton.cdiv(x.numel(), 1024), 2)](x, out, x.numel())",
    ),
}


@pytest.mark.parametrize("name", list(HONEST))
def test_an_honest_relu_written_this_way_earns_1(name):
    r = evaluate(RELU, HONEST[name], trials=2)
    assert r.reward == 1, (name, r.reasons)


def test_the_replay_runs_the_first_config_of_an_autotuner_and_judges_every_one():
    """On CPU (no timing) the first config runs; a config the rules refuse is a rule failure even
    when it is not the one that ran, since a GPU's autotuner may pick it."""
    r = evaluate(RELU, HONEST["autotune with two configs"], trials=1)
    assert r.program == ["launch relu_kernel grid (16,) BLOCK=256 num_warps=4 (+1 configs)"]
    wide = HONEST["autotune with two configs"].replace(
        'triton.Config({"BLOCK": 512})', 'triton.Config({"BLOCK": 512}, num_warps=64)'
    )
    r = evaluate(RELU, wide, trials=1)
    assert r.exec_reward == 1 and r.rule_reward == 0, r
    assert r.reasons == [
        "kernel relu_kernel: num_warps=64 is 2048 threads per block, more than 1024"
    ]


SUM_ROWS = textwrap.dedent('''
    """Row sums of a matrix."""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return x.sum(dim=1)


    def get_inputs():
        return [torch.randn(24, 200)]


    def get_init_inputs():
        return []
    ''')


def test_atomics_into_a_zeroed_buffer_and_a_host_copy_of_a_transposed_input():
    """torch.zeros is replayed zeroed (an empty buffer would hold NaN); .t().contiguous() of an
    input is a host copy the replay makes from the fresh input."""
    source = IMPORTS + textwrap.dedent("""

        @triton.jit
        def partial_sums(xt_ptr, out_ptr, rows, cols, BLOCK: tl.constexpr):
            # xt is (cols, rows): each program adds one block of a column of xt into out
            col = tl.program_id(0)
            r = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            v = tl.load(xt_ptr + col * rows + r, mask=r < rows, other=0.0)
            tl.atomic_add(out_ptr + r, v, mask=r < rows)


        class ModelNew(nn.Module):
            def forward(self, x):
                xt = x.t().contiguous()
                out = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
                partial_sums[(x.shape[1], triton.cdiv(x.shape[0], 16))](
                    xt, out, x.shape[0], x.shape[1], BLOCK=16
                )
                return out
        """)
    # every element is a sum of the same terms in another order: the mixed-sign values of a
    # large case exceed fp32's tolerance on sums of 200 terms, so the trials and zeros only
    r = evaluate(SUM_ROWS, source, trials=2, cases=["zero", "odd_shape"])
    assert r.reward == 1, r.reasons
    assert any(line.startswith("launch partial_sums") for line in r.program), r.program


TWO_OUTPUTS = textwrap.dedent('''
    """Scaled input and its ReLU."""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.linspace(0.5, 2.0, 64), persistent=False)

        def forward(self, x):
            y = x * self.scale
            return y, torch.relu(y)


    def get_inputs():
        return [torch.randn(8, 64)]


    def get_init_inputs():
        return []
    ''')


def test_a_constant_buffer_of_the_module_and_two_outputs():
    """A non-persistent buffer is outside the state dict, yet the problem's own: ModelNew's buffer
    of its name holds the reference's values and is replayed as that buffer."""
    source = IMPORTS + textwrap.dedent("""

        @triton.jit
        def scale_relu(x_ptr, s_ptr, y_ptr, r_ptr, n, cols, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            y = tl.load(x_ptr + offs, mask=mask) * tl.load(s_ptr + offs % cols, mask=mask)
            tl.store(y_ptr + offs, y, mask=mask)
            tl.store(r_ptr + offs, tl.maximum(y, 0.0), mask=mask)


        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("scale", torch.linspace(0.5, 2.0, 64), persistent=False)

            def forward(self, x):
                x = x.contiguous()
                y, r = torch.empty_like(x), torch.empty_like(x)
                scale_relu[(triton.cdiv(x.numel(), 128),)](
                    x, self.scale, y, r, x.numel(), x.shape[-1], BLOCK=128
                )
                return y, r
        """)
    r = evaluate(TWO_OUTPUTS, source, trials=2, cases=["mixed_sign", "zero"])
    assert r.reward == 1, r.reasons
