"""Liger-Kernel (PyPI liger-kernel, linkedin/Liger-Kernel): its launchers and @triton.jit kernels,
imported from the installed package by the candidate, which only shapes the tensors around them."""

from __future__ import annotations

from . import Entry

PACKAGE = "liger_kernel"


def _candidate(imports: str, forward: str, init: str = "") -> str:
    return (
        "import torch\nimport torch.nn as nn\nimport triton\n"
        + imports.strip()
        + "\n\n\nclass ModelNew(nn.Module):\n"
        + (init or "    pass\n")
        + "\n    def forward(self, "
        + forward.strip()
        + "\n"
    )


RMS_INIT = """
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
"""


def _entry(name, module, problem, imports, forward, init="", launches="", refusal=None) -> Entry:
    return Entry(
        name=f"liger_{name}",
        origin=f"liger-kernel {module}" + (f" ({launches})" if launches else ""),
        kind="library",
        problem=problem,
        candidate=_candidate(imports, forward, init),
        requires=module,
        refusal=refusal,
    )


ENTRIES = [
    _entry(
        "rms_norm_llama",
        "liger_kernel.ops.rms_norm",
        "rms_norm",
        "from liger_kernel.ops.rms_norm import rms_norm_forward",
        """x):
        y, *_ = rms_norm_forward(x, self.weight, self.eps, 0.0, "llama", None)
        return y""",
        RMS_INIT,
        "rms_norm_forward -> _rms_norm_forward_kernel",
    ),
    _entry(
        "rms_norm_gemma_casting",
        "liger_kernel.ops.rms_norm",
        "rms_norm",
        "from liger_kernel.ops.rms_norm import rms_norm_forward",
        """x):
        y, *_ = rms_norm_forward(x, self.weight, self.eps, 0.0, "gemma", True)
        return y""",
        RMS_INIT,
        "rms_norm_forward, gemma casting, row mode",
    ),
    _entry(
        "block_rms_norm_kernel",
        "liger_kernel.ops.rms_norm",
        "rms_norm",
        "import liger_kernel.ops.rms_norm as liger",
        """x):
        x = x.contiguous()
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        liger._block_rms_norm_forward_kernel[(triton.cdiv(n_rows, 16),)](
            y, y.stride(0), x, x.stride(0), self.weight, self.weight.stride(0), rstd,
            rstd.stride(0), n_rows, n_cols, self.eps, 0.0, 1, elementwise_affine=True,
            BLOCK_SIZE=triton.next_power_of_2(n_cols), BLOCK_ROW=16,
        )
        return y""",
        RMS_INIT,
        "_block_rms_norm_forward_kernel launched directly, 16 rows a program",
    ),
    _entry(
        "layer_norm",
        "liger_kernel.ops.layer_norm",
        "layer_norm",
        "from liger_kernel.ops.layer_norm import layer_norm_forward",
        """x):
        y, *_ = layer_norm_forward(x, self.norm.weight, self.norm.bias, self.norm.eps)
        return y""",
        """
    def __init__(self, normalized_shape):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape)
""",
        "layer_norm_forward -> _layer_norm_forward_kernel",
    ),
    _entry(
        "group_norm",
        "liger_kernel.ops.group_norm",
        "group_norm",
        "from liger_kernel.ops.group_norm import group_norm_forward",
        """x):
        gn = self.gn
        y, *_ = group_norm_forward(
            x.contiguous(), gn.num_channels, gn.num_groups, gn.weight, gn.bias, gn.eps
        )
        return y""",
        """
    def __init__(self, num_groups, num_channels):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels)
""",
        "group_norm_forward -> _group_norm_forward_kernel",
    ),
    _entry(
        "fused_add_rms_norm",
        "liger_kernel.ops.fused_add_rms_norm",
        "add_rms_norm",
        "from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward",
        """x, residual):
        y, s, *_ = fused_add_rms_norm_forward(x, residual, self.weight, self.eps, 0.0, "llama")
        return y, s""",
        RMS_INIT,
        "fused_add_rms_norm_forward -> _fused_add_rms_norm_forward_kernel",
    ),
    _entry(
        "poly_norm",
        "liger_kernel.ops.poly_norm",
        "poly_norm",
        "from liger_kernel.ops.poly_norm import poly_norm_forward",
        """x):
        y, *_ = poly_norm_forward(x, self.weight, self.bias, self.eps)
        return y""",
        """
    def __init__(self, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.full((3,), 1.0 / 3))
        self.bias = nn.Parameter(torch.zeros(1))
""",
        "poly_norm_forward -> _poly_norm_forward_kernel",
    ),
    _entry(
        "dyt",
        "liger_kernel.ops.dyt",
        "dyt",
        "from liger_kernel.ops.dyt import liger_dyt_fwd",
        """x):
        return liger_dyt_fwd(x.contiguous(), self.alpha, self.gamma, self.beta)""",
        """
    def __init__(self, hidden_size, init_alpha):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), init_alpha))
        self.gamma = nn.Parameter(torch.ones(hidden_size))
        self.beta = nn.Parameter(torch.zeros(hidden_size))
""",
        "liger_dyt_fwd -> autotuned _dyt_fwd_kernel",
    ),
    _entry(
        "swiglu",
        "liger_kernel.ops.swiglu",
        "swiglu",
        "from liger_kernel.ops.swiglu import swiglu_forward",
        """a, b):
        return swiglu_forward(a.contiguous(), b.contiguous())[2]""",
        launches="swiglu_forward -> _swiglu_forward_kernel",
    ),
    _entry(
        "swiglu_tiled_kernel",
        "liger_kernel.ops.swiglu",
        "swiglu",
        "from liger_kernel.ops.swiglu import _swiglu_forward_kernel_tiled",
        """a, b):
        a, b = a.contiguous(), b.contiguous()
        c = torch.empty_like(a)
        n_rows, n_cols = a.shape
        _swiglu_forward_kernel_tiled[(n_rows, triton.cdiv(n_cols, 64))](
            a, b, c, c.stride(0), 1.0, n_cols, BLOCK_SIZE=64
        )
        return c""",
        launches="_swiglu_forward_kernel_tiled launched directly on 64-column tiles",
    ),
    _entry(
        "geglu_tanh",
        "liger_kernel.ops.geglu",
        "geglu_tanh",
        "from liger_kernel.ops.geglu import geglu_forward",
        """a, b):
        return geglu_forward(a.contiguous(), b.contiguous())[2]""",
        launches="geglu_forward -> _geglu_tanh_forward_kernel",
    ),
    _entry(
        "relu_squared",
        "liger_kernel.ops.relu_squared",
        "relu_squared",
        "from liger_kernel.ops.relu_squared import relu_squared_forward",
        """x):
        return relu_squared_forward(x.contiguous())""",
        launches="relu_squared_forward -> _relu_squared_forward_kernel",
    ),
    _entry(
        "softmax",
        "liger_kernel.ops.softmax",
        "softmax_rows",
        "from liger_kernel.ops.softmax import _softmax_forward",
        """x):
        return _softmax_forward(x)[0]""",
        launches="_softmax_forward -> _softmax_single_block_forward_kernel",
    ),
    _entry(
        "softmax_multi_block_kernel",
        "liger_kernel.ops.softmax",
        "softmax_rows",
        "from liger_kernel.ops.softmax import _softmax_multi_block_forward_kernel",
        """x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _softmax_multi_block_forward_kernel[(x.shape[0],)](
            y, y.stride(0), x, x.stride(0), x.shape[1], BLOCK_SIZE=32
        )
        return y""",
        launches="_softmax_multi_block_forward_kernel launched directly, 32-column blocks; "
        "Liger never reaches it (its block is the row's next power of 2) and it calls "
        "tl.float32(...), which no Triton compiles",
        refusal="'dtype' object is not callable",
    ),
    _entry(
        "kl_div",
        "liger_kernel.ops.kl_div",
        "kl_div_rows",
        "from liger_kernel.ops.kl_div import kldiv_forward_triton",
        """log_q, p):
        return kldiv_forward_triton(log_q.contiguous(), p.contiguous(), False, "none", 1e-10)""",
        launches="kldiv_forward_triton -> _kldiv_kernel_forward, unreduced",
    ),
    _entry(
        "cross_entropy",
        "liger_kernel.ops.cross_entropy",
        "cross_entropy",
        "from liger_kernel.ops.cross_entropy import cross_entropy_forward",
        """logits, targets):
        loss, *_ = cross_entropy_forward(
            logits.contiguous(), targets.contiguous(), None, -100, 0.0, 0.0, "mean", None, False
        )
        return loss""",
        launches="cross_entropy_forward -> liger_cross_entropy_kernel, then its reduction",
    ),
]
