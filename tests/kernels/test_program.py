"""The checks in the parent, on what the extraction reported: each kernel's source against the
whitelist and its canonical rewrite (kernel_source.py), and every field of a record against the
case and the limits (program.py). Nothing here runs a candidate."""

from __future__ import annotations

import ast
import textwrap

import pytest

from stillroom.kernels import channel, kernel_source, program

LANG = {"module": "triton.language"}


def checked(source: str, globals_: dict | None = None, more: dict | None = None):
    kernels = {"0:k": {"name": "k", "source": textwrap.dedent(source), "globals": globals_ or {}}}
    kernels.update(more or {})
    return kernel_source.check(kernels)


def test_aliases_constants_and_decorators_become_one_canonical_source():
    out = checked(
        """
        @triton.autotune(configs=[], key=[])
        @triton.jit
        def relu(x_ptr, out_ptr, n, BLOCK: lang.constexpr, KIND: "tl.constexpr" = 2):
            offs = L.program_id(0) * BLOCK + arange(0, BLOCK)
            x = L.load(x_ptr + offs, mask=offs < n, other=FLOOR).to(DTYPE)
            L.store(out_ptr + offs, helper(x, FLOOR), mask=offs < n)
        """,
        {
            "lang": LANG,
            "L": LANG,
            "arange": {"language": "triton.language.core.arange"},
            "FLOOR": {"value": 0.0},
            "DTYPE": {"dtype": "fp32"},
            "helper": {"kernel": "1:helper"},
        },
        {
            "1:helper": {
                "name": "helper",
                "source": "def helper(v, low):\n    return tl.maximum(v, low)\n",
                "globals": {"tl": LANG},
            }
        },
    )
    kernel, helper = out["0:k"], out["1:helper"]
    assert kernel.reasons == [] and helper.reasons == []
    assert kernel.constexprs == {"BLOCK", "KIND"} and kernel.calls == {"1:helper"}
    assert kernel_source.source([kernel, helper]) == kernel_source.HEADER + textwrap.dedent(
        """\
        def k0_k(x_ptr, out_ptr, n, BLOCK: tl.constexpr, KIND: tl.constexpr=2):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
            tl.store(out_ptr + offs, k1_helper(x, 0.0), mask=offs < n)

        def k1_helper(v, low):
            return tl.maximum(v, low)
        """
    )


@pytest.mark.parametrize(
    ("body", "globals_", "why"),
    [
        ("x = tl.load(p).__class__", {}, "uses .__class__"),
        ("x = tl.load(p)._handle", {}, "uses ._handle"),
        ("x = tl.load(p).handle.data", {}, "uses .handle of a value"),
        ("x = tl.core.builtins.open", {}, "triton.language.core.builtins is not part of"),
        ("x = tl.core.knobs", {}, "triton.language.core.knobs is not part of"),
        ("x = tl.extra.module_from_spec", {}, "module_from_spec is not part of"),
        ("x = triton.cdiv(4, 2)", {"triton": {"module": "triton"}}, "below triton, only"),
        ("import os", {}, "Import is not allowed"),
        ("global g", {}, "Global is not allowed"),
        ("with tl.load(p) as v:\n    pass", {}, "With is not allowed"),
        ("try:\n    pass\nexcept Exception:\n    pass", {}, "Try is not allowed"),
        ("f = lambda v: v", {}, "Lambda is not allowed"),
        ("x = [v for v in range(3)]", {}, "ListComp is not allowed"),
        ("x = f'{p}'", {}, "JoinedStr is not allowed"),
        ("f = tl.load\nx = f(p)", {}, "calls f (only triton.language"),
        ("x = tl.load(*p)", {}, "calls with *args"),
        ("x = np.maximum(p, 0)", {"np": {"module": "numpy"}}, "module numpy"),
        ("x = helper(p)", {"helper": {"other": "function"}}, "uses helper (function)"),
        ("x = undefined(p)", {}, "uses undefined, which is not defined"),
        ("x = STASH", {"STASH": {"other": "dict"}}, "uses STASH (dict)"),
        ("p.attr = 1", {}, "assigns to p.attr"),
        ("x = p[0]\np[0] = x", {}, "assigns to p[0]"),
        ("tl = 1", {}, "a local named tl"),
        ("x = 'a' * 1000\ny = '" + "a" * 300 + "'", {}, "a string constant of 300"),
    ],
)
def test_the_whitelist_refuses(body, globals_, why):
    source = "def k(p):\n" + textwrap.indent(body, "    ") + "\n"
    kernel = checked(source, {"tl": LANG, **globals_})["0:k"]
    assert any(why in reason for reason in kernel.reasons), kernel.reasons


