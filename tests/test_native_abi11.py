"""C ABI 1.1 on this host: optional tensor parameters and the pre-pack hook, and 1.0 libraries."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pdlkit.runtime_abi.binding import bind
from pdlkit.runtime_abi.native import PackedWeight
from pdlkit.runtime_abi.prepack import CACHE
from pdlkit.runtime_abi.registry import load_kernel_file

import pdlkit

INCLUDE = Path(__file__).resolve().parents[1] / "runtime_abi" / "include"
CC = shutil.which("cc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (`cc`) on PATH")

# y = x @ w.T (+ bias): w pre-packed as [header | w transposed]; bias optional.
SOURCE = r"""
#include "pdlkit_abi.h"

typedef struct { int64_t n, k; } hdr;

static int32_t prepack(pdlkit_prepack_frame* f) {
  const DLTensor* w = f->weight;
  if (w->ndim != 2 || !pdlkit_dtype_is(w->dtype, kDLFloat, 32))
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "w: [N, K] float32");
  int64_t n = w->shape[0], k = w->shape[1];
#ifdef PAD /* room for N rounded up to panels of 8 columns, as the shipped GEMMs pad theirs */
  size_t bytes = sizeof(hdr) + (size_t)((n + 7) / 8 * 8 * k) * 4;
#else
  size_t bytes = sizeof(hdr) + (size_t)(n * k) * 4;
#endif
  if (!f->packed) { f->packed_size = bytes; return PDLKIT_OK; }
  if ((uintptr_t)f->packed % 64) return pdlkit_error(f->error, f->error_size, PDLKIT_INTERNAL, "unaligned");
  hdr* h = (hdr*)f->packed;
  h->n = n, h->k = k;
  float* t = (float*)(h + 1);
  const float* src = (const float*)((const char*)w->data + w->byte_offset);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) t[j * n + i] = src[i * k + j];
  return PDLKIT_OK;
}

static int32_t meta(const pdlkit_meta_frame* f) {
  const DLTensor *x = &f->inputs[0], *w = &f->inputs[1], *b = &f->inputs[2];
  if (w->ndim != 2 || x->ndim != 2 || x->shape[1] != w->shape[1])  /* the logical weight */
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "shapes");
  if (!pdlkit_is_none(b) && (b->ndim != 1 || b->shape[0] != w->shape[0]))
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "bias");
  f->outputs[0].ndim = 2;
  f->outputs[0].shape[0] = x->shape[0];
  f->outputs[0].shape[1] = w->shape[0];
  f->outputs[0].dtype = x->dtype;
  return PDLKIT_OK;
}

static int32_t run(const pdlkit_call_frame* f) {
  const DLTensor *x = &f->inputs[0], *p = &f->inputs[1], *b = &f->inputs[2];
  if (!pdlkit_dtype_is(p->dtype, kDLUInt, 8) || p->ndim != 1)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "w is not packed");
  const hdr* h = (const hdr*)p->data;
  const float* t = (const float*)(h + 1);
  const float* xs = (const float*)x->data;
  const float* bias = pdlkit_is_none(b) ? NULL : (const float*)b->data;
  float* y = (float*)f->outputs[0].data;
  for (int64_t m = 0; m < x->shape[0]; ++m)
    for (int64_t n = 0; n < h->n; ++n) {
      float s = bias ? bias[n] : 0.0f;
      for (int64_t j = 0; j < h->k; ++j) s += xs[m * h->k + j] * t[j * h->n + n];
      y[m * h->n + n] = s;
    }
  return PDLKIT_OK;
}

