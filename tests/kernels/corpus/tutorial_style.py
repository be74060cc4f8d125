"""Kernels written in the style of the Triton tutorials (github.com/triton-lang/triton,
python/tutorials/): 01 vector add, 02 fused softmax, 03 matrix multiplication, 05 layer norm,
06 fused attention; and split-K matmul as the old triton/ops/matmul.py wrote it (autotune configs
with SPLIT_K and ``pre_hook=init_to_zero``). Each entry names the tutorial it imitates."""

from __future__ import annotations

import textwrap

from . import Entry

TUTORIALS = "github.com/triton-lang/triton python/tutorials/"
OPS = "github.com/triton-lang/triton (release/2.x) python/"
IMPORTS = "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n"


def module(kernels: str, model: str) -> str:
    return (
        IMPORTS
        + "\n\n"
        + textwrap.dedent(kernels).strip()
        + "\n\n\n"
        + textwrap.dedent(model).strip()
        + "\n"
    )


VECTOR_ADD = """
@triton.jit
def add_kernel(x_ptr,  # *Pointer* to first input vector.
               y_ptr,  # *Pointer* to second input vector.
               output_ptr,  # *Pointer* to output vector.
               n_elements,  # Size of the vector.
               BLOCK_SIZE: tl.constexpr,  # Number of elements each program should process.
               ):
    pid = tl.program_id(axis=0)  # We use a 1D launch grid so axis is 0.
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    output = x {op} y
    tl.store(output_ptr + offsets, output, mask=mask)
"""

VECTOR_ADD_MODEL = """
def add(x: torch.Tensor, y: torch.Tensor):
    output = torch.empty_like(x)
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta['BLOCK_SIZE']), )
    add_kernel[grid](x, y, output, n_elements, BLOCK_SIZE=1024)
    return output


class ModelNew(nn.Module):
    def forward(self, a, b):
        return add(a.contiguous(), b.contiguous())
"""

FUSED_SOFTMAX = """
@triton.jit
def softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols, BLOCK_SIZE: tl.constexpr,
                   num_stages: tl.constexpr):
    # starting row of the program
    row_start = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
        # The stride represents how much we need to increase the pointer to advance 1 row
        row_start_ptr = input_ptr + row_idx * input_row_stride
        col_offsets = tl.arange(0, BLOCK_SIZE)
        input_ptrs = row_start_ptr + col_offsets
        mask = col_offsets < n_cols
        row = tl.load(input_ptrs, mask=mask, other=-float('inf'))
        row_minus_max = row - tl.max(row, axis=0)
        numerator = tl.exp(row_minus_max)
        denominator = tl.sum(numerator, axis=0)
        softmax_output = numerator / denominator
        output_row_start_ptr = output_ptr + row_idx * output_row_stride
        output_ptrs = output_row_start_ptr + col_offsets
        tl.store(output_ptrs, softmax_output, mask=mask)
"""

FUSED_SOFTMAX_MODEL = """
def softmax(x):
    n_rows, n_cols = x.shape
    BLOCK_SIZE = triton.next_power_of_2(n_cols)
    num_warps = 8
    num_stages = 2
    y = torch.empty_like(x)
    num_programs = min(8, n_rows)
    softmax_kernel[(num_programs, 1, 1)](y, x, x.stride(0), y.stride(0), n_rows, n_cols, BLOCK_SIZE, num_stages,
                                         num_warps=num_warps)
    return y


class ModelNew(nn.Module):
    def forward(self, x):
        return softmax(x.contiguous())
"""

# 02 without the num_stages parameter, one row a program, the log form
LOG_SOFTMAX = """
@triton.jit
def log_softmax_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    row_start_ptr = input_ptr + row_idx * input_row_stride
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    row = tl.load(row_start_ptr + col_offsets, mask=mask, other=-float('inf'))
    row_minus_max = row - tl.max(row, axis=0)
    denominator = tl.sum(tl.exp(row_minus_max), axis=0)
    output = row_minus_max - tl.log(denominator)
    tl.store(output_ptr + row_idx * output_row_stride + col_offsets, output, mask=mask)
"""

LOG_SOFTMAX_MODEL = """
class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        log_softmax_kernel[(n_rows, )](y, x, x.stride(0), y.stride(0), n_cols,
                                       BLOCK_SIZE=triton.next_power_of_2(n_cols), num_warps=4)
        return y
"""

