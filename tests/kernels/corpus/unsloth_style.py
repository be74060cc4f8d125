"""Kernels written in the style of unsloth's (github.com/unslothai/unsloth, unsloth/kernels/):
``calculate_settings`` block sizes and warps, one row a program with ``*_row_stride`` arguments,
``tl.math`` functions, fp32 upcasts; each entry names the file it imitates. The unsloth package
itself does not import without a GPU (see the corpus table)."""

from __future__ import annotations

from . import Entry
from .tutorial_style import module

UNSLOTH = "github.com/unslothai/unsloth unsloth/kernels/"

SETTINGS = """
MAX_FUSED_SIZE = 65536


def calculate_settings(n):
    BLOCK_SIZE = triton.next_power_of_2(n)
    if BLOCK_SIZE > MAX_FUSED_SIZE:
        raise RuntimeError(f"Cannot launch Triton kernel since n = {n} exceeds the maximum CUDA blocksize = {MAX_FUSED_SIZE}.")
    num_warps = 4
    if BLOCK_SIZE >= 32768:
        num_warps = 32
    elif BLOCK_SIZE >= 8192:
        num_warps = 16
    elif BLOCK_SIZE >= 2048:
        num_warps = 8
    return BLOCK_SIZE, num_warps
"""

RMS_LAYERNORM = """
@triton.jit
def _rms_layernorm_forward(
    Y, Y_row_stride,
    X, X_row_stride,
    W, W_row_stride,
    r, r_row_stride,
    n_cols, eps,
    BLOCK_SIZE: tl.constexpr,
    {gemma_param}
):
    row_idx = tl.program_id(0)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    Y += row_idx * Y_row_stride
    X += row_idx * X_row_stride
    r += row_idx * r_row_stride

    X_row = tl.load(X + col_offsets, mask=mask, other=0).to(tl.float32)
    W_row = tl.load(W + col_offsets, mask=mask, other=0)  # .to(tl.float32)

    row_var = tl.sum(X_row * X_row, axis=0) / n_cols
    inv_var = tl.math.rsqrt(row_var + eps)
    tl.store(r, inv_var)
    normed = X_row * inv_var
    normed = normed.to(W_row.dtype)  # Exact copy from HF
    {output}
    tl.store(Y + col_offsets, output, mask=mask)
"""

RMS_MODEL = """
class ModelNew(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, X{scale_arg}):
        shape = X.shape
        dim = shape[-1]
        X = X.view(-1, dim)
        n_rows, n_cols = X.shape
        BLOCK_SIZE, num_warps = calculate_settings(n_cols)
        Y = torch.empty((n_rows, n_cols), dtype=X.dtype, device=X.device)
        r = torch.empty(n_rows, dtype=torch.float32, device=X.device)
        _rms_layernorm_forward[(n_rows,)](
            Y, Y.stride(0),
            X, X.stride(0),
            self.weight, self.weight.stride(0),
            r, r.stride(0),
            n_cols, self.eps,
            BLOCK_SIZE=BLOCK_SIZE,
            num_warps=num_warps,{scale_launch}
        )
        return Y.view(*shape)
"""

FG_KERNEL = """
@triton.jit
def _fg_kernel(e, g, h, n_elements, BLOCK_SIZE: tl.constexpr,):
    block_idx = tl.program_id(0)
    offsets = block_idx * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements

    e_row = tl.load(e + offsets, mask=mask, other=0).to(tl.float32)
    g_row = tl.load(g + offsets, mask=mask, other=0)  # .to(tl.float32)

    {f_row}
    f_row = f_row.to(g_row.dtype)  # Exact copy from HF
    # h = f * g
    h_row = f_row * g_row

    # Store h
    tl.store(h + offsets, h_row, mask=mask)
"""

FG_MODEL = """
def swiglu_fg_kernel(e, g):
    batch, seq_len, hd = e.shape
    n_elements = e.numel()
    h = torch.empty((batch, seq_len, hd), dtype=e.dtype, device=e.device)
    grid = lambda meta: (triton.cdiv(n_elements, meta['BLOCK_SIZE']),)
    _fg_kernel[grid](e, g, h, n_elements, BLOCK_SIZE=1024,)
    return h


class ModelNew(nn.Module):
    def forward(self, a, b):
        return swiglu_fg_kernel(a.contiguous().unsqueeze(0), b.contiguous().unsqueeze(0)).squeeze(0)
"""

