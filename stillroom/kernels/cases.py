"""Generated test cases for the kernel validator (AutoTriton's test-case generator): inputs that
``get_inputs()`` would rarely or never draw, so that a kernel passing the trials' random draws
must also hold on edge cases.

Value cases redraw every floating input (same shapes; integer and other inputs as in trial 0):
``mixed_sign`` standard normal, ``negative`` minus its magnitude, ``zero`` all zeros, ``large``
standard normal times 1e3 (its tolerance scales with the outputs' magnitude: an fp32 matmul of
1e3-sized values cannot meet atol 1e-4). The shape case ``odd_shape`` changes sizes to odd ones
(every size at once, else one size at a time), consistently across inputs sharing a size; floating
values are resampled from trial 0's own values, integer inputs redrawn within their observed range.
A case is kept only if the reference accepts it and its outputs stay finite. Seeded: the same seed
gives the same cases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..config.evaluation import TEST_CASES as CASES

LARGE = 1e3
VALUE_CASES = ("mixed_sign", "negative", "zero", "large")


@dataclass
class Case:
    name: str
    inputs: list
    expected: list  # the reference's outputs, flattened, on the validator's device
    scale_atol: bool = False  # atol times the output's largest magnitude


def _values(name: str, like, gen):
    import torch

    if name == "zero":
        return torch.zeros_like(like)
    x = torch.randn(like.shape, generator=gen, dtype=torch.float32)
    if name == "negative":
        x = -x.abs()
    elif name == "large":
        x = x * LARGE
    return x.to(like.dtype)


def _odd(size: int) -> int:
    return size + 1 if size % 2 == 0 else size + 2


def resized(template: list, sizes: dict[int, int], gen) -> list:
    """``template`` with each dimension of a size in ``sizes`` changed to its new size."""
    import torch

    out = []
    for x in template:
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            out.append(_clone(x))
            continue
        shape = [sizes.get(d, d) for d in x.shape]
        if x.is_floating_point() or x.is_complex():
            flat = x.reshape(-1)
            pick = torch.randint(
                0, max(1, flat.numel()), (int(torch.Size(shape).numel()),), generator=gen
            )
            out.append(flat[pick].reshape(shape) if flat.numel() else x.new_zeros(shape))
        elif x.dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=gen).bool())
        else:
            low, high = (int(x.min()), int(x.max())) if x.numel() else (0, 0)
            out.append(torch.randint(low, high + 1, shape, generator=gen, dtype=x.dtype))
    return out


def generate(
    model,
    template: list,
    *,
    names: list[str] | tuple[str, ...],
    seed: int,
    run: Callable[[list], list],
) -> list[Case]:
    """The cases among ``names`` that the reference ``model`` accepts with finite outputs.
    ``template``: trial 0's inputs; ``run(inputs)``: the reference's flattened outputs."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    cases = []
    for name in names:
        if name in VALUE_CASES:
            floats = [isinstance(x, torch.Tensor) and x.is_floating_point() for x in template]
            if not any(floats):
                continue
            variants = [
                [
                    _values(name, x, gen) if f else _clone(x)
                    for x, f in zip(template, floats, strict=True)
                ]
            ]
        elif name == "odd_shape":
            sizes = list(
                dict.fromkeys(
                    d for x in template if isinstance(x, torch.Tensor) for d in x.shape if d > 1
                )
            )
            picks = [sizes] + [[s] for s in sizes] if len(sizes) > 1 else [[s] for s in sizes]
            variants = (resized(template, {s: _odd(s) for s in pick}, gen) for pick in picks)
        else:
            raise ValueError(f"unknown test case {name!r}; expected one of {', '.join(CASES)}")
        for inputs in variants:
            try:
                expected = run(inputs)
            # the reference refuses these inputs (a shape it cannot take): try the next variant
            except (RuntimeError, ValueError, IndexError, TypeError, AssertionError):
                continue
            if all(bool(torch.isfinite(w).all()) for w in expected if w.is_floating_point()):
                cases.append(Case(name, inputs, expected, scale_atol=name == "large"))
                break
    return cases


def _clone(x):
    import torch

    return x.clone() if isinstance(x, torch.Tensor) else x