MATMUL = """
@triton.jit
def matmul_kernel(
        # Pointers to matrices
        a_ptr, b_ptr, c_ptr,
        # Matrix dimensions
        M, N, K,
        stride_am, stride_ak,  #
        stride_bk, stride_bn,  #
        stride_cm, stride_cn,
        # Meta-parameters
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,  #
        GROUP_SIZE_M: tl.constexpr,  #
        ACTIVATION: tl.constexpr  #
):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = {group_min}
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator, input_precision="ieee")
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    # You can fuse arbitrary activation functions here
    # while the accumulator is still in FP32!
    if ACTIVATION == "leaky_relu":
        accumulator = leaky_relu(accumulator)
    c = accumulator

    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


# We can fuse `leaky_relu` by providing it as an `ACTIVATION` meta-parameter in `matmul_kernel`.
@triton.jit
def leaky_relu(x):
    return tl.where(x >= 0, x, 0.01 * x)
"""

MATMUL_MODEL = """
def matmul(a, b, activation=""):
    # Check constraints.
    assert a.shape[1] == b.shape[0], "Incompatible dimensions"
    M, K = a.shape
    K, N = b.shape
    # Allocates output.
    c = torch.empty((M, N), device=a.device, dtype=torch.float32)
    # 1D launch kernel where each block gets its own program.
    grid = lambda META: (triton.cdiv(M, META['BLOCK_SIZE_M']) * triton.cdiv(N, META['BLOCK_SIZE_N']), )
    matmul_kernel[grid](
        a, b, c,  #
        M, N, K,  #
        a.stride(0), a.stride(1),  #
        b.stride(0), b.stride(1),  #
        c.stride(0), c.stride(1),  #
        BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=2,  #
        ACTIVATION=activation  #
    )
    return c


class ModelNew(nn.Module):
    def forward(self, a, b):
        return {call}
"""

# 03 with bias and ReLU in the epilogue, the weight read transposed through its strides
LINEAR_RELU_MODEL = """
class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = x.contiguous()
        M, K = x.shape
        N = self.fc.weight.shape[0]
        w = self.fc.weight
        c = torch.empty((M, N), device=x.device, dtype=torch.float32)
        grid = lambda META: (triton.cdiv(M, META['BLOCK_SIZE_M']) * triton.cdiv(N, META['BLOCK_SIZE_N']), )
        linear_relu_kernel[grid](x, w, self.fc.bias, c, M, N, K, x.stride(0), x.stride(1), w.stride(1), w.stride(0),
                                 c.stride(0), c.stride(1), BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16,
                                 GROUP_SIZE_M=4)
        return c
"""

LINEAR_RELU = (
    MATMUL.split("# We can fuse")[0]
    .replace("{group_min}", "tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)")
    .replace("def matmul_kernel(", "def linear_relu_kernel(")
    .replace("a_ptr, b_ptr, c_ptr,", "a_ptr, b_ptr, bias_ptr, c_ptr,")
    .replace(
        "        GROUP_SIZE_M: tl.constexpr,  #\n        ACTIVATION: tl.constexpr  #\n",
        "        GROUP_SIZE_M: tl.constexpr,\n",
    )
    .replace(
        """    if ACTIVATION == "leaky_relu":
        accumulator = leaky_relu(accumulator)
    c = accumulator
""",
        """    bias = tl.load(bias_ptr + offs_bn)
    c = tl.maximum(accumulator + bias[None, :], 0.0)
""",
    )
)

BATCHED = (
    MATMUL.replace("{group_min}", "tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)")
    .replace("stride_am, stride_ak,  #", "stride_ab, stride_am, stride_ak,  #")
    .replace("stride_bk, stride_bn,  #", "stride_bb, stride_bk, stride_bn,  #")
    .replace("stride_cm, stride_cn,", "stride_cb, stride_cm, stride_cn,")
    .replace(
        "    pid = tl.program_id(axis=0)\n",
        "    pid = tl.program_id(axis=0)\n    batch = tl.program_id(axis=1)\n"
        "    a_ptr += batch * stride_ab\n    b_ptr += batch * stride_bb\n    c_ptr += batch * stride_cb\n",
    )
)

