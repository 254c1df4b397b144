"""Property-based fuzzing of pdlkit (hypothesis): shared by tests/test_fuzz.py (a bounded
budget in CI) and benchmarks/fuzz.py (a longer run with ``--budget``).

Each ``check_*`` function is one property for one drawn example; it raises on a violation.
"""

from __future__ import annotations

import ctypes
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from pdlkit.runtime_abi.trust import write_pins

import pdlkit
from pdlkit import config

CASES: Counter[str] = Counter()  # examples run per property, for the reports

SHIPPED_CPU_PATTERNS = config.shipped_patterns() / "cpu"
SHIPPED_CPU_KERNEL = config.shipped_kernels() / "cpu" / "linear_epilogue.py"
# the logical ops that file's kernels implement (without them it is refused unchanged)
SHIPPED_OPS = config.shipped_kernels() / "ops" / "logical_ops.py"
PATTERN_FILES = {
    "linear_gelu": "linear_gelu.pdl.mlir",
    "linear_relu": "linear_relu.pdl.mlir",
    "linear": "linear.pdl.mlir",
}


def _tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="pdlkit-fuzz-"))


# -- random graphs of supported ops --------------------------------------------------------------

OPS = ("linear", "linear_nobias", "relu", "gelu", "gelu_tanh", "sigmoid", "tanh", "add", "mul")


class Chain(torch.nn.Module):
    """A chain of ops; ``add`` adds the value from before the previous op (a residual)."""

    def __init__(self, ops: list[str], d: int):
        super().__init__()
        self.ops = ops
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(d, d, bias=op == "linear") for op in ops if op.startswith("linear")
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, skip, i = x, x, 0
        for op in self.ops:
            before = h
            if op.startswith("linear"):
                h = self.layers[i](h)
                i += 1
            elif op == "relu":
                h = torch.relu(h)
            elif op == "gelu":
                h = F.gelu(h)
            elif op == "gelu_tanh":
                h = F.gelu(h, approximate="tanh")
            elif op == "sigmoid":
                h = torch.sigmoid(h)
            elif op == "tanh":
                h = torch.tanh(h)
            elif op == "add":
                h = h + skip
            elif op == "mul":
                h = h * 0.5
            skip = before
        return h


graphs = st.fixed_dictionaries(
    {
        "ops": st.lists(st.sampled_from(OPS), min_size=1, max_size=6),
        "patterns": st.sets(st.sampled_from(sorted(PATTERN_FILES))),
        "shape": st.sampled_from([(3,), (1, 4), (2, 3), (5, 1, 2)]),
        "d": st.sampled_from([4, 8, 16]),
        "seed": st.integers(0, 2**16),
    }
)


