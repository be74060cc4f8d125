"""libdevice's float functions as Triton code the CPU interpreter can run (kernel_source.py maps
``libdevice.<name>`` here where triton.language has no function of that name).

Triton's ``triton.language.extra.libdevice`` holds stubs that a GPU compile replaces with the
backend's libdevice (CUDA's ``__nv_tanhf`` ...); its CPU interpreter runs the stubs, which return
None, and cannot run the backends' extern calls at all. Each function here computes the same value
from ``triton.language`` operations the interpreter runs (exp, log, sqrt, floor ...), to within the
validator's tolerances, and like libdevice takes fp32 or fp64 only (a GPU compile refuses fp16 and
bf16 arguments). The canonical source (kernel_source.py) holds these functions as written here,
read by the trusted parent from this installed module, so CPU and GPU replays run the same code.
Functions without a formula here (atan, asin, acos, atan2, lgamma, erfinv, the Bessel functions,
the directed roundings ...) are refused with that reason.
"""

import triton
import triton.language as tl

LOG10_2 = tl.constexpr(0.30102999566398119521)  # log10(2)
LOG2_10 = tl.constexpr(3.32192809488736234787)  # log2(10)


@triton.jit
def _float(x):
    tl.static_assert(x.dtype.is_fp32() or x.dtype.is_fp64(), "libdevice takes fp32 or fp64")


@triton.jit
def tanh(x):
    _float(x)
    # exp of a non-positive argument: no overflow for any x
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def sinh(x):
    _float(x)
    e = tl.exp(tl.abs(x))
    s = 0.5 * (e - 1.0 / e)
    return tl.where(x < 0, -s, s)


@triton.jit
def cosh(x):
    _float(x)
    e = tl.exp(tl.abs(x))
    return 0.5 * (e + 1.0 / e)


@triton.jit
def tan(x):
    _float(x)
    return tl.sin(x) / tl.cos(x)


@triton.jit
def log1p(x):
    _float(x)
    # log(u) * x / (u - 1) with u = 1 + x cancels the rounding of 1 + x (Goldberg, 1991)
    u = 1.0 + x
    d = u - 1.0
    corrected = tl.log(u) * (x / tl.where((d == 0.0) | (u == float("inf")), 1.0, d))
    return tl.where(d == 0.0, x, tl.where(u == float("inf"), u, corrected))


@triton.jit
def expm1(x):
    _float(x)
    # (u - 1) * x / log(u) with u = exp(x): the same correction as log1p's (Kahan)
    u = tl.exp(x)
    d = u - 1.0
    small = tl.where(d == -1.0, -1.0, d * (x / tl.log(tl.where(d == 0.0, 2.0, u))))
    return tl.where(d == 0.0, x, tl.where(u == float("inf"), u, small))


@triton.jit
def log10(x):
    _float(x)
    return tl.log2(x) * LOG10_2


@triton.jit
def exp10(x):
    _float(x)
    return tl.exp2(x * LOG2_10)


@triton.jit
def pow(x, y):
    _float(x)
    # |x| ** y by exp2 and log2, signed for a negative x (-0.0 too) and an odd integer y, NaN
    # for a finite negative x and a fractional y; as C's pow: x ** 0, 1 ** y and (-1) ** inf
    # are 1 whatever the other is
    y = y.to(x.dtype)
    magnitude = tl.exp2(y * tl.log2(tl.abs(x)))
    integral = tl.floor(y) == y
    odd = integral & (tl.floor(0.5 * y) != 0.5 * y)
    signed = tl.where((signbit(x) != 0) & odd, -magnitude, magnitude)
    signed = tl.where((x < 0) & (x > float("-inf")) & ~integral, float("nan"), signed)
    one = (y == 0.0) | (x == 1.0) | ((x == -1.0) & (tl.abs(y) == float("inf")))
    return tl.where(one, 1.0, signed)


@triton.jit
def isnan(x):
    _float(x)
    return x != x


@triton.jit
def isinf(x):
    _float(x)
    return tl.abs(x) == float("inf")


@triton.jit
def isfinite(x):
    _float(x)
    return tl.abs(x) < float("inf")


@triton.jit
def signbit(x):
    _float(x)
    # -0.0 has its sign bit set: 1 / -0.0 is -inf
    return ((x < 0) | ((x == 0) & (1.0 / x < 0))).to(tl.int32)


@triton.jit
def copysign(x, y):
    _float(x)
    return tl.where(signbit(y) != 0, -tl.abs(x), tl.abs(x))


@triton.jit
def trunc(x):
    _float(x)
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


@triton.jit
def rint(x):
    _float(x)
    # to the nearest integer, halves to the even one (the default rounding mode)
    f = tl.floor(x)
    d = x - f
    odd = tl.floor(0.5 * f) != 0.5 * f
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)


@triton.jit
def round(x):
    _float(x)
    # to the nearest integer, halves away from zero
    a = tl.abs(x)
    f = tl.floor(a)
    r = tl.where(a - f >= 0.5, f + 1.0, f)
    return tl.where(x < 0, -r, r)


@triton.jit
def fmod(x, y):
    _float(x)
    # Triton's % of floats is C's fmod (the sign of x)
    return x % y


@triton.jit
def hypot(x, y):
    _float(x)
    return tl.sqrt(x * x + y * y)


@triton.jit
def cbrt(x):
    _float(x)
    r = tl.exp2(tl.log2(tl.abs(x)) / 3.0)
    return tl.where(x < 0, -r, r)


@triton.jit
def erfc(x):
    _float(x)
    return 1.0 - tl.erf(x)


@triton.jit
def asinh(x):
    _float(x)
    a = tl.abs(x)
    r = tl.log(a + tl.sqrt(a * a + 1.0))
    return tl.where(x < 0, -r, r)


@triton.jit
def acosh(x):
    _float(x)
    return tl.log(x + tl.sqrt(x * x - 1.0))


@triton.jit
def atanh(x):
    _float(x)
    return 0.5 * log1p(2.0 * x / (1.0 - x))