BATCHED_MODEL = """
class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        batch, M, K = a.shape
        N = b.shape[2]
        c = torch.empty((batch, M, N), device=a.device, dtype=torch.float32)
        grid = lambda META: (triton.cdiv(M, META['BLOCK_SIZE_M']) * triton.cdiv(N, META['BLOCK_SIZE_N']), batch)
        matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), a.stride(2), b.stride(0), b.stride(1),
                            b.stride(2), c.stride(0), c.stride(1), c.stride(2), BLOCK_SIZE_M=16, BLOCK_SIZE_N=16,
                            BLOCK_SIZE_K=16, GROUP_SIZE_M=2, ACTIVATION="")
        return c
"""

LAYER_NORM = """
@triton.jit
def _layer_norm_fwd_fused(
    X,  # pointer to the input
    Y,  # pointer to the output
    W,  # pointer to the weights
    B,  # pointer to the biases
    Mean,  # pointer to the mean
    Rstd,  # pointer to the 1/std
    stride,  # how much to increase the pointer when moving by 1 row
    N,  # number of columns in X
    eps,  # epsilon to avoid division by zero
    BLOCK_SIZE: tl.constexpr,
):
    # Map the program id to the row of X and Y it should compute.
    row = tl.program_id(0)
    Y += row * stride
    X += row * stride
    # Compute mean
    mean = 0
    _mean = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        a = tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
        _mean += a
    mean = tl.sum(_mean, axis=0) / N
    # Compute variance
    _var = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.).to(tl.float32)
        x = tl.where(cols < N, x - mean, 0.)
        _var += x * x
    var = tl.sum(_var, axis=0) / N
    rstd = 1 / tl.sqrt(var + eps)
    # Write mean / rstd
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    # Normalize and apply linear transformation
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.).to(tl.float32)
        x_hat = (x - mean) * rstd
        y = x_hat * w + b
        # Write output
        tl.store(Y + cols, y, mask=mask)
"""

LAYER_NORM_MODEL = """
class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape)

    def forward(self, x{residual_arg}):
        x = {x}
        y = torch.empty_like(x)
        x_arg = x.reshape(-1, x.shape[-1])
        M, N = x_arg.shape
        mean = torch.empty((M, ), dtype=torch.float32, device=x.device)
        rstd = torch.empty((M, ), dtype=torch.float32, device=x.device)
        # Less than 64KB per feature: enqueue fused kernel
        MAX_FUSED_SIZE = 65536 // x.element_size()
        BLOCK_SIZE = min(MAX_FUSED_SIZE, 32)
        num_warps = min(max(BLOCK_SIZE // 256, 1), 8)
        _layer_norm_fwd_fused[(M, )](  #
            x_arg, y, self.norm.weight, self.norm.bias, mean, rstd,  #
            x_arg.stride(0), N, self.norm.eps,  #
            BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps, num_ctas=1)
        return y
"""

# the residual add as its own tutorial-01 style kernel before the layer norm
RESIDUAL_ADD = VECTOR_ADD.replace("{op}", "+")

