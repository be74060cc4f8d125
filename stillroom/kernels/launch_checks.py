"""AutoTriton's rule reward (the seed's ``validate_syntax``), judged in the parent on values: the
launches of the checked program (program.py) and what the replay measured of each one when it
ran it instrumented (replay.Analysis): on CPU every launch, every program instance of it (in a
random order) and every autotuned config, on every case; on a GPU every launch and config, with
the first, the last and ``replay.GPU_SAMPLE`` program instances drawn from a secret seed. Nothing
here reads the candidate's source text, so a value spelled another way
(``BLOCK=tl.constexpr(4096)``, ``tl.arange(0, HALF + HALF)``), a loop or an access moved into a
helper, or terms that cancel are judged by what they are when the kernel runs.

- Block sizes: every dimension of every block a call of the kernel returns (``tl.arange``,
  ``tl.full``, ``tl.reshape``, ``tl.join``, ``tl.broadcast_to``, ``tl.dot``, a helper ...), and
  every constexpr argument named like one (BLOCK, BLOCK_M, TILE_K, XBLOCK ...), a power of two
  and at most ``max_block_size``.
- Threads: num_warps x 32 at most ``max_threads_per_block``.
- Instructions: the operations an instance executes (one per call and per arithmetic,
  comparison or boolean operation of the source), a loop over compile-time bounds or a
  ``tl.static_range`` counted every iteration (it is unrolled), a loop over run-time bounds or a
  ``while`` as its costliest iteration (it stays a loop), helpers with the constexprs they were
  called with; the most any instance of any run executes, at most ``max_instructions``.
- Coalescing: every load and store, each execution judged alone, with lanes laid out as Triton
  lays them (along the most contiguous axis, the last on a tie, 32 to a warp): its warps touch at
  most 1.5x the 32-byte memory sectors their distinct addresses need (a unit stride or a
  broadcast: 1x; a stride of 2: 2x). A row's edge (a line that jumps at most once per 32 bytes of
  elements, as where an index modulo an odd size wraps) neither moves the lanes off its axis nor
  is charged: Triton lays them there on the sizes the block divides. A scalar access passes; it
  excuses no other access of its line."""

from __future__ import annotations

import re

from .program import Launch, Parsed

BLOCK_NAME = re.compile(r"(BLOCK|TILE)(_\w+)?|\w*_?(BLOCK|TILE)")
# coalesced: with lanes laid out as Triton lays them, warps touch at most this many times the
# 32-byte sectors their distinct addresses need (a unit stride: 1; a broadcast: 1; stride 2: 2)
MAX_SECTOR_RATIO = 1.5


def _power_of_two(n: int) -> bool:
    return n >= 1 and not n & (n - 1)


def check(
    parsed: Parsed,
    analysed: dict,
    *,
    max_block_size: int,
    max_threads_per_block: int,
    max_instructions: int,
) -> list[str]:
    """The rule failures of every launch of the programs (its recorded values) and of what the
    replay measured of each (``analysed``), as reasons; empty when every one keeps the rules."""
    reasons: list[str] = []
    named: dict[str, set[int]] = {}  # kernel -> block sizes reported by name already
    for p in parsed.programs:
        for step in p.steps if p is not None else []:
            for launch in step.get("alternatives", []):
                reasons += _recorded(launch, named, max_block_size, max_threads_per_block)
    for entry in analysed.values():
        try:
            program = parsed.programs[entry["program"]]
            launch: Launch = program.steps[entry["step"]]["alternatives"][entry["alternative"]]
        except (IndexError, KeyError, TypeError, AttributeError):
            reasons.append("the replay reported an analysis of no launch of the program")
            continue
        name = launch.name
        for size in entry.get("sizes", []):
            if size in named.get(name, set()):
                continue
            if not _power_of_two(size):
                reasons.append(
                    f"kernel {name}: a block of {size} elements (tl.arange or a block shape) is "
                    "not a power of two"
                )
            elif size > max_block_size:
                reasons.append(
                    f"kernel {name}: a block of {size} elements (tl.arange or a block shape) "
                    f"exceeds {max_block_size}"
                )
        count = entry.get("instructions", 0)
        if count > max_instructions:
            reasons.append(
                f"kernel {name}: about {count} instructions per program (as run: loops over "
                f"compile-time bounds unrolled, helpers included), more than {max_instructions}"
            )
        for access in entry.get("accesses", []):
            why = _uncoalesced(access)
            if why:
                reasons.append(why)
    return list(dict.fromkeys(reasons))


def _recorded(launch: Launch, named: dict, max_block_size: int, max_threads: int) -> list[str]:
    """The rules a launch's recorded values decide alone: block sizes given by name, warps."""
    reasons = []
    name = launch.name
    for arg, value in sorted(launch.constexprs.items()):
        if isinstance(value, bool) or not isinstance(value, int) or not BLOCK_NAME.fullmatch(arg):
            continue
        named.setdefault(name, set()).add(value)
        if not _power_of_two(value):
            reasons.append(f"kernel {name}: block size {arg}={value} is not a power of two")
        elif value > max_block_size:
            reasons.append(f"kernel {name}: block size {arg}={value} exceeds {max_block_size}")
    warps = launch.num_warps
    if warps * 32 > max_threads:
        reasons.append(
            f"kernel {name}: num_warps={warps} is {warps * 32} threads per block, "
            f"more than {max_threads}"
        )
    return reasons


def _uncoalesced(access: dict) -> str | None:
    touched, fewest = access.get("touched", 0), access.get("fewest", 0)
    if not fewest or touched <= MAX_SECTOR_RATIO * fewest:
        return None
    return (
        f"{access.get('site', 'a kernel')}: {access.get('what', 'an access')} has no unit-stride "
        f"axis: its lanes touch {touched / fewest:.1f}x the memory sectors their addresses need "
        "(uncoalesced)"
    )
