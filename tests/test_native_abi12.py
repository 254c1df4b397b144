"""C ABI 1.2 on this host: several constant tensors packed as one (``prepack_with``), and 1.1
libraries, whose descriptors end before it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pdlkit.runtime_abi.binding import bind
from pdlkit.runtime_abi.prepack import CACHE
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit
from pdlkit.errors import KernelLoadError

INCLUDE = Path(__file__).resolve().parents[1] / "runtime_abi" / "include"
CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (`cc`) on PATH")

# y = x @ (a + b).T: a packed together with b (prepack_with) as [header | a + b].
SOURCE = r"""
#include "pdlkit_abi.h"

static int32_t prepack(pdlkit_prepack_frame* f) {
  const DLTensor* a = f->weight;
  int64_t n = a->shape[0], k = a->shape[1];
#ifndef V11
  if (f->num_with != 1 || f->with[0].shape[0] != n || f->with[0].shape[1] != k)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "b: [N, K] as a");
  const float* b = (const float*)((const char*)f->with[0].data + f->with[0].byte_offset);
#else
  const float* b = NULL;
#endif
  size_t bytes = 16 + (size_t)(n * k) * 4;
  if (!f->packed) { f->packed_size = bytes; return PDLKIT_OK; }
  int64_t* h = (int64_t*)f->packed;
  h[0] = n, h[1] = k;
  float* s = (float*)(h + 2);
  const float* av = (const float*)((const char*)a->data + a->byte_offset);
  for (int64_t i = 0; i < n * k; ++i) s[i] = av[i] + (b ? b[i] : 0.0f);
  return PDLKIT_OK;
}

static int32_t meta(const pdlkit_meta_frame* f) {
  const DLTensor *x = &f->inputs[0], *a = &f->inputs[1];
  f->outputs[0].ndim = 2;
  f->outputs[0].shape[0] = x->shape[0];
  f->outputs[0].shape[1] = a->shape[0];
  f->outputs[0].dtype = x->dtype;
  return PDLKIT_OK;
}

static int32_t run(const pdlkit_call_frame* f) {
  const int64_t* h = (const int64_t*)f->inputs[1].data;
  const float* s = (const float*)(h + 2);
  const float* x = (const float*)f->inputs[0].data;
  float* y = (float*)f->outputs[0].data;
  for (int64_t m = 0; m < f->inputs[0].shape[0]; ++m)
    for (int64_t n = 0; n < h[0]; ++n) {
      float acc = 0.0f;
      for (int64_t j = 0; j < h[1]; ++j) acc += x[m * h[1] + j] * s[n * h[1] + j];
      y[m * h[0] + n] = acc;
    }
  return PDLKIT_OK;
}