ATTENTION = """
@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q,  #
                    K_block_ptr, V_block_ptr,  #
                    start_m, qk_scale, N_CTX,  #
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,  #
                    STAGE: tl.constexpr, offs_m, offs_n):
    # range of values handled by this stage
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
    # causal = False
    else:
        lo, hi = 0, N_CTX
    K_block_ptr = tl.advance(K_block_ptr, (0, lo))
    V_block_ptr = tl.advance(V_block_ptr, (lo, 0))
    # loop over k, v and update accumulator
    for start_n in range(lo, hi, BLOCK_N):
        # -- compute qk ----
        k = tl.load(K_block_ptr, boundary_check=(0, 1), padding_option="zero")
        qk = tl.dot(q, k, input_precision="ieee")
        valid = (start_n + offs_n[None, :]) < N_CTX
        if STAGE == 2:
            valid = valid & (offs_m[:, None] >= (start_n + offs_n[None, :]))
        qk = tl.where(valid, qk * qk_scale, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        # -- update m_i and l_i
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        # -- update output accumulator --
        acc = acc * alpha[:, None]
        # update acc
        v = tl.load(V_block_ptr, boundary_check=(0, 1), padding_option="zero")
        acc = tl.dot(p, v, acc, input_precision="ieee")
        # update m_i and l_i
        m_i = m_ij
        V_block_ptr = tl.advance(V_block_ptr, (BLOCK_N, 0))
        K_block_ptr = tl.advance(K_block_ptr, (0, BLOCK_N))
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, sm_scale, Out,  #
              stride_qz, stride_qm, stride_qk,  #
              stride_kz, stride_kn, stride_kk,  #
              stride_vz, stride_vk, stride_vn,  #
              stride_oz, stride_om, stride_on,  #
              N_CTX,  #
              HEAD_DIM: tl.constexpr,  #
              BLOCK_M: tl.constexpr,  #
              BLOCK_N: tl.constexpr,  #
              STAGE: tl.constexpr  #
              ):
    start_m = tl.program_id(0)
    off_z = tl.program_id(1).to(tl.int64)
    # block pointers
    Q_block_ptr = tl.make_block_ptr(base=Q + off_z * stride_qz, shape=(N_CTX, HEAD_DIM), strides=(stride_qm, stride_qk),
                                    offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    V_block_ptr = tl.make_block_ptr(base=V + off_z * stride_vz, shape=(N_CTX, HEAD_DIM), strides=(stride_vk, stride_vn),
                                    offsets=(0, 0), block_shape=(BLOCK_N, HEAD_DIM), order=(1, 0))
    K_block_ptr = tl.make_block_ptr(base=K + off_z * stride_kz, shape=(HEAD_DIM, N_CTX), strides=(stride_kk, stride_kn),
                                    offsets=(0, 0), block_shape=(HEAD_DIM, BLOCK_N), order=(0, 1))
    O_block_ptr = tl.make_block_ptr(base=Out + off_z * stride_oz, shape=(N_CTX, HEAD_DIM), strides=(stride_om, stride_on),
                                    offsets=(start_m * BLOCK_M, 0), block_shape=(BLOCK_M, HEAD_DIM), order=(1, 0))
    # initialize offsets
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    # initialize pointer to m and l
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # load scales
    qk_scale = sm_scale
    qk_scale *= 1.44269504  # 1/log(2)
    # load q: it will stay in SRAM throughout
    q = tl.load(Q_block_ptr, boundary_check=(0, 1), padding_option="zero")
    # stage 1: off-band
    # For causal = True, STAGE = 3 and _attn_fwd_inner gets 1 as its STAGE
    # For causal = False, STAGE = 1, and _attn_fwd_inner gets 3 as its STAGE
    if STAGE & 1:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_block_ptr, V_block_ptr,  #
                                        start_m, qk_scale, N_CTX,  #
                                        BLOCK_M, HEAD_DIM, BLOCK_N,  #
                                        4 - STAGE, offs_m, offs_n)
    # stage 2: on-band
    if STAGE & 2:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K_block_ptr, V_block_ptr,  #
                                        start_m, qk_scale, N_CTX,  #
                                        BLOCK_M, HEAD_DIM, BLOCK_N,  #
                                        2, offs_m, offs_n)
    # epilogue
    acc = acc / l_i[:, None]
    tl.store(O_block_ptr, acc.to(Out.type.element_ty), boundary_check=(0, 1))
"""