static const DLDataType f32[] = {{kDLFloat, 32, 1}};
#ifdef OLD /* a library built against the 1.0 header: its structs end before the 1.1 fields */
typedef struct {
  size_t struct_size; const char* name; int32_t kind; const DLDataType* dtypes; size_t num_dtypes;
  const int32_t* ranks; size_t num_ranks; const int32_t* divisible_dims;
  const int64_t* divisible_by; size_t num_divisible; int32_t contiguous; uint32_t alignment;
} arg10;
static const arg10 args10[] = {
    {sizeof(arg10), "x", PDLKIT_KIND_TENSOR, f32, 1, NULL, 0, NULL, NULL, 0, 1, 0},
    {sizeof(arg10), "w", PDLKIT_KIND_TENSOR, f32, 1, NULL, 0, NULL, NULL, 0, 0, 0},
    {sizeof(arg10), "bias", PDLKIT_KIND_TENSOR, f32, 1, NULL, 0, NULL, NULL, 0, 0, 0},
};
#define ARGS ((const pdlkit_arg_desc*)args10)
#define DESC_SIZE offsetof(pdlkit_kernel_desc, prepack_arg)
#else
static const pdlkit_arg_desc args[] = {
    {sizeof(pdlkit_arg_desc), "x", PDLKIT_KIND_TENSOR, f32, 1, NULL, 0, NULL, NULL, 0, 1, 0, 0},
    {sizeof(pdlkit_arg_desc), "w", PDLKIT_KIND_TENSOR, f32, 1, NULL, 0, NULL, NULL, 0, 0, 0, 0},
    {sizeof(pdlkit_arg_desc), "bias", PDLKIT_KIND_TENSOR, f32, 1, NULL, 0, NULL, NULL, 0, 0, 0, 1},
};
#define ARGS args
#define DESC_SIZE sizeof(pdlkit_kernel_desc)
#endif
static const pdlkit_kernel_desc k = {
    DESC_SIZE, NAME, 1, "linear", kDLCPU, 0, ARGS, 3, NULL, 0, 0, 0, 1, meta, run, "x @ w.T + b",
    "w", prepack,
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


def build(tmp_path: Path, name: str, *flags: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(SOURCE)
    out = tmp_path / f"lib{name}.so"
    defs = [f'-DNAME="{name}"', *flags]
    cmd = [str(CC), "-O1", "-shared", "-fPIC", "-Wall", "-I", str(INCLUDE), *defs, str(src)]
    r = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def test_optional_bias_and_prepacked_weight(tmp_path):
    (k,) = load_kernel_file(build(tmp_path, "packed_linear"))
    assert k.schema == "(Tensor x, Tensor w, Tensor? bias) -> Tensor" and k.prepack_arg == "w"
    x, w, b = torch.randn(5, 7), torch.randn(3, 7), torch.randn(3)
    packed = k.prepack(w, {})
    assert isinstance(packed, PackedWeight) and packed.shape == (3, 7)
    assert packed.data.dtype == torch.uint8 and packed.data.data_ptr() % 64 == 0
    torch.testing.assert_close(k(x, packed, b), F.linear(x, w, b))
    torch.testing.assert_close(k(x, w, None), F.linear(x, w))  # direct call: packed on the fly
    op = bind(k)
    CACHE.clear()
    pdlkit.stats(reset=True)
    for bias in (b, b):  # through the bound op: the weight is packed once
        torch.testing.assert_close(op(x, w, bias, 0), F.linear(x, w, bias))
    torch.testing.assert_close(op(x, w, None, 0), F.linear(x, w))
    st = pdlkit.stats()
    assert (st["prepack_misses"], st["prepack_hits"]) == (2, 1)  # bias=None: another key
    torch.library.opcheck(op, (x, w, None, 0))


def test_weights_packed_to_the_same_size_keep_their_own_output_shapes(tmp_path):
    """Packed bytes of one size (3 and 8 columns, padded to 8) from weights of different
    shapes: each call gets its own weight's output. The CPU call plans were keyed by the
    packed bytes' shape, so the second weight's calls took the first's output shape (seen with
    linear_bf16's 64-column panels at a small GQA Llama's k_proj after its q_proj: a
    KernelCallError from the output check)."""
    (k,) = load_kernel_file(build(tmp_path, "padded_linear", "-DPAD"))
    x, wide, narrow = torch.randn(5, 7), torch.randn(8, 7), torch.randn(3, 7)
    pw, pn = k.prepack(wide, {}), k.prepack(narrow, {})
    assert pw.data.shape == pn.data.shape
    torch.testing.assert_close(k(x, pw, None), F.linear(x, wide))
    torch.testing.assert_close(k(x, pn, None), F.linear(x, narrow))
    torch.testing.assert_close(k(x, pw, None), F.linear(x, wide))


def test_calls_under_inference_mode_run(tmp_path):
    """Tensors made under ``torch.inference_mode()`` keep no version counter (reading it
    raises): a bound op's calls, whose activations and weights are such tensors, still run
    (they failed with "Inference tensors do not track version counter")."""
    (k,) = load_kernel_file(build(tmp_path, "inference_linear"))
    op = bind(k)
    with torch.inference_mode():
        x, w = torch.randn(5, 7), torch.randn(3, 7)
        for _ in range(3):  # the first call packs, the later ones find the site's plan
            torch.testing.assert_close(op(x, w, None, 0), F.linear(x, w))
        x2 = torch.randn(5, 7)  # another activation, the same constant weight
        torch.testing.assert_close(op(x2, w, None, 0), F.linear(x2, w))


def test_a_library_with_abi_10_structs_still_loads(tmp_path):
    """struct_size at the 1.0 layout: the 1.1 fields read as zero (no optional, no prepack)."""
    (k,) = load_kernel_file(build(tmp_path, "old_linear", "-DOLD"))
    assert k.prepack is None and k.schema == "(Tensor x, Tensor w, Tensor bias) -> Tensor"