def check_graph(ex: dict[str, Any]) -> None:
    """A random chain under a random subset of the shipped CPU patterns computes what eager
    does, and every linear is substituted when the plain linear pattern is loaded."""
    CASES["graphs"] += 1
    torch.manual_seed(ex["seed"])
    model = Chain(ex["ops"], ex["d"]).eval()
    x = torch.randn(*ex["shape"], ex["d"])
    folder = _tmp()
    try:
        for name in ex["patterns"]:
            shutil.copy(SHIPPED_CPU_PATTERNS / PATTERN_FILES[name], folder)
        torch._dynamo.reset()
        pdlkit.stats(reset=True)
        with torch.no_grad():
            got = pdlkit.optimize(model, patterns=folder, default_codegen="eager")(x)
            want = model(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        linears = sum(op.startswith("linear") for op in ex["ops"])
        subs = pdlkit.stats()["substitutions"]
        if "linear" in ex["patterns"]:
            assert subs == linears, f"{subs} substitutions for {linears} linears: {ex}"
        elif not ex["patterns"]:
            assert subs == 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- byte-level corruption -----------------------------------------------------------------------

mutations = st.lists(
    st.tuples(
        st.sampled_from(["set", "insert", "delete", "truncate"]),
        st.floats(0, 1, exclude_max=True),
        st.one_of(st.integers(0, 255), st.sampled_from(b' "%/:0123abcdefz\n')),
    ),
    min_size=1,
    max_size=4,
)


def corrupt(data: bytes, muts: list[tuple[str, float, int]]) -> bytes:
    b = bytearray(data)
    for kind, where, value in muts:
        i = int(where * len(b)) if b else 0
        if kind == "set" and b:
            b[i] = value
        elif kind == "insert":
            b.insert(i, value)
        elif kind == "delete" and b:
            del b[i]
        elif kind == "truncate":
            del b[i:]
    return bytes(b)


class _Net(torch.nn.Module):
    """linear -> relu, linear -> gelu, linear: one site for each shipped CPU pattern."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(F.gelu(self.b(torch.relu(self.a(x)))))


def _expect_clean(path: Path, run: Any, what: str) -> bool:
    """``run()`` either works (True) or raises PdlkitError naming ``path`` (False); anything
    else propagates as a property violation."""
    try:
        run()
        CASES[f"{what}: loaded"] += 1
        return True
    except pdlkit.PdlkitError as e:
        assert str(path) in str(e), f"error does not name {path}: {e}"
        CASES[f"{what}: refused"] += 1
        return False


_CAPTURED: list[Any] = []


def _captured() -> tuple[Any, list[Any], torch.Tensor]:
    """Dynamo's graph of _Net and its example inputs, captured once: each example then only
    loads its files, substitutes and runs (no Dynamo, no Inductor)."""
    if not _CAPTURED:
        torch.manual_seed(0)
        model = _Net().eval()

        def grab(gm: Any, example_inputs: list[Any]) -> Any:
            _CAPTURED.extend([gm, list(example_inputs)])
            return gm.forward

        with torch.no_grad():
            x = torch.randn(2, 8)
            want = model(x)
            torch._dynamo.reset()
            torch.compile(model, backend=grab)(x)
        _CAPTURED.append(want)
    gm, inputs, want = _CAPTURED
    return gm, inputs, want


def _compile_and_compare(**kw: Any) -> None:
    from pdlkit.backend import Options, load_plan, run_pass

    gm, inputs, want = _captured()
    plan = load_plan(Options(**kw))  # raises PdlkitError for bad files
    with torch.no_grad():
        traced, _ = run_pass(gm, inputs, plan)
        got = traced(*inputs)
    got = got[0] if isinstance(got, tuple | list) else got
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def check_pdl_corruption(name: str, muts: list[tuple[str, float, int]]) -> None:
    """A corrupted PDL file: a clean error naming it, or it still loads and the model still
    computes what eager does."""
    CASES["pdl files"] += 1
    folder = _tmp()
    try:
        path = folder / PATTERN_FILES[name]
        path.write_bytes(corrupt((SHIPPED_CPU_PATTERNS / PATTERN_FILES[name]).read_bytes(), muts))
        _expect_clean(path, lambda: _compile_and_compare(patterns=folder), "pdl files")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_manifest_corruption(muts: list[tuple[str, float, int]]) -> None:
    """A corrupted manifest: a clean error naming it, or the (re-read) settings still give
    eager's numbers."""
    CASES["manifests"] += 1
    folder = _tmp()
    try:
        shutil.copytree(SHIPPED_CPU_PATTERNS, folder, dirs_exist_ok=True)
        path = folder / "default.yaml"
        path.write_bytes(corrupt(path.read_bytes(), muts))
        _expect_clean(path, lambda: _compile_and_compare(patterns=folder), "manifests")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check_kernel_corruption(muts: list[tuple[str, float, int]], pinned: bool) -> None:
    """A corrupted kernel file, beside the (intact) file of the ops it implements. Pinned:
    refused, naming it, unless the bytes are unchanged. Unpinned: a clean error naming it, or
    it loads (its code runs: only a pin can tell a changed computation from an intended one,
    so nothing is computed with it here)."""
    what = "kernel files (pinned)" if pinned else "kernel files"
    CASES[what] += 1
    folder = _tmp()
    try:
        path = folder / SHIPPED_CPU_KERNEL.name
        original = SHIPPED_CPU_KERNEL.read_bytes()
        path.write_bytes(original)
        shutil.copy(SHIPPED_OPS, folder)
        if pinned:
            write_pins(folder, [path, folder / SHIPPED_OPS.name])
        data = corrupt(original, muts)
        path.write_bytes(data)
        from pdlkit.backend import Options, load_plan

        loaded = _expect_clean(path, lambda: load_plan(Options(kernels=folder)), what)
        if pinned:
            assert loaded == (data == original), "a changed pinned kernel file was loaded"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- native kernel descriptors -------------------------------------------------------------------


def _mostly(valid: Any, other: Any) -> Any:
    """Valid values most of the time, so that descriptors get past their first field."""
    return st.one_of(valid, valid, valid, other)


text = st.binary(max_size=12)
names = _mostly(st.sampled_from([b"k", b"x", b"weight", b"bias", b"scale"]), text)
args = st.lists(
    st.fixed_dictionaries(
        {
            "name": names,
            "kind": _mostly(st.sampled_from([1, 2, 3, 4, 5, 6]), st.integers(-1, 8)),
            "dtypes": st.lists(
                _mostly(
                    st.sampled_from([(2, 32, 1), (0, 8, 1), (1, 8, 1), (4, 16, 1), (2, 16, 1)]),
                    st.tuples(
                        st.integers(0, 5), st.sampled_from([1, 8, 16, 64, 7]), st.integers(0, 2)
                    ),
                ),
                max_size=3,
            ),
            "ranks": st.lists(_mostly(st.integers(1, 4), st.integers(-3, 9)), max_size=3),
            "divisible": st.lists(
                _mostly(
                    st.tuples(st.integers(-2, 1), st.sampled_from([4, 16, 64])),
                    st.tuples(st.integers(-4, 4), st.integers(-2, 64)),
                ),
                max_size=2,
            ),
            "contiguous": st.integers(0, 2),
            "alignment": _mostly(st.sampled_from([0, 16, 64]), st.sampled_from([1, 3, 2**31])),
            "struct_size": _mostly(st.none(), st.sampled_from([0, 8, 10**9])),
        }
    ),
    max_size=4,
    unique_by=lambda a: a["name"],
)
descriptors = st.fixed_dictionaries(
    {
        "name": _mostly(st.sampled_from([b"fuzz_k", b"gemm", b"k1"]), text),
        "op": _mostly(st.sampled_from([b"linear", b"qlinear.relu"]), text),
        "version": _mostly(st.integers(1, 3), st.integers(-2, 0)),
        "device_type": _mostly(st.just(1), st.integers(-1, 3)),
        "priority": st.integers(-5, 5),
        "args": args,
        "isa": st.lists(
            _mostly(st.sampled_from([b"avx2", b"i8mm", b"avx512_vnni"]), text), max_size=3
        ),
        "workspace": st.sampled_from([0, 64, 2**40]),
        "traits": _mostly(st.integers(0, 7), st.integers(0, 2**64 - 1)),
        "num_outputs": _mostly(st.integers(1, 2), st.integers(-1, 70)),
        "struct_size": _mostly(st.none(), st.sampled_from([0, 8, 10**9])),
    }
)


def _build_descriptor(d: dict[str, Any], keep: list[Any]) -> int:
    from pdlkit.runtime_abi import native_abi as nat

    def cstr(b: bytes) -> Any:
        buf = ctypes.create_string_buffer(b)
        keep.append(buf)
        return ctypes.cast(buf, ctypes.c_char_p)

    arg_structs = (nat.ArgDesc * max(1, len(d["args"])))()
    keep.append(arg_structs)
    for i, a in enumerate(d["args"]):
        s = arg_structs[i]
        size = a["struct_size"]
        s.struct_size = ctypes.sizeof(nat.ArgDesc) if size is None else size
        s.name, s.kind = cstr(a["name"]), a["kind"]
        dts = (nat.DLDataType * max(1, len(a["dtypes"])))(
            *[nat.DLDataType(*t) for t in a["dtypes"]]
        )
        ranks = (ctypes.c_int32 * max(1, len(a["ranks"])))(*a["ranks"])
        dims = (ctypes.c_int32 * max(1, len(a["divisible"])))(*[x for x, _ in a["divisible"]])
        by = (ctypes.c_int64 * max(1, len(a["divisible"])))(*[y for _, y in a["divisible"]])
        keep.extend([dts, ranks, dims, by])
        s.dtypes, s.num_dtypes = dts, len(a["dtypes"])
        s.ranks, s.num_ranks = ranks, len(a["ranks"])
        s.divisible_dims, s.divisible_by, s.num_divisible = dims, by, len(a["divisible"])
        s.contiguous, s.alignment = a["contiguous"], a["alignment"]
    isa = (ctypes.c_char_p * max(1, len(d["isa"])))(*[cstr(t) for t in d["isa"]])
    keep.append(isa)
    fn = nat._META_FN(lambda frame: 0)  # never called while loading
    keep.append(fn)
    k = nat.KernelDesc()
    keep.append(k)
    size = d["struct_size"]
    k.struct_size = ctypes.sizeof(nat.KernelDesc) if size is None else size
    k.name, k.op, k.version = cstr(d["name"]), cstr(d["op"]), d["version"]
    k.device_type, k.priority = d["device_type"], d["priority"]
    k.args = ctypes.addressof(arg_structs) if d["args"] else None
    k.num_args = len(d["args"])
    k.isa, k.num_isa = isa, len(d["isa"])
    k.workspace_size, k.traits, k.num_outputs = (
        d["workspace"],
        d["traits"],
        max(0, d["num_outputs"]),
    )
    k.meta = k.run = ctypes.cast(fn, ctypes.c_void_p)
    k.doc = cstr(b"fuzzed")
    return ctypes.addressof(k)


def check_descriptor(d: dict[str, Any]) -> None:
    """A native kernel descriptor with random fields is validated into a kernel or refused
    with a KernelLoadError naming the library, as ``load_native_library`` reports it."""
    from pdlkit.runtime_abi.native_desc import read_descriptor
    from pdlkit.runtime_abi.native_load import declare_spec
    from pdlkit.runtime_abi.registry import KernelLoadError

    CASES["native descriptors"] += 1
    keep: list[Any] = []
    path = Path("/fuzz/libfuzzed.so")
    addr = _build_descriptor(d, keep)
    try:
        declare_spec(path, "0" * 64, read_descriptor(path, addr, 0, 0))
        CASES["native descriptors: loaded"] += 1
    except KernelLoadError as e:
        assert str(path) in str(e), f"error does not name the library: {e}"
        CASES["native descriptors: refused"] += 1