# Triton 3.9 removed block pointers (make_block_ptr, tl.advance): the same kernel over plain
# pointers, as tutorial 06 of Triton 2.0 addressed q, k and v
ATTENTION_POINTERS = """
@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q,  #
                    K, V, stride_kn, stride_kk, stride_vk, stride_vn, D,  #
                    start_m, qk_scale, N_CTX,  #
                    BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,  #
                    STAGE: tl.constexpr, offs_m, offs_n):
    offs_d = tl.arange(0, HEAD_DIM)
    # range of values handled by this stage
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
    # causal = False
    else:
        lo, hi = 0, N_CTX
    # loop over k, v and update accumulator
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        # -- compute qk ----
        k = tl.load(K + offs_d[:, None] * stride_kk + cols[None, :] * stride_kn,
                    mask=(offs_d[:, None] < D) & (cols[None, :] < N_CTX), other=0.0)
        qk = tl.dot(q, k, input_precision="ieee")
        valid = cols[None, :] < N_CTX
        if STAGE == 2:
            valid = valid & (offs_m[:, None] >= cols[None, :])
        qk = tl.where(valid, qk * qk_scale, -1.0e6)
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        # -- update m_i and l_i
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        # -- update output accumulator --
        acc = acc * alpha[:, None]
        v = tl.load(V + cols[:, None] * stride_vk + offs_d[None, :] * stride_vn,
                    mask=(cols[:, None] < N_CTX) & (offs_d[None, :] < D), other=0.0)
        acc = tl.dot(p, v, acc, input_precision="ieee")
        # update m_i and l_i
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, sm_scale, Out,  #
              stride_qz, stride_qm, stride_qk,  #
              stride_kz, stride_kn, stride_kk,  #
              stride_vz, stride_vk, stride_vn,  #
              stride_oz, stride_om, stride_on,  #
              N_CTX, D,  # D: the head dimension; HEAD_DIM: its power-of-2 block
              HEAD_DIM: tl.constexpr,  #
              BLOCK_M: tl.constexpr,  #
              BLOCK_N: tl.constexpr,  #
              STAGE: tl.constexpr  #
              ):
    start_m = tl.program_id(0)
    off_z = tl.program_id(1).to(tl.int64)
    Q += off_z * stride_qz
    K += off_z * stride_kz
    V += off_z * stride_vz
    Out += off_z * stride_oz
    # initialize offsets
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    # initialize pointer to m and l
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # load scales
    qk_scale = sm_scale
    qk_scale *= 1.44269504  # 1/log(2)
    # load q: it will stay in SRAM throughout
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk,
                mask=(offs_m[:, None] < N_CTX) & (offs_d[None, :] < D), other=0.0)
    # stage 1: off-band
    # For causal = True, STAGE = 3 and _attn_fwd_inner gets 1 as its STAGE
    # For causal = False, STAGE = 1, and _attn_fwd_inner gets 3 as its STAGE
    if STAGE & 1:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kk, stride_vk, stride_vn, D,  #
                                        start_m, qk_scale, N_CTX,  #
                                        BLOCK_M, HEAD_DIM, BLOCK_N,  #
                                        4 - STAGE, offs_m, offs_n)
    # stage 2: on-band
    if STAGE & 2:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kk, stride_vk, stride_vn, D,  #
                                        start_m, qk_scale, N_CTX,  #
                                        BLOCK_M, HEAD_DIM, BLOCK_N,  #
                                        2, offs_m, offs_n)
    # epilogue
    acc = acc / l_i[:, None]
    tl.store(Out + offs_m[:, None] * stride_om + offs_d[None, :] * stride_on, acc.to(Out.type.element_ty),
             mask=(offs_m[:, None] < N_CTX) & (offs_d[None, :] < D))
"""

ATTENTION_POINTERS_MODEL = """
class ModelNew(nn.Module):
    def forward(self, q, k, v):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        D = q.shape[-1]
        o = torch.empty_like(q)
        BLOCK_M, BLOCK_N = 16, 16
        grid = (triton.cdiv(q.shape[1], BLOCK_M), q.shape[0], 1)
        _attn_fwd[grid](
            q, k, v, D ** -0.5, o,  #
            q.stride(0), q.stride(1), q.stride(2),  #
            k.stride(0), k.stride(1), k.stride(2),  #
            v.stride(0), v.stride(1), v.stride(2),  #
            o.stride(0), o.stride(1), o.stride(2),  #
            N_CTX=q.shape[1], D=D,  #
            HEAD_DIM=triton.next_power_of_2(D),  #
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,  #
            STAGE={stage},  #
            num_warps=4, num_stages=2)
        return o
"""

ATTENTION_MODEL = """
class ModelNew(nn.Module):
    def forward(self, q, k, v):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        HEAD_DIM = q.shape[-1]
        o = torch.empty_like(q)
        BLOCK_M, BLOCK_N = 16, 16
        grid = (triton.cdiv(q.shape[1], BLOCK_M), q.shape[0], 1)
        _attn_fwd[grid](
            q, k, v, HEAD_DIM ** -0.5, o,  #
            q.stride(0), q.stride(1), q.stride(2),  #
            k.stride(0), k.stride(1), k.stride(2),  #
            v.stride(0), v.stride(1), v.stride(2),  #
            o.stride(0), o.stride(1), o.stride(2),  #
            N_CTX=q.shape[1],  #
            HEAD_DIM=HEAD_DIM,  #
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,  #
            STAGE={stage},  #
            num_warps=4, num_stages=2)
        return o
"""