def test_a_kernel_that_calls_a_refused_one_is_refused_with_it():
    record = {
        "kernels": {
            "0:k": {
                "name": "k",
                "source": "def k(p):\n    h(p)\n",
                "globals": {"h": {"kernel": "1:h"}},
            },
            "1:h": {"name": "h", "source": "def h(p):\n    import os\n", "globals": {}},
        },
        "programs": [],
        "again": [],
    }
    parsed = program.parse(record, [], {})
    assert parsed.kernels["0:k"].reasons == ["kernel k: calls a refused kernel"]


def test_the_instrumented_twin_counts_what_each_statement_does():
    kernel = checked(
        """
        def k(p, n, R: tl.constexpr):
            acc = tl.zeros((16,), dtype=tl.float32)
            for i in range(0, n):
                acc += tl.load(p + i)
            for j in tl.static_range(R):
                acc = acc * 2.0
            while n > 0:
                n = n - 1
            tl.store(p, acc)
        """,
        {"tl": LANG},
    )["0:k"]
    twin = kernel_source.instrument([kernel])
    tree = ast.parse(twin)
    names = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert {
        kernel_source.COUNT,
        kernel_source.LOOP,
        kernel_source.LOOP_END,
        kernel_source.ITERATION,
    } <= names
    assert "__sr_loop('k0_k:1', 'range', 0, n)" in twin, twin
    assert "__sr_loop('k0_k:2', 'static', R)" in twin, twin
    assert "__sr_iteration('k0_k:3')" in twin and "__sr_block(tl.load(p + i))" in twin, twin


INPUT = {
    "inputs": [{"offset": 0, "shape": [4, 4], "dtype": "float32", "nbytes": 64}],
    "outputs": [],
}
VIEW = {"storage": 0, "dtype": "float32", "offset": 0, "shape": [4, 4], "stride": [4, 1]}
KERNEL = {
    "0:k": {
        "name": "k",
        "source": "def k(x, n, B: tl.constexpr):\n    tl.store(x, tl.load(x))\n",
        "globals": {"tl": LANG},
    }
}


def record(storages=None, steps=None, returns=None, kernels=None) -> dict:
    """A record of one signature, whose two calls recorded this one program."""
    call = {
        "storages": storages or [{"kind": "input", "index": 0, "nbytes": 64}],
        "steps": steps or [],
        "returns": returns or {"tensor": VIEW},
    }
    return {"kernels": KERNEL if kernels is None else kernels, "programs": [call], "again": [call]}


def launch(**change) -> dict:
    return {
        "op": "launch",
        "alternatives": [
            {
                "kernel": "0:k",
                "grid": [1],
                "args": {"x": {"tensor": VIEW}, "n": {"value": 16}, "B": {"value": 16}},
                **change,
            }
        ],
    }


@pytest.mark.parametrize(
    ("rec", "why"),
    [
        (
            record(storages=[{"kind": "input", "index": 0, "nbytes": 128}]),
            "holds 64 bytes, not 128",
        ),
        (
            record(storages=[{"kind": "input", "index": 3, "nbytes": 64}]),
            "index must be an integer",
        ),
        (record(storages=[{"kind": "state", "name": "w", "nbytes": 64}]), "'w' is no parameter"),
        (record(storages=[{"kind": "constant", "nbytes": -1}]), "nbytes must be an integer"),
        (
            record(storages=[{"kind": "alloc", "nbytes": 64, "dtype": "object", "fill": None}]),
            "dtype",
        ),
        (record(returns={"tensor": {**VIEW, "shape": [4, 5]}}), "reaches beyond its storage"),
        (record(returns={"tensor": {**VIEW, "offset": -1}}), "offset must be an integer"),
        (record(returns={"tensor": {**VIEW, "shape": [4], "stride": [4, 1]}}), "one length"),
        (record(returns={"module": "os"}), "returns: 'module'"),
        (record(steps=[launch(kernel="9:nope")]), "kernel '9:nope' was not recorded"),
        (record(steps=[launch(grid=[1 << 20, 1 << 20])]), "a grid of"),
        (record(steps=[launch(grid=[])]), "grid must hold 1 to 3 sizes"),
        (record(steps=[launch(args={"y": {"value": 1}})]), "has no parameter ['y']"),
        (record(steps=[launch(args={"B": {"tensor": VIEW}})]), "a tensor for a constexpr"),
        (record(steps=[launch(args={"n": {"value": [1]}})]), "must be a number"),
        (record(steps=[launch(num_warps=0)]), "num_warps must be an integer in [1"),
        (
            record(steps=[{"op": "copy", "dst": VIEW, "src": {**VIEW, "shape": [2, 4]}}]),
            "another size or dtype",
        ),
        (record(steps=[{"op": "fill", "tensor": VIEW, "value": "x"}]), "fill value"),
        (record(steps=[{"op": "exec", "code": "import os"}]), "op 'exec'"),
    ],
)
def test_a_record_that_does_not_fit_its_case_is_refused_naming_the_field(rec, why):
    parsed = program.parse(rec, [INPUT], {})
    assert parsed.programs == [None], parsed
    assert why in parsed.errors[0], parsed.errors


