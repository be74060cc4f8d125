"""Kernels written in the style of attorch (github.com/BobMcDear/attorch, attorch/*.py): kernels
over [BLOCK_SIZE_BATCH, BLOCK_SIZE_FEAT] tiles with ``batch_dim``/``feat_dim`` and explicit strides,
``@triton.autotune`` on the sizes plus ``@triton.heuristics`` for the block sizes, and one
activation kernel that switches on a string constexpr ``act_func`` (attorch/act_kernels.py's
``apply_act_func``). Each entry names the file it imitates."""

from __future__ import annotations

from . import Entry
from .tutorial_style import module

ATTORCH = "github.com/BobMcDear/attorch attorch/"

CONFIGS = """
def element_wise_kernel_configs(block_name='BLOCK_SIZE'):
    return [triton.Config({block_name: 64}, num_warps=2),
            triton.Config({block_name: 128}, num_warps=2),
            triton.Config({block_name: 256}, num_warps=4)]


def warps_kernel_configs():
    return [triton.Config({}, num_warps=2**i) for i in range(4)]


def BLOCK_SIZE_BATCH_heuristic(args):
    return min(max(1, triton.next_power_of_2(args['batch_dim'] // 2 ** 10)), 16)
"""

ACT = """
@triton.jit
def sigmoid(input):
    return (1 / (1 + tl.exp(-input)))


@triton.jit
def tanh(input):
    return 2 * sigmoid(2 * input) - 1


@triton.jit
def relu(input):
    return tl.maximum(0, input)


@triton.jit
def gelu(input):
    cdf = 0.5 * (1 + tl.math.erf(0.707106781 * input))
    return cdf * input


@triton.jit
def silu(input):
    return (input * sigmoid(input))


@triton.jit
def hardswish(input):
    return input * tl.minimum(tl.maximum(input + 3, 0), 6) / 6


@triton.jit
def leaky_relu(input, negative_slope):
    return tl.where(input <= 0, negative_slope * input, input)


@triton.jit
def softplus(input):
    return tl.where(input > 20, input, tl.log(1 + tl.exp(input)))


@triton.jit
def mish(input):
    return input * tanh(softplus(input))


@triton.jit
def apply_act_func(input, param, act_func: tl.constexpr):
    if act_func == 'sigmoid':
        input = input.to(tl.float32)
        output = sigmoid(input)
    elif act_func == 'tanh':
        input = input.to(tl.float32)
        output = tanh(input)
    elif act_func == 'relu':
        output = relu(input)
    elif act_func == 'gelu':
        input = input.to(tl.float32)
        output = gelu(input)
    elif act_func == 'silu':
        input = input.to(tl.float32)
        output = silu(input)
    elif act_func == 'hardswish':
        output = hardswish(input)
    elif act_func == 'leaky_relu':
        output = leaky_relu(input, param)
    elif act_func == 'mish':
        input = input.to(tl.float32)
        output = mish(input)
    return output


@triton.autotune(
    configs=element_wise_kernel_configs(),
    key=['size'],
)
@triton.jit
def act_func_forward_kernel(
    input_pointer, output_pointer, size, param,
    act_func: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ):
    # This program processes BLOCK_SIZE rows.
    pid = tl.program_id(axis=0)
    offset = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offset < size

    input = tl.load(input_pointer + offset, mask=mask)
    tl.store(output_pointer + offset, apply_act_func(input, param, act_func), mask=mask)
"""

ACT_MODEL = """
class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.param = float(args[0]) if args else 0.0

    def forward(self, input):
        flattened_input = input.contiguous().flatten()
        size = len(flattened_input)
        output = torch.empty_like(flattened_input)
        # Launches 1D grid where each program operates over
        # BLOCK_SIZE elements.
        grid = lambda META: (triton.cdiv(size, META['BLOCK_SIZE']),)
        act_func_forward_kernel[grid](flattened_input, output, size, self.param, '{act}')
        return output.view_as(input)
"""