SPLIT_K = """
def init_to_zero(name):
    return lambda nargs: nargs[name].zero_()


@triton.autotune(
    configs=[
        triton.Config({'BLOCK_M': 16, 'BLOCK_N': 16, 'BLOCK_K': 32, 'SPLIT_K': 4}, num_warps=2, {zeroing}),
        triton.Config({'BLOCK_M': 16, 'BLOCK_N': 16, 'BLOCK_K': 64, 'SPLIT_K': 2}, num_warps=2, {zeroing}),
    ],
    key=['M', 'N', 'K'],{reset}
)
@triton.jit
def _splitk_kernel(A, B, C, M, N, K,  #
                   stride_am, stride_ak,  #
                   stride_bk, stride_bn,  #
                   stride_cm, stride_cn,  #
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,  #
                   SPLIT_K: tl.constexpr):
    # matrix multiplication
    pid = tl.program_id(0)
    pid_z = tl.program_id(1)
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // grid_n
    pid_n = pid % grid_n
    # do matrix multiplication
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_z * BLOCK_K + tl.arange(0, BLOCK_K)
    # pointers
    A = A + (rm[:, None] * stride_am + rk[None, :] * stride_ak)
    B = B + (rk[:, None] * stride_bk + rn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        k_remaining = K - k * (BLOCK_K * SPLIT_K)
        a = tl.load(A, mask=(rm[:, None] < M) & (rk[None, :] < k_remaining), other=0.)
        b = tl.load(B, mask=(rk[:, None] < k_remaining) & (rn[None, :] < N), other=0.)
        acc += tl.dot(a, b, input_precision="ieee")
        A += BLOCK_K * SPLIT_K * stride_ak
        B += BLOCK_K * SPLIT_K * stride_bk
    # rematerialize rm and rn to save registers
    C = C + (rm[:, None] * stride_cm + rn[None, :] * stride_cn)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    # handles write-back with reduction-splitting
    if SPLIT_K == 1:
        tl.store(C, acc, mask=mask)
    else:
        tl.atomic_add(C, acc, mask=mask)
"""

SPLIT_K_MODEL = """
class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        M, K = a.shape
        _, N = b.shape
        c = torch.{alloc}((M, N), device=a.device, dtype=torch.float32)
        grid = lambda META: (triton.cdiv(M, META['BLOCK_M']) * triton.cdiv(N, META['BLOCK_N']), META['SPLIT_K'])
        _splitk_kernel[grid](a, b, c, M, N, K,  #
                             a.stride(0), a.stride(1),  #
                             b.stride(0), b.stride(1),  #
                             c.stride(0), c.stride(1))
        return c
"""


def _matmul(call: str, builtin_min: bool) -> str:
    group_min = (
        "min(num_pid_m - first_pid_m, GROUP_SIZE_M)"
        if builtin_min
        else "tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)"
    )
    return module(MATMUL.replace("{group_min}", group_min), MATMUL_MODEL.replace("{call}", call))


def _entry(name, tutorial, problem, candidate, refusal=None) -> Entry:
    return Entry(
        name=f"tutorial_{name}",
        origin=(OPS if tutorial.startswith("triton/ops/") else TUTORIALS) + tutorial,
        kind="tutorial-style",
        problem=problem,
        candidate=candidate,
        refusal=refusal,
    )