def test_a_record_that_fits_is_a_program():
    parsed = program.parse(record(steps=[launch()]), [INPUT], {})
    (p,) = parsed.programs
    assert parsed.errors == [None] and p.launches == 1 and p.returned == [0]
    assert p.summary() == ["launch k grid (1,) B=16 num_warps=4"]
    assert program.kernels_of(parsed)[0].canonical == "k0_k"


def test_a_record_that_is_no_record_refuses_every_signature():
    for rec in ("not a dict", {"programs": "x"}, {"programs": [1]}):
        parsed = program.parse(rec, [INPUT], {})
        assert parsed.programs == [None] and parsed.errors[0], parsed


def test_what_would_overflow_the_parents_stack_is_refused_not_raised(tmp_path):
    """The record and the sources are the candidate's text: nesting past Python's limits refuses
    that kernel or record; the parent goes on."""
    deep = "def k(p):\n    x = " + "+".join(["p"] * 12000) + "\n"
    (kernel,) = kernel_source.check({"0:k": {"name": "k", "source": deep, "globals": {}}}).values()
    assert kernel.tree is None and "cannot be checked (RecursionError" in kernel.reasons[0]
    nested = {"tensor": VIEW}
    for _ in range(20):
        nested = {"tuple": [nested]}
    parsed = program.parse(record(returns=nested), [INPUT], {})
    assert parsed.programs == [None] and "returns:" in parsed.errors[0]
    from stillroom.kernels import extract

    out = tmp_path / extract.OUT
    data = b"[" * 100_000 + b"]" * 100_000
    out.write_bytes(channel.Report.HEADER.pack(extract.MAGIC, len(data)) + data)
    with open(out, "r+b") as f:
        f.truncate(extract.RECORD_SPACE)
    got, why = extract.read_out(out)
    assert got is None and "RecursionError" in why, why


def test_a_submodule_of_triton_language_is_reached_and_imported_by_the_replay():
    """libdevice (GPU math) is a submodule the parent may not have imported: it resolves, and the
    replay is told to import it; Triton's CPU interpreter cannot run its functions, so tanh is
    stillroom.kernels.libdevice's (test_real_world_styles.py)."""
    kernel = checked(
        "def k(p):\n    tl.store(p, libdevice.tanh(tl.load(p)))\n",
        {"tl": LANG, "libdevice": {"module": "triton.language.extra.libdevice"}},
    )["0:k"]
    assert kernel.reasons == [] and "kt_libdevice_tanh(tl.load(p))" in kernel.text
    assert "triton.language.extra.libdevice" in kernel.modules


@pytest.mark.parametrize(
    "junk",
    [
        {"storages": [["input", 0]]},
        {"storages": [{"kind": "state", "name": ["w"], "nbytes": 64}]},
        {
            "steps": [
                {"op": "launch", "alternatives": [{"kernel": ["0:k"], "grid": [1], "args": {}}]}
            ]
        },
        {"steps": [launch(grid=["1"])]},
        {"steps": [launch(args={"x": {"tensor": "everything"}})]},
        {"steps": [launch(args={"x": [1, 2]})]},
        {"steps": [{"op": "copy", "dst": None, "src": 3}]},
        {"returns": {"tensor": {**VIEW, "shape": "4x4"}}},
        {"returns": [1, 2]},
    ],
)
def test_a_record_of_the_wrong_types_is_refused_never_raised(junk):
    rec = record(**{k: v for k, v in junk.items()})
    parsed = program.parse(rec, [INPUT], {"w": ("float32", [4, 4])})
    assert parsed.programs == [None] and parsed.errors[0], parsed.errors
    junk_kernels = {"0:k": {"name": ["k"], "source": 3, "globals": [1]}, "1:h": "x"}
    parsed = program.parse(record(kernels=junk_kernels, steps=[launch()]), [INPUT], {})
    assert parsed.programs == [None] and parsed.reasons, parsed
