"""flash-linear-attention's core (PyPI fla-core, fla-org/flash-linear-attention): its launchers and
autotuned @triton.jit kernels, imported from the installed package by the candidate. On a machine
without a GPU the package warns "Triton is not supported on current platform, roll back to CPU"
and imports."""

from __future__ import annotations

from . import Entry
from .liger import _candidate


def _entry(name, module, problem, imports, forward, init="", launches="", refusal=None) -> Entry:
    return Entry(
        name=f"fla_{name}",
        origin=f"fla-core {module}" + (f" ({launches})" if launches else ""),
        kind="library",
        problem=problem,
        candidate=_candidate(imports, forward, init),
        requires=module,
        refusal=refusal,
    )


RMS_INIT = """
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
"""

ENTRIES = [
    _entry(
        "softmax",
        "fla.ops.utils.softmax",
        "softmax_rows",
        "from fla.ops.utils.softmax import softmax_fwd",
        """x):
        return softmax_fwd(x.contiguous(), dtype=x.dtype)""",
        launches="softmax_fwd -> autotuned softmax_fwd_kernel",
    ),
    _entry(
        "logsumexp_kernel",
        "fla.ops.utils.logsumexp",
        "logsumexp_rows",
        "from fla.ops.utils.logsumexp import logsumexp_fwd_kernel",
        """x):
        x = x.contiguous()
        n, d = x.shape
        z = torch.empty(n, dtype=torch.float32, device=x.device)
        # one block a row (the launcher's ND == 1 case), so no host logsumexp of the partials
        logsumexp_fwd_kernel[(n, 1)](x=x, z=z, scale=None, D=d, B=triton.next_power_of_2(d))
        return z""",
        launches="heuristics + autotuned logsumexp_fwd_kernel launched directly",
    ),
    _entry(
        "l2norm",
        "fla.modules.norm.l2norm",
        "l2_normalize_rows",
        "from fla.modules.norm.l2norm import l2norm_fwd",
        """x):
        # eps inside the square root: 1e-24 matches F.normalize's norm clamp of 1e-12
        return l2norm_fwd(x.contiguous(), eps=1e-24)[0]""",
        launches="l2norm_fwd -> autotuned l2norm_fwd_kernel",
    ),
    _entry(
        "layer_norm",
        "fla.modules.norm.layernorm",
        "layer_norm",
        "from fla.modules.norm.layernorm import layer_norm_fwd",
        """x):
        y, *_ = layer_norm_fwd(x.contiguous(), self.norm.weight, self.norm.bias, self.norm.eps)
        return y""",
        """
    def __init__(self, normalized_shape):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape)
""",
        launches="layer_norm_fwd -> autotuned layer_norm_fwd_kernel",
    ),
    _entry(
        "rms_norm",
        "fla.modules.norm.layernorm",
        "rms_norm",
        "from fla.modules.norm.layernorm import layer_norm_fwd",
        """x):
        y, *_ = layer_norm_fwd(x.contiguous(), self.weight, None, self.eps, is_rms_norm=True)
        return y""",
        RMS_INIT,
        launches="layer_norm_fwd(is_rms_norm=True)",
    ),
    _entry(
        "add_rms_norm",
        "fla.modules.norm.layernorm",
        "add_rms_norm",
        "from fla.modules.norm.layernorm import layer_norm_fwd",
        """x, residual):
        y, _, _, s = layer_norm_fwd(
            x.contiguous(), self.weight, None, self.eps, residual=residual.contiguous(),
            is_rms_norm=True,
        )
        return y, s""",
        RMS_INIT,
        launches="layer_norm_fwd with a residual, its sum stored",
    ),
    _entry(
        "matmul",
        "fla.ops.utils.matmul",
        "matmul",
        "from fla.ops.utils.matmul import matmul",
        """a, b):
        return matmul(a.contiguous(), b.contiguous())""",
        launches="matmul -> autotuned matmul_kernel (tl.dot, grouped ordering)",
    ),
    _entry(
        "addmm",
        "fla.ops.utils.matmul",
        "matmul_residual",
        "from fla.ops.utils.matmul import addmm",
        """a, b, c):
        return addmm(c.contiguous(), a.contiguous(), b.contiguous())""",
        launches="addmm -> matmul_kernel with HAS_INPUT",
    ),
    _entry(
        "sigmoid",
        "fla.modules.activations.ops",
        "sigmoid",
        "from fla.modules.activations.ops import sigmoid_fwd",
        """x):
        return sigmoid_fwd(x.contiguous())""",
        launches="sigmoid_fwd -> autotuned sigmoid_fwd_kernel",
    ),
    _entry(
        "swish",
        "fla.modules.activations.ops",
        "silu",
        "from fla.modules.activations.ops import swish_fwd",
        """x):
        return swish_fwd(x.contiguous())""",
        launches="swish_fwd -> autotuned swish_fwd_kernel",
    ),
    _entry(
        "global_cumsum",
        "fla.ops.utils.cumsum",
        "cumsum_dim",
        "from fla.ops.utils.cumsum import chunk_global_cumsum",
        """x):
        # fla's [B, T, H] layout: the rows are batches, the summed dimension its time
        return chunk_global_cumsum(x.contiguous().unsqueeze(-1), output_dtype=x.dtype).squeeze(-1)""",
        """
    def __init__(self, dim):
        super().__init__()
""",
        launches="chunk_global_cumsum -> chunk_global_cumsum_scalar_kernel (tl.cumsum in chunks)",
    ),
    _entry(
        "logsigmoid",
        "fla.modules.activations.ops",
        "logsigmoid",
        "from fla.modules.activations.ops import logsigmoid_fwd",
        """x):
        return logsigmoid_fwd(x.contiguous())""",
        launches="logsigmoid_fwd -> autotuned logsigmoid_fwd_kernel",
    ),
    _entry(
        "l2norm_row_kernel",
        "fla.modules.norm.l2norm",
        "l2_normalize_rows",
        "from fla.modules.norm.l2norm import l2norm_fwd_kernel_row",
        """x):
        x = x.contiguous()
        y = torch.empty_like(x)
        rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        # the launcher's path for rows over 512 features, launched directly
        l2norm_fwd_kernel_row[(x.shape[0],)](
            x=x, y=y, rstd=rstd, eps=1e-24, D=x.shape[1], BD=triton.next_power_of_2(x.shape[1])
        )
        return y""",
        launches="autotuned l2norm_fwd_kernel_row launched directly",
    ),
]
