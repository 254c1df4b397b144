"""Native kernels through the C ABI: the header, the ctypes loader, the VNNI int8 GEMM."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import VNNI
from pdlkit.runtime_abi import native
from pdlkit.runtime_abi.binding import bind
from pdlkit.runtime_abi.kernel import KernelUnsupported
from pdlkit.runtime_abi.registry import KernelLoadError, KernelRegistry, load_kernel_file

import pdlkit

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "runtime_abi" / "include"
GEMM_SRC = ROOT / "kernels" / "x86" / "vnni_int8_gemm.c"
PATTERNS = ROOT / "examples" / "native_int_mm"
CC = shutil.which("cc")

needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (`cc`) on PATH")
needs_vnni = pytest.mark.skipif(
    CC is None or not VNNI,
    reason="needs `cc` and a CPU with AVX-512 VNNI (the int8 GEMM kernel runs only there)",
)


def build(src: Path | str, out: Path, *flags: str, opt: str = "-O1") -> Path:
    """Compile C source (a path, or the text itself) into the shared library ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(src, str):
        path = out.with_suffix(".c")
        path.write_text(src)
        src = path
    cmd = [str(CC), opt, "-shared", "-fPIC", "-Wall", "-I", str(INCLUDE), *flags, str(src)]
    r = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def gemm_dir(tmp_path_factory) -> Path:
    """A kernel folder holding the shipped kernel, built with its documented command."""
    folder = tmp_path_factory.mktemp("x86")
    build(GEMM_SRC, folder / "libvnni_int8_gemm.so", opt="-O3")
    return folder


def int8(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)


# -- the header ---------------------------------------------------------------------------------