LAYERNORM = """
@triton.jit
def layernorm_forward(
    Y, Y_row_stride,
    X, X_row_stride,
    W,
    b,
    r,
    mu,
    n_cols, eps,
    BLOCK_SIZE: tl.constexpr
):
    row_idx = tl.program_id(0)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols

    Y += row_idx * Y_row_stride
    X += row_idx * X_row_stride
    r += row_idx
    mu += row_idx

    # According to https://pytorch.org/torchtune/stable/_modules/torchtune/modules/layer_norm.html#Fp32LayerNorm, all modules
    # are in float32!
    X_row = tl.load(X + col_offsets, mask=mask, other=0).to(tl.float32)
    W_row = tl.load(W + col_offsets, mask=mask, other=0).to(tl.float32)
    b_row = tl.load(b + col_offsets, mask=mask, other=0).to(tl.float32)

    mean_X = tl.sum(X_row, axis=0) / n_cols
    # (X[0] - mean) == -mean so we need to mask it out
    XX = tl.where(mask, X_row - mean_X, 0)
    row_var = tl.sum(XX * XX, axis=0) / n_cols
    inv_var = tl.math.rsqrt(row_var + eps)
    tl.store(r, inv_var)
    tl.store(mu, mean_X)
    output = (XX * inv_var) * W_row + b_row
    tl.store(Y + col_offsets, output, mask=mask)
"""

LAYERNORM_MODEL = """
class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape)

    def forward(self, X):
        shape = X.shape
        dim = shape[-1]
        X = X.view(-1, dim)
        n_rows, n_cols = X.shape
        BLOCK_SIZE, num_warps = calculate_settings(n_cols)
        Y = torch.empty((n_rows, n_cols), dtype=X.dtype, device=X.device)
        r = torch.empty(n_rows, dtype=torch.float32, device=X.device)
        mu = torch.empty(n_rows, dtype=torch.float32, device=X.device)
        layernorm_forward[(n_rows,)](
            Y, Y.stride(0), X, X.stride(0), self.norm.weight, self.norm.bias, r, mu, n_cols, self.norm.eps,
            BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps,
        )
        return Y.view(*shape)
"""

CROSS_ENTROPY = """
@triton.jit
def _cross_entropy_forward(
    logits_ptr, logits_row_stride,
    loss_ptr,
    logsumexp_ptr,
    labels_ptr,
    VOCAB_SIZE,
    BLOCK_SIZE: tl.constexpr,
):
    row_idx = tl.program_id(0)
    logits_ptr += row_idx * logits_row_stride
    loss_ptr += row_idx
    logsumexp_ptr += row_idx
    labels_ptr += row_idx

    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < VOCAB_SIZE

    label_idx = tl.load(labels_ptr).to(tl.int32)
    logits = tl.load(logits_ptr + col_offsets, mask=mask, other=-float("inf")).to(tl.float32)

    c = tl.max(logits, 0)
    logsumexp = c + tl.log(tl.sum(tl.exp(logits - c), 0))

    if label_idx != -100:
        x = tl.load(logits_ptr + label_idx).to(tl.float32)
        loss = logsumexp - x
    else:
        loss = 0.0
    tl.store(logsumexp_ptr, logsumexp)
    tl.store(loss_ptr, loss)


# the mean of the row losses on the device too, a single program over the rows
@triton.jit
def _mean_kernel(loss_ptr, out_ptr, n_rows, BLOCK_SIZE: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)
    total = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, n_rows, BLOCK_SIZE):
        total += tl.load(loss_ptr + start + offsets, mask=start + offsets < n_rows, other=0.0)
    tl.store(out_ptr, tl.sum(total, 0) / n_rows)
"""