static const DLDataType f32[] = {{kDLFloat, 32, 1}};
static const int32_t rank2[] = {2};
static const pdlkit_arg_desc args[] = {
    {sizeof(pdlkit_arg_desc), "x", PDLKIT_KIND_TENSOR, f32, 1, rank2, 1, NULL, NULL, 0, 1, 0, 0},
    {sizeof(pdlkit_arg_desc), "a", PDLKIT_KIND_TENSOR, f32, 1, rank2, 1, NULL, NULL, 0, 1, 0, 0},
    {sizeof(pdlkit_arg_desc), "b", PDLKIT_KIND_TENSOR, f32, 1, rank2, 1, NULL, NULL, 0, 1, 0, 0},
    {sizeof(pdlkit_arg_desc), "scale", PDLKIT_KIND_FLOAT, NULL, 0, NULL, 0, NULL, NULL, 0, 0, 0, 0},
};
#ifndef WITH
#define WITH "b"
#endif
static const char* const with[] = {WITH};
#ifdef V11 /* built against the 1.1 header: the descriptor ends before prepack_with */
#define DESC_SIZE offsetof(pdlkit_kernel_desc, prepack_with)
#else
#define DESC_SIZE sizeof(pdlkit_kernel_desc)
#endif
static const pdlkit_kernel_desc k = {
    DESC_SIZE, NAME, 1, "linear_sum", kDLCPU, 0, args, 4, NULL, 0, 0, 0, 1, meta, run,
    "x @ (a + b).T", "a", prepack, with, 1,
};
static const pdlkit_kernel_desc* const kernels[] = {&k};

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration* out, char* error, size_t error_size) {
  (void)host_minor;
  PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
#ifdef V11
  out->abi_minor = 1;
#endif
  out->kernels = kernels;
  out->num_kernels = 1;
  return PDLKIT_OK;
}
"""


def build(tmp_path: Path, name: str, *flags: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(SOURCE)
    out = tmp_path / f"lib{name}.so"
    defs = [f'-DNAME="{name}"', *flags]
    cmd = [str(CC), "-O1", "-shared", "-fPIC", "-Wall", "-I", str(INCLUDE), *defs, str(src)]
    r = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def test_two_constants_are_packed_as_one_and_repacked_when_either_changes(tmp_path):
    (k,) = load_kernel_file(build(tmp_path, "sum_linear"))
    assert k.prepack_arg == "a" and k.prepack_with == ("b",)
    x, a, b = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3, 7)
    torch.testing.assert_close(k(x, a, b, 1.0), F.linear(x, a + b))  # packed on the fly
    op = bind(k)
    CACHE.clear()
    pdlkit.stats(reset=True)
    for _ in range(2):  # through the bound op: packed once
        torch.testing.assert_close(op(x, a, b, 1.0, 0), F.linear(x, a + b))
    b.mul_(2)  # the packed form is stale: made again from the new b
    torch.testing.assert_close(op(x, a, b, 1.0, 0), F.linear(x, a + b))
    st = pdlkit.stats()
    assert (st["prepack_misses"], st["prepack_hits"]) == (2, 1)


def test_a_library_with_abi_11_descriptors_still_loads(tmp_path):
    """struct_size at the 1.1 layout: the 1.2 fields read as zero (nothing packed with a)."""
    (k,) = load_kernel_file(build(tmp_path, "old_sum_linear", "-DV11"))
    assert k.prepack_arg == "a" and k.prepack_with == ()
    x, a, b = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3, 7)
    torch.testing.assert_close(k(x, k.prepack(a, {}), b, 1.0), F.linear(x, a))


@pytest.mark.parametrize(
    ("with_", "why"),
    [("scale", "'scale' is not a required tensor parameter"), ("a", "'a' is not a required")],
)
def test_prepack_with_naming_no_other_tensor_is_refused_at_load(tmp_path, with_, why):
    lib = build(tmp_path, "bad_with", f'-DWITH="{with_}"')
    with pytest.raises(
        KernelLoadError, match=rf"libbad_with\.so: kernel 'bad_with': prepack_with {why}"
    ):
        load_kernel_file(lib)


def test_a_tensor_changed_in_place_between_calls_gets_a_new_frame(tmp_path):
    """A call site's constants are recognised by identity, version and data pointer between
    calls (runtime_abi/native_frame.py): a tensor resized in place is seen anew."""
    (k,) = load_kernel_file(build(tmp_path, "inplace_linear"))
    a, b = torch.randn(3, 7), torch.randn(3, 7)
    packed = k.prepack(a, {"b": b})
    x = torch.randn(5, 7)
    torch.testing.assert_close(k(x, packed, b, 1.0), F.linear(x, a + b))
    torch.testing.assert_close(k(x, packed, b, 1.0), F.linear(x, a + b))  # x: kept
    x.resize_(2, 7)  # the same object, smaller
    got = k(x, packed, b, 1.0)
    assert got.shape == (2, 3)
    torch.testing.assert_close(got, F.linear(x, a + b))


def test_the_call_site_records_keep_no_tensor_alive(tmp_path):
    import gc
    import weakref

    (k,) = load_kernel_file(build(tmp_path, "weak_linear"))
    a, b = torch.randn(3, 7), torch.randn(3, 7)
    packed = k.prepack(a, {"b": b})
    x = torch.randn(5, 7)
    for _ in range(3):  # x and b the same objects every call: both recognised as constants
        k(x, packed, b, 1.0)
    refs = [weakref.ref(t) for t in (x, b, packed)]
    del x, b, packed
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