SOFTMAX = """
@triton.autotune(
    configs=warps_kernel_configs(),
    key=['batch_dim', 'feat_dim'],
)
@triton.heuristics({'BLOCK_SIZE_BATCH': BLOCK_SIZE_BATCH_heuristic,
                    'BLOCK_SIZE_FEAT': lambda args: triton.next_power_of_2(args['feat_dim'])})
@triton.jit
def softmax_forward_kernel(
    input_pointer, output_pointer,
    batch_dim, feat_dim,
    input_batch_stride, input_feat_stride,
    output_batch_stride, output_feat_stride,
    log: tl.constexpr,
    BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_FEAT: tl.constexpr,
    ):
    # This program processes BLOCK_SIZE_BATCH rows and BLOCK_SIZE_FEAT columns.
    batch_pid = tl.program_id(axis=0)

    batch_offset = batch_pid * BLOCK_SIZE_BATCH + tl.arange(0, BLOCK_SIZE_BATCH)
    feat_offset = tl.arange(0, BLOCK_SIZE_FEAT)

    batch_mask = batch_offset < batch_dim
    feat_mask = feat_offset < feat_dim

    input_pointer += (input_batch_stride * batch_offset[:, None] +
                      input_feat_stride * feat_offset[None, :])
    output_pointer += (output_batch_stride * batch_offset[:, None] +
                       output_feat_stride * feat_offset[None, :])

    input = tl.load(input_pointer,
                    mask=batch_mask[:, None] & feat_mask[None, :],
                    other=-float('inf')).to(tl.float32)
    input -= tl.max(input, axis=1)[:, None]
    numerator = tl.exp(input)
    denominator = tl.sum(numerator, axis=1)[:, None]

    if log:
        output = input - tl.log(denominator)
    else:
        output = numerator / denominator

    tl.store(output_pointer, output,
             mask=batch_mask[:, None] & feat_mask[None, :])
"""

SOFTMAX_MODEL = """
class ModelNew(nn.Module):
    def forward(self, input):
        flattened_input = input.flatten(0, -2)
        batch_dim, feat_dim = flattened_input.shape
        output = torch.empty_like(flattened_input)
        # Launches 1D grid where each program operates over
        # BLOCK_SIZE_BATCH rows.
        grid = lambda META: (triton.cdiv(batch_dim, META['BLOCK_SIZE_BATCH']),)
        softmax_forward_kernel[grid](flattened_input, output, batch_dim, feat_dim,
                                     *flattened_input.stride(), *output.stride(),
                                     log={log})
        return output.view_as(input)
"""

NORM = """
@triton.autotune(
    configs=warps_kernel_configs(),
    key=['batch_dim', 'feat_dim'],
)
@triton.heuristics({'BLOCK_SIZE_BATCH': BLOCK_SIZE_BATCH_heuristic,
                    'BLOCK_SIZE_FEAT': lambda args: triton.next_power_of_2(args['feat_dim'])})
@triton.jit
def norm_forward_kernel(
    input_pointer, weight_pointer, bias_pointer, output_pointer,
    batch_dim, feat_dim,
    input_batch_stride, input_feat_stride,
    output_batch_stride, output_feat_stride,
    eps,
    scale_by_weight: tl.constexpr, add_bias: tl.constexpr, rms: tl.constexpr,
    BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_FEAT: tl.constexpr,
    ):
    # This program processes BLOCK_SIZE_BATCH rows and BLOCK_SIZE_FEAT columns.
    batch_pid = tl.program_id(axis=0)

    batch_offset = batch_pid * BLOCK_SIZE_BATCH + tl.arange(0, BLOCK_SIZE_BATCH)
    feat_offset = tl.arange(0, BLOCK_SIZE_FEAT)

    batch_mask = batch_offset < batch_dim
    feat_mask = feat_offset < feat_dim

    input_pointer += (input_batch_stride * batch_offset[:, None] +
                      input_feat_stride * feat_offset[None, :])
    output_pointer += (output_batch_stride * batch_offset[:, None] +
                       output_feat_stride * feat_offset[None, :])

    input = tl.load(input_pointer,
                    mask=batch_mask[:, None] & feat_mask[None, :]).to(tl.float32)
    if rms:
        centered_input = input
    else:
        mean = tl.sum(input, axis=1) / feat_dim
        centered_input = tl.where(feat_mask[None, :], input - mean[:, None], 0)
    var = tl.sum(centered_input * centered_input, axis=1) / feat_dim
    inv_std = tl.rsqrt(var + eps)
    output = centered_input * inv_std[:, None]

    if scale_by_weight:
        weight = tl.load(weight_pointer + feat_offset, mask=feat_mask)
        output *= weight
        if add_bias:
            bias = tl.load(bias_pointer + feat_offset, mask=feat_mask)
            output += bias

    tl.store(output_pointer, output,
             mask=batch_mask[:, None] & feat_mask[None, :])
"""