CROSS_ENTROPY_MODEL = """
class ModelNew(nn.Module):
    def forward(self, logits, labels):
        logits = logits.contiguous()
        n_rows, vocab_size = logits.shape
        BLOCK_SIZE, num_warps = calculate_settings(vocab_size)
        losses = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        logsumexp = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        _cross_entropy_forward[(n_rows,)](
            logits, logits.stride(0), losses, logsumexp, labels.contiguous(), VOCAB_SIZE=vocab_size,
            BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps,
        )
        out = torch.empty((), dtype=torch.float32, device=logits.device)
        _mean_kernel[(1,)](losses, out, n_rows, BLOCK_SIZE=128)
        return out
"""


def _entry(name, file, problem, candidate, refusal=None) -> Entry:
    return Entry(
        name=f"unsloth_{name}",
        origin=UNSLOTH + file,
        kind="unsloth-style",
        problem=problem,
        candidate=candidate,
        refusal=refusal,
    )


ENTRIES = [
    _entry(
        "rms_layernorm",
        "rms_layernorm.py (_rms_layernorm_forward)",
        "rms_norm",
        module(
            SETTINGS
            + "\n\n"
            + RMS_LAYERNORM.replace("    {gemma_param}\n", "").replace(
                "{output}", "output = normed * W_row"
            ),
            RMS_MODEL.replace("{scale_arg}", "").replace("{scale_launch}", ""),
        ),
    ),
    _entry(
        "rms_layernorm_scaled",
        "rms_layernorm.py (_gemma_rms_layernorm_forward's (1 + w) form, on a scale input)",
        "rmsnorm_scale",
        module(
            SETTINGS
            + "\n\n"
            + RMS_LAYERNORM.replace("    {gemma_param}\n", "    S,\n").replace(
                "{output}",
                "S_row = tl.load(S + col_offsets, mask=mask, other=0).to(tl.float32)\n"
                "    output = normed * W_row * (S_row + 1.0)",
            ),
            RMS_MODEL.replace("{scale_arg}", ", scale").replace(
                "{scale_launch}", "\n            S=scale,"
            ),
        ),
    ),
    _entry(
        "swiglu_fg",
        "swiglu.py (_fg_kernel)",
        "swiglu",
        module(
            FG_KERNEL.replace(
                "{f_row}",
                "# f = e * sigmoid(e)\n    f_row = e_row * tl.sigmoid(e_row) # e_row / (1 + tl.exp(-e_row))",
            ),
            FG_MODEL,
        ),
    ),
    _entry(
        "geglu_exact",
        "geglu.py (_exact_forward_kernel)",
        "geglu",
        module(
            FG_KERNEL.replace(
                "{f_row}",
                "# f = 1/2 * e * (1 + erf(1/sqrt(2) * e))\n"
                "    f_row = 0.5 * e_row * (tl.math.erf(tl.math.rsqrt(2.0) * e_row) + 1.0)",
            ),
            FG_MODEL,
        ),
    ),
    _entry(
        "geglu_approx",
        "geglu.py (_approx_forward_kernel, tanh through exp)",
        "geglu_tanh",
        module(
            FG_KERNEL.replace(
                "{f_row}",
                "s = 0.7978845608028654 # math.sqrt(2 / math.pi)\n"
                "    # f = 1/2 * e * (1 + tanh( sqrt(2/pi) * (x + 0.044715 * x^3 ) ))\n"
                "    inner = s * e_row * (1.0 + 0.044715 * e_row * e_row)\n"
                "    f_row = 0.5 * e_row * (2.0 * tl.sigmoid(2.0 * inner))",
            ),
            FG_MODEL,
        ),
    ),
    _entry(
        "layernorm",
        "layernorm.py (layernorm_forward)",
        "layer_norm",
        module(SETTINGS + "\n\n" + LAYERNORM, LAYERNORM_MODEL),
    ),
    _entry(
        "cross_entropy",
        "cross_entropy_loss.py (_cross_entropy_forward), then a mean kernel",
        "cross_entropy",
        module(SETTINGS + "\n\n" + CROSS_ENTROPY, CROSS_ENTROPY_MODEL),
    ),
]