ENTRIES = [
    _entry(
        "01_vector_add",
        "01-vector-add.py",
        "add",
        module(VECTOR_ADD.replace("{op}", "+"), VECTOR_ADD_MODEL),
    ),
    _entry(
        "01_vector_mul",
        "01-vector-add.py (x * y)",
        "mul",
        module(VECTOR_ADD.replace("{op}", "*"), VECTOR_ADD_MODEL),
    ),
    _entry(
        "02_fused_softmax",
        "02-fused-softmax.py",
        "softmax_rows",
        module(FUSED_SOFTMAX, FUSED_SOFTMAX_MODEL),
    ),
    _entry(
        "02_log_softmax",
        "02-fused-softmax.py (one row a program, log form)",
        "log_softmax_rows",
        module(LOG_SOFTMAX, LOG_SOFTMAX_MODEL),
    ),
    _entry(
        "03_matmul",
        "03-matrix-multiplication.py",
        "matmul",
        _matmul("matmul(a, b)", builtin_min=True),
    ),
    _entry(
        "03_matmul_tl_minimum",
        "03-matrix-multiplication.py (tl.minimum for min)",
        "matmul",
        _matmul("matmul(a, b)", builtin_min=False),
    ),
    _entry(
        "03_matmul_transposed",
        "03-matrix-multiplication.py (b.t() through strides)",
        "matmul_transposed",
        _matmul("matmul(a, b.t())", builtin_min=True),
    ),
    _entry(
        "03_batched_matmul",
        "03-matrix-multiplication.py (a batch per program_id(1))",
        "batched_matmul",
        module(BATCHED, BATCHED_MODEL),
    ),
    _entry(
        "03_linear_bias_relu",
        "03-matrix-multiplication.py (bias + ReLU epilogue)",
        "matmul_bias_relu",
        module(LINEAR_RELU, LINEAR_RELU_MODEL),
    ),
    _entry(
        "05_layer_norm",
        "05-layer-norm.py (_layer_norm_fwd_fused)",
        "layer_norm",
        module(
            LAYER_NORM,
            LAYER_NORM_MODEL.replace("{residual_arg}", "").replace("{x}", "x.contiguous()"),
        ),
    ),
    _entry(
        "05_residual_layer_norm",
        "01-vector-add.py then 05-layer-norm.py",
        "residual_layernorm",
        module(
            RESIDUAL_ADD + "\n\n" + LAYER_NORM,
            LAYER_NORM_MODEL.replace("{residual_arg}", ", residual")
            .replace("def forward(self, x", "def forward(self, x_in")
            .replace(
                "{x}",
                "torch.empty_like(x_in)\n        add_kernel[(triton.cdiv(x.numel(), 256),)](x_in.contiguous(), "
                "residual.contiguous(), x, x.numel(), BLOCK_SIZE=256)",
            ),
        ),
    ),
    _entry(
        "06_fused_attention_block_ptr",
        "06-fused-attention.py of Triton 3.0-3.2 (make_block_ptr, tl.advance: gone in Triton 3.9)",
        "attention",
        module(ATTENTION, ATTENTION_MODEL.replace("{stage}", "1")),
        refusal="triton.language.advance does not exist",
    ),
    _entry(
        "06_fused_attention",
        "06-fused-attention.py (_attn_fwd, _attn_fwd_inner, online softmax with exp2; plain pointers)",
        "attention",
        module(ATTENTION_POINTERS, ATTENTION_POINTERS_MODEL.replace("{stage}", "1")),
    ),
    _entry(
        "06_fused_attention_causal",
        "06-fused-attention.py (causal: STAGE 3, off-band then on-band)",
        "causal_attention",
        module(ATTENTION_POINTERS, ATTENTION_POINTERS_MODEL.replace("{stage}", "3")),
    ),
    _entry(
        "splitk_matmul_init_to_zero",
        "triton/ops/matmul.py of Triton 2.x (SPLIT_K, pre_hook=init_to_zero)",
        "matmul_large_k",
        module(
            SPLIT_K.replace("{zeroing}", "pre_hook=init_to_zero('C')").replace("{reset}", ""),
            SPLIT_K_MODEL.replace("{alloc}", "empty"),
        ),
    ),
    _entry(
        "splitk_matmul_reset_to_zero",
        "triton/ops/matmul.py of Triton 2.x (SPLIT_K, autotune reset_to_zero)",
        "matmul_large_k",
        module(
            SPLIT_K.replace(", {zeroing}", "").replace("{reset}", "\n    reset_to_zero=['C'],"),
            SPLIT_K_MODEL.replace("{alloc}", "empty"),
        ),
    ),
    _entry(
        "splitk_matmul_zeros",
        "triton/ops/matmul.py of Triton 2.x (SPLIT_K into a torch.zeros output)",
        "matmul_large_k",
        module(
            SPLIT_K.replace(", {zeroing}", "").replace("{reset}", "").split("\n\n\n", 1)[1],
            SPLIT_K_MODEL.replace("{alloc}", "zeros"),
        ),
    ),
]