NORM_MODEL = """
class ModelNew(nn.Module):
{init}

    def forward(self, input):
        flattened_input = input.flatten(0, -2)
        batch_dim, feat_dim = flattened_input.shape
        output = torch.empty_like(flattened_input)
        grid = lambda META: (triton.cdiv(batch_dim, META['BLOCK_SIZE_BATCH']),)
        norm_forward_kernel[grid](flattened_input, {weight}, {bias}, output, batch_dim, feat_dim,
                                  *flattened_input.stride(), *output.stride(), {eps},
                                  scale_by_weight=True, add_bias={add_bias}, rms={rms})
        return output.view_as(input)
"""

BATCH_NORM = """
@triton.autotune(
    configs=warps_kernel_configs(),
    key=['batch_dim', 'spatial_dim'],
)
@triton.heuristics({'BLOCK_SIZE_BATCH': lambda args: triton.next_power_of_2(args['batch_dim']),
                    'BLOCK_SIZE_SPATIAL': lambda args: triton.next_power_of_2(args['spatial_dim'])})
@triton.jit
def batch_norm_forward_kernel(
    input_pointer, weight_pointer, bias_pointer,
    running_mean_pointer, running_var_pointer,
    output_pointer,
    batch_dim, spatial_dim,
    input_batch_stride, input_feat_stride, input_spatial_stride,
    output_batch_stride, output_feat_stride, output_spatial_stride,
    eps,
    BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_SPATIAL: tl.constexpr,
    ):
    # Evaluation mode: one program a feature, normalised by the running statistics
    feat_pid = tl.program_id(axis=0)

    batch_offset = tl.arange(0, BLOCK_SIZE_BATCH)
    batch_mask = batch_offset < batch_dim

    mean = tl.load(feat_pid + running_mean_pointer)
    inv_std = tl.rsqrt(tl.load(feat_pid + running_var_pointer) + eps)

    weight = tl.load(feat_pid + weight_pointer)
    bias = tl.load(feat_pid + bias_pointer)

    for block_ind in range(0, tl.cdiv(spatial_dim, BLOCK_SIZE_SPATIAL)):
        spatial_offset = (block_ind * BLOCK_SIZE_SPATIAL +
                          tl.arange(0, BLOCK_SIZE_SPATIAL))
        spatial_mask = spatial_offset < spatial_dim

        curr_input_pointer = (input_pointer +
                              input_feat_stride * feat_pid +
                              input_batch_stride * batch_offset[:, None] +
                              input_spatial_stride * spatial_offset[None, :])
        curr_output_pointer = (output_pointer +
                               output_feat_stride * feat_pid +
                               output_batch_stride * batch_offset[:, None] +
                               output_spatial_stride * spatial_offset[None, :])

        curr_input = tl.load(curr_input_pointer,
                             mask=batch_mask[:, None] & spatial_mask[None, :]).to(tl.float32)
        output = weight * (curr_input - mean) * inv_std + bias

        tl.store(curr_output_pointer, output,
                 mask=batch_mask[:, None] & spatial_mask[None, :])
"""