@needs_cc
@pytest.mark.parametrize("lang", ["c", "c++"])
def test_header_is_self_contained(tmp_path, lang):
    compiler = CC if lang == "c" else shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "h.c"
    src.write_text('#include "pdlkit_abi.h"\nint f(const DLTensor* t) { return t->ndim; }\n')
    strict = ["-fsyntax-only", "-Wall", "-Wextra", "-Werror"]
    cmd = [compiler, "-x", lang, *strict, "-I", str(INCLUDE), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_struct_layouts_and_dtype_codes_match_dlpack():
    """Our DLTensor mirror reads torch's own DLPack export: same layout, same dtype codes."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    for (code, bits), dtype in native._DTYPES.items():
        t = torch.zeros(2, 3, dtype=dtype)
        dl = native.DLTensor.from_address(get(torch.utils.dlpack.to_dlpack(t), b"dltensor"))
        assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (code, bits, 1), dtype
        assert (dl.ndim, dl.shape[0], dl.shape[1], dl.device.device_type) == (2, 2, 3, 1)


# -- (a) the VNNI int8 GEMM through the registry ---------------------------------------------


@needs_vnni
def test_vnni_gemm_matches_int_mm_exactly(gemm_dir):
    reg = KernelRegistry.from_folders([gemm_dir])
    k = reg.get("vnni_int8_gemm")
    assert k is not None and [d.name for d in reg.for_op("int_mm")] == ["vnni_int8_gemm"]
    assert k.schema == "(Tensor a, Tensor b) -> Tensor"
    assert k.requires == {"avx512f", "avx512_vnni"} and k.device == "cpu"
    assert k.dtypes == {"a": (torch.int8,), "b": (torch.int8,)}
    assert k.shapes["a"].rank == (2,) and k.workspace > 0 and "deterministic" in k.traits
    assert k.source == f"{gemm_dir / 'libvnni_int8_gemm.so'}:vnni_int8_gemm"
    shapes = [(1, 1, 1), (1, 7, 3), (5, 1, 9), (3, 7, 3), (17, 33, 8), (1, 600, 70)]
    shapes += [(64, 128, 256), (33, 1030, 131), (0, 4, 3), (2, 0, 5)]
    for m, kk, n in shapes:
        a, b = int8(m, kk), int8(kk, n, seed=1)
        assert torch.equal(k(a, b), torch._int_mm(a, b)), (m, kk, n)
    extreme = torch.full((3, 9), -128, dtype=torch.int8)
    assert torch.equal(k(extreme, extreme.t().contiguous()), torch._int_mm(extreme, extreme.t()))
    torch.library.opcheck(bind(k), (int8(5, 7), int8(7, 3), 0))


@needs_vnni
def test_vnni_gemm_errors_name_kernel_and_status(gemm_dir):
    k = KernelRegistry.from_folders([gemm_dir]).get("vnni_int8_gemm")
    with pytest.raises(
        RuntimeError, match=r"vnni_int8_gemm: meta: INVALID_ARGUMENT: .*inner sizes"
    ):
        k(int8(2, 4), int8(3, 2))
    with pytest.raises(KernelUnsupported, match="b is not contiguous"):
        k(int8(2, 4), int8(3, 4).t())


@needs_vnni
def test_repeated_calls_pass_their_own_tensors(gemm_dir):
    """A CPU call's frame is made once per thread and call shape; every later call must
    still hand the kernel its own inputs, strides and a fresh output."""
    k = KernelRegistry.from_folders([gemm_dir]).get("vnni_int8_gemm")
    a, b = int8(5, 7), int8(7, 3, seed=1)
    first = k(a, b)
    for seed in (2, 3, 4):
        a2 = int8(5, 7, seed=seed)
        out = k(a2, b)
        assert out.data_ptr() != first.data_ptr()
        assert torch.equal(out, torch._int_mm(a2, b))
    assert torch.equal(first, torch._int_mm(a, b))  # not written by the later calls
    with pytest.raises(KernelUnsupported, match="b is not contiguous"):
        k(a, int8(3, 7, seed=1).t())  # b's shape again, other strides: a frame of its own


@needs_vnni
def test_calls_from_several_threads_do_not_share_a_frame(gemm_dir):
    from concurrent.futures import ThreadPoolExecutor

    k = KernelRegistry.from_folders([gemm_dir]).get("vnni_int8_gemm")
    b = int8(64, 32, seed=1)

    def work(seed: int) -> bool:
        a = int8(48, 64, seed=seed)
        want = torch._int_mm(a, b)
        return all(torch.equal(k(a, b), want) for _ in range(50))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(8)))


# -- (b) end to end from the pattern, no change to pdlkit ------------------------------------


@needs_vnni
def test_pattern_substitutes_the_native_kernel_end_to_end(tmp_path, gemm_dir):
    patterns = tmp_path / "patterns"
    patterns.mkdir()
    for f in ("int_mm.pdl.mlir", "default.yaml"):
        shutil.copy(PATTERNS / f, patterns / f)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch._int_mm(a, b) + 1

    pdlkit.stats(reset=True)
    fast = pdlkit.optimize(fn, patterns=patterns, kernels=gemm_dir)
    with torch.no_grad():
        for m in (4, 1, 9):  # the second shape recompiles with a symbolic M
            a, b = int8(m, 37), int8(37, 20, seed=2)
            assert torch.equal(fast(a, b), fn(a, b))
    st = pdlkit.stats()["by_kernel"]["vnni_int8_gemm"]
    assert st["kernel_calls"] == 3 and st["fallbacks"] == 0 and st["substitutions"] >= 1


# -- (d) UNSUPPORTED falls back per call --------------------------------------------------------


@needs_vnni
def test_unsupported_status_falls_back_to_the_replaced_subgraph(tmp_path, gemm_dir):
    def fn(a: torch.Tensor, bt: torch.Tensor) -> torch.Tensor:
        return torch._int_mm(a, bt.t())  # b reaches the kernel transposed: not contiguous

    pdlkit.stats(reset=True)
    fast = pdlkit.optimize(fn, patterns=PATTERNS, kernels=gemm_dir)
    with torch.no_grad():
        a, bt = int8(4, 24), int8(6, 24, seed=3)
        assert torch.equal(fast(a, bt), fn(a, bt))
    st = pdlkit.stats()
    assert st["fallbacks"] == 1 and st["by_kernel"]["vnni_int8_gemm"]["kernel_calls"] == 0


# -- (c) bad libraries: clear errors naming the file, no crash -------------------------------

# A float32 copy kernel whose descriptor the -D flags bend.
TEMPLATE = r"""
#include <string.h>
#include "pdlkit_abi.h"
#ifndef DTYPE_CODE
#define DTYPE_CODE kDLFloat
#endif
#ifndef ISA
#define ISA "avx2"
#endif
#ifndef NAME
#define NAME "copy_f32"
#endif

static int32_t meta(const pdlkit_meta_frame* f) {
  const DLTensor* x = &f->inputs[0];
  DLTensor* y = &f->outputs[0];
  y->ndim = x->ndim;
  for (int32_t i = 0; i < x->ndim; ++i) y->shape[i] = x->shape[i];
  y->dtype = x->dtype;
  return PDLKIT_OK;
}

static int32_t run(const pdlkit_call_frame* f) {
  const DLTensor* x = &f->inputs[0];
  if (!pdlkit_is_contiguous(x))
    return pdlkit_error(f->error, f->error_size, PDLKIT_UNSUPPORTED, "x is not contiguous");
  int64_t n = 1;
  for (int32_t i = 0; i < x->ndim; ++i) n *= x->shape[i];
  memcpy(f->outputs[0].data, (const char*)x->data + x->byte_offset, (size_t)n * 4);
  return PDLKIT_OK;
}

static const DLDataType dtypes[] = {{DTYPE_CODE, 32, 1}};
static const pdlkit_arg_desc args[] = {
    {sizeof(pdlkit_arg_desc), "x", PDLKIT_KIND_TENSOR, dtypes, 1, NULL, 0, NULL, NULL, 0, 0, 0},
};
static const char* const isa[] = {ISA};
static const pdlkit_kernel_desc copy = {
    sizeof(pdlkit_kernel_desc), NAME, 1, "copy", kDLCPU, 0, args, 1, isa, 1, 0,
    PDLKIT_TRAIT_DETERMINISTIC, 1, meta, run, "copies x",
};
#ifdef TWICE
static const pdlkit_kernel_desc* const kernels[] = {&copy, &copy};
#else
static const pdlkit_kernel_desc* const kernels[] = {&copy};
#endif

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration* out, char* error, size_t error_size) {
  (void)host_minor;
#ifdef LIB_MAJOR  /* pretend to be built against another header version */
  out->abi_major = LIB_MAJOR;
  out->abi_minor = LIB_MINOR;
  if (host_major != LIB_MAJOR)
    return pdlkit_error(error, error_size, PDLKIT_UNSUPPORTED, "needs ABI %d", LIB_MAJOR);
#else
  PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
#endif
  out->kernels = kernels;
  out->num_kernels = sizeof(kernels) / sizeof(kernels[0]);
  return PDLKIT_OK;
}
"""


@needs_cc
def test_a_good_library_loads_and_a_newer_minor_is_accepted(tmp_path):
    lib = build(TEMPLATE, tmp_path / "libcopy.so", "-DLIB_MAJOR=1", "-DLIB_MINOR=7")
    (k,) = load_kernel_file(lib)
    x = torch.randn(3, 5)
    assert k.op == "copy" and k.dtypes == {"x": (torch.float32,)} and k.doc == "copies x"
    assert torch.equal(k(x), x)
    with pytest.raises(KernelUnsupported, match="x is not contiguous"):
        k(x.t())


@needs_cc
@pytest.mark.parametrize(
    ("source", "flags", "message"),
    [
        (
            "int nothing_here(void) { return 0; }\n",
            (),
            r"not a pdlkit kernel library: it exports no `pdlkit_register` symbol",
        ),
        (
            TEMPLATE,
            ("-DLIB_MAJOR=2", "-DLIB_MINOR=3"),
            r"built for pdlkit ABI 2\.3, but this pdlkit speaks ABI 1\.2",
        ),
        (
            TEMPLATE,
            ("-DDTYPE_CODE=99",),
            r"kernel 'copy_f32': argument 'x': unknown dtype \(code=99, bits=32, lanes=1\)",
        ),
        (
            TEMPLATE,
            ('-DISA="avx9000"',),
            r"kernel 'copy_f32': unknown ISA feature\(s\) \['avx9000'\]; known: .*avx512_vnni",
        ),
        (
            TEMPLATE,
            ("-DTWICE",),
            r"kernel 'copy_f32' version 1 is declared twice",
        ),
        (
            TEMPLATE,
            ('-DNAME="not an identifier"',),
            r"kernel name 'not an identifier' is not an identifier",
        ),
    ],
    ids=["no-symbol", "abi-major", "dtype", "isa", "duplicate", "bad-name"],
)
def test_bad_libraries_are_refused_with_the_file_named(tmp_path, source, flags, message):
    lib = build(source, tmp_path / "kernels" / "libbad.so", *flags)
    with pytest.raises(KernelLoadError, match=rf"^{re.escape(str(lib))}[: ].*{message}"):
        KernelRegistry.from_folders([lib.parent])


@needs_cc
def test_same_kernel_in_two_libraries_and_garbage_do_not_corrupt_others(tmp_path):
    one = build(TEMPLATE, tmp_path / "k" / "libone.so")
    build(TEMPLATE, tmp_path / "k" / "libtwo.so", "-DLIB_MAJOR=1", "-DLIB_MINOR=0")
    with pytest.raises(
        KernelLoadError,
        match=rf"libtwo\.so:copy_f32: kernel 'copy_f32' version 1 is already declared at "
        rf"{re.escape(str(one))}:copy_f32",
    ):
        KernelRegistry.from_folders([tmp_path / "k"])
    junk = tmp_path / "junk" / "libjunk.so"
    junk.parent.mkdir()
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(KernelLoadError, match=rf"^{re.escape(str(junk))}: cannot load the shared"):
        KernelRegistry.from_folders([junk.parent])
    # the good library is still loadable and callable after all of that
    (k,) = KernelRegistry.from_folders([one]).kernels.values()
    x = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(k(x), x)


@needs_cc
def test_a_rebuilt_library_at_the_same_path_is_reloaded(tmp_path):
    lib = tmp_path / "libcopy.so"
    build(TEMPLATE, lib, '-DNAME="first"')
    assert [k.name for k in load_kernel_file(lib)] == ["first"]
    build(TEMPLATE, lib, '-DNAME="second"')
    assert [k.name for k in load_kernel_file(lib)] == ["second"]


ATTRS = r"""
#include <string.h>
#include "pdlkit_abi.h"