BATCH_NORM_MODEL = """
class ModelNew(nn.Module):
    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, input):
        flattened_input = input.flatten(2, -1)
        batch_dim, feat_dim, spatial_dim = flattened_input.shape
        output = torch.empty_like(flattened_input)
        bn = self.bn
        batch_norm_forward_kernel[(feat_dim,)](
            flattened_input, bn.weight, bn.bias, bn.running_mean, bn.running_var, output,
            batch_dim, spatial_dim, *flattened_input.stride(), *output.stride(), bn.eps)
        return output.view_as(input)
"""

CROSS_ENTROPY = """
@triton.autotune(
    configs=warps_kernel_configs(),
    key=['batch_dim', 'feat_dim'],
)
@triton.heuristics({'BLOCK_SIZE_BATCH': BLOCK_SIZE_BATCH_heuristic,
                    'BLOCK_SIZE_FEAT': lambda args: triton.next_power_of_2(args['feat_dim'])})
@triton.jit
def cross_entropy_loss_forward_kernel(
    input_pointer, target_pointer, output_pointer,
    batch_dim, feat_dim,
    input_batch_stride, input_feat_stride,
    BLOCK_SIZE_BATCH: tl.constexpr, BLOCK_SIZE_FEAT: tl.constexpr,
    ):
    # This program processes BLOCK_SIZE_BATCH rows and BLOCK_SIZE_FEAT columns;
    # its share of the mean loss is added to the output atomically.
    batch_pid = tl.program_id(axis=0)

    batch_offset = batch_pid * BLOCK_SIZE_BATCH + tl.arange(0, BLOCK_SIZE_BATCH)
    feat_offset = tl.arange(0, BLOCK_SIZE_FEAT)

    batch_mask = batch_offset < batch_dim
    feat_mask = feat_offset < feat_dim

    target = tl.load(target_pointer + batch_offset, mask=batch_mask)

    pred_pointer = (input_pointer +
                    input_feat_stride * target +
                    input_batch_stride * batch_offset)
    input_pointer += (input_batch_stride * batch_offset[:, None] +
                      input_feat_stride * feat_offset[None, :])

    input = tl.load(input_pointer, mask=batch_mask[:, None] & feat_mask[None, :],
                    other=-float('inf')).to(tl.float32)
    pred = tl.load(pred_pointer, mask=batch_mask).to(tl.float32)
    mx = tl.max(input, axis=1)
    input -= mx[:, None]
    loss = tl.log(tl.sum(tl.exp(input), axis=1)) - pred + mx
    loss = tl.where(batch_mask, loss, 0.0)

    tl.atomic_add(output_pointer, tl.sum(loss) / batch_dim)
"""

CROSS_ENTROPY_MODEL = """
class ModelNew(nn.Module):
    def forward(self, input, target):
        batch_dim, feat_dim = input.shape
        output = torch.zeros((), dtype=torch.float32, device=input.device)
        grid = lambda META: (triton.cdiv(batch_dim, META['BLOCK_SIZE_BATCH']),)
        cross_entropy_loss_forward_kernel[grid](input, target, output, batch_dim, feat_dim,
                                                *input.stride())
        return output
"""

GLU = """
@triton.autotune(
    configs=element_wise_kernel_configs(),
    key=['size'],
)
@triton.jit
def glu_forward_kernel(
    input1_pointer, input2_pointer, output_pointer, size,
    act_func: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ):
    # This program processes BLOCK_SIZE rows.
    pid = tl.program_id(axis=0)
    offset = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offset < size

    input1 = tl.load(input1_pointer + offset, mask=mask)
    input2 = tl.load(input2_pointer + offset, mask=mask)

    output = apply_act_func(input1, 0.0, act_func) * input2
    tl.store(output_pointer + offset, output, mask=mask)
"""

GLU_MODEL = """
class ModelNew(nn.Module):
    def forward(self, a, b):
        input1, input2 = a.contiguous().flatten(), b.contiguous().flatten()
        size = input1.numel()
        output = torch.empty_like(input1)
        grid = lambda META: (triton.cdiv(size, META['BLOCK_SIZE']),)
        glu_forward_kernel[grid](input1, input2, output, size, '{act}')
        return output.view_as(a)
"""

LN_INIT = """    def __init__(self, normalized_shape):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape)"""
RMS_INIT = """    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))"""


def _entry(name, file, problem, candidate) -> Entry:
    return Entry(
        name=f"attorch_{name}",
        origin=ATTORCH + file,
        kind="attorch-style",
        problem=problem,
        candidate=candidate,
    )


ACT_PROBLEMS = {
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "relu": "relu",
    "gelu": "gelu_erf",
    "silu": "silu",
    "hardswish": "hardswish",
    "leaky_relu": "leaky_relu",
    "mish": "mish",
}

ENTRIES = [
    _entry(
        f"act_{act}",
        f"act_kernels.py (act_func_forward_kernel, act_func='{act}')",
        problem,
        module(CONFIGS + "\n\n" + ACT, ACT_MODEL.replace("{act}", act)),
    )
    for act, problem in ACT_PROBLEMS.items()
] + [
    _entry(
        "glu_silu",
        "glu_kernels.py (glu_forward_kernel, act_func='silu')",
        "swiglu",
        module(CONFIGS + "\n\n" + ACT + "\n\n" + GLU, GLU_MODEL.replace("{act}", "silu")),
    ),
    _entry(
        "glu_gelu",
        "glu_kernels.py (glu_forward_kernel, act_func='gelu')",
        "geglu",
        module(CONFIGS + "\n\n" + ACT + "\n\n" + GLU, GLU_MODEL.replace("{act}", "gelu")),
    ),
    _entry(
        "softmax",
        "softmax_kernels.py (softmax_forward_kernel)",
        "softmax_rows",
        module(CONFIGS + "\n\n" + SOFTMAX, SOFTMAX_MODEL.replace("{log}", "False")),
    ),
    _entry(
        "log_softmax",
        "softmax_kernels.py (softmax_forward_kernel, log=True)",
        "log_softmax_rows",
        module(CONFIGS + "\n\n" + SOFTMAX, SOFTMAX_MODEL.replace("{log}", "True")),
    ),
    _entry(
        "layer_norm",
        "layer_norm_kernels.py (layer_norm_forward_kernel)",
        "layer_norm",
        module(
            CONFIGS + "\n\n" + NORM,
            NORM_MODEL.replace("{init}", LN_INIT)
            .replace("{weight}", "self.norm.weight")
            .replace("{bias}", "self.norm.bias")
            .replace("{eps}", "self.norm.eps")
            .replace("{add_bias}", "True")
            .replace("{rms}", "False"),
        ),
    ),
    _entry(
        "rms_norm",
        "rms_norm_kernels.py (rms_norm_forward_kernel)",
        "rms_norm",
        module(
            CONFIGS + "\n\n" + NORM,
            NORM_MODEL.replace("{init}", RMS_INIT)
            .replace("{weight}", "self.weight")
            .replace("{bias}", "self.weight")
            .replace("{eps}", "self.eps")
            .replace("{add_bias}", "False")
            .replace("{rms}", "True"),
        ),
    ),
    _entry(
        "batch_norm_eval",
        "batch_norm_kernels.py (batch_norm_forward_kernel, evaluation mode)",
        "batch_norm_inference",
        module(CONFIGS + "\n\n" + BATCH_NORM, BATCH_NORM_MODEL),
    ),
    _entry(
        "cross_entropy",
        "cross_entropy_loss_kernels.py (cross_entropy_loss_forward_kernel)",
        "cross_entropy",
        module(CONFIGS + "\n\n" + CROSS_ENTROPY, CROSS_ENTROPY_MODEL),
    ),
]