/* y = x * alpha + n (float32), z = dims (int64); mode must be "add". */
static int32_t check(const pdlkit_attribute* const* attrs, size_t n, char* e, size_t es) {
  for (size_t i = 1; i < n; ++i)
    if (strcmp(attrs[i - 1]->name, attrs[i]->name) >= 0)
      return pdlkit_error(e, es, PDLKIT_INVALID_ARGUMENT, "attributes not sorted");
  return PDLKIT_OK;
}

static int32_t meta(const pdlkit_meta_frame* f) {
  int32_t st = check(f->attrs, f->num_attrs, f->error, f->error_size);
  if (st) return st;
  const DLTensor* x = &f->inputs[0];
  DLTensor* y = &f->outputs[0];
  DLTensor* z = &f->outputs[1];
  y->ndim = x->ndim;
  for (int32_t i = 0; i < x->ndim; ++i) y->shape[i] = x->shape[i];
  y->dtype = x->dtype;
  z->ndim = 1;
  z->shape[0] = (int64_t)pdlkit_find_attr(f->attrs, f->num_attrs, "dims")->num_ints;
  z->dtype.code = kDLInt; z->dtype.bits = 64; z->dtype.lanes = 1;
  return PDLKIT_OK;
}

static int32_t run(const pdlkit_call_frame* f) {
  int32_t st = check(f->attrs, f->num_attrs, f->error, f->error_size);
  if (st) return st;
  const pdlkit_attribute* mode = pdlkit_find_attr(f->attrs, f->num_attrs, "mode");
  if (strcmp(mode->s, "add") != 0)
    return pdlkit_error(f->error, f->error_size, PDLKIT_UNSUPPORTED, "mode %s", mode->s);
  double alpha = pdlkit_find_attr(f->attrs, f->num_attrs, "alpha")->f;
  int64_t n = pdlkit_find_attr(f->attrs, f->num_attrs, "n")->i;
  const pdlkit_attribute* dims = pdlkit_find_attr(f->attrs, f->num_attrs, "dims");
  const DLTensor* x = &f->inputs[0];
  int64_t count = 1;
  for (int32_t i = 0; i < x->ndim; ++i) count *= x->shape[i];
  const float* src = (const float*)x->data;
  float* y = (float*)f->outputs[0].data;
  for (int64_t i = 0; i < count; ++i) y[i] = (float)(src[i] * alpha + (double)n);
  memcpy(f->outputs[1].data, dims->ints, dims->num_ints * sizeof(int64_t));
  if (f->workspace_size != 256 || ((uintptr_t)f->workspace & 63))
    return pdlkit_error(f->error, f->error_size, PDLKIT_INTERNAL, "bad workspace");
  return PDLKIT_OK;
}

static const DLDataType f32[] = {{kDLFloat, 32, 1}};
#define ARG(name, kind) {sizeof(pdlkit_arg_desc), name, kind, NULL, 0, NULL, 0, NULL, NULL, 0, 0, 0}
static const pdlkit_arg_desc args[] = {
    {sizeof(pdlkit_arg_desc), "x", PDLKIT_KIND_TENSOR, f32, 1, NULL, 0, NULL, NULL, 0, 1, 16},
    ARG("n", PDLKIT_KIND_INT), ARG("alpha", PDLKIT_KIND_FLOAT),
    ARG("mode", PDLKIT_KIND_STRING), ARG("dims", PDLKIT_KIND_INT_LIST),
};
static const pdlkit_kernel_desc k = {
    sizeof(pdlkit_kernel_desc), "scale_and_dims", 3, "scale", kDLCPU, 7, args, 5, NULL, 0, 256,
    0, 2, meta, run, NULL,
};
static const pdlkit_kernel_desc* const kernels[] = {&k};

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration* out, char* error, size_t error_size) {
  (void)host_minor;
  PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
  out->kernels = kernels;
  out->num_kernels = 1;
  return PDLKIT_OK;
}
"""


@needs_cc
def test_attributes_several_outputs_and_workspace(tmp_path):
    (k,) = load_kernel_file(build(ATTRS, tmp_path / "libattrs.so"))
    assert (
        k.schema == "(Tensor x, SymInt n, float alpha, str mode, SymInt[] dims) -> (Tensor, Tensor)"
    )
    assert (k.version, k.priority, k.workspace) == (3, 7, 256)
    assert k.shapes["x"].contiguous and k.shapes["x"].align == 16
    x = torch.randn(2, 3)
    y, z = k(x, 4, 0.5, "add", [7, -1, 9])
    torch.testing.assert_close(y, x * 0.5 + 4)
    assert z.tolist() == [7, -1, 9] and z.dtype == torch.int64
    y2, z2 = k(x, n=1, alpha=2.0, mode="add", dims=[])  # keywords, an empty list
    torch.testing.assert_close(y2, x * 2 + 1)
    assert z2.shape == (0,)
    with pytest.raises(KernelUnsupported, match="mode mul"):
        k(x, 1, 1.0, "mul", [1])
    torch.library.opcheck(bind(k), (x, 4, 0.5, "add", [7, -1, 9], 0))
