/*
 * vnni_int8_gemm: C[M,N] int32 = A[M,K] int8 @ B[K,N] int8 with AVX-512 VNNI, the semantics
 * of torch._int_mm(a, b), as a pdlkit native kernel (logical op "int_mm").
 *
 * Build (from the repository root; see kernels/x86/README.md):
 *
 *   cc -O3 -shared -fPIC -I runtime_abi/include kernels/x86/vnni_int8_gemm.c \
 *      -o kernels/x86/libvnni_int8_gemm.so
 *
 * No -mavx512* flags on purpose: only the compute functions are compiled for AVX-512 (the
 * `target` attributes below), so loading the library, registering and meta() are safe on
 * any x86-64 CPU, and run() declines (PDLKIT_UNSUPPORTED) where VNNI is missing rather than
 * dying of SIGILL when a plan was made for a named target.
 *
 * Method. _mm512_dpbusd_epi32 multiplies unsigned bytes by signed bytes. A is signed, so
 * it is fed as A + 128 (flip the sign bit: a ^ 0x80 == a + 128 as u8) and the extra
 * 128 * sum_k B[k,n] is subtracted per column. The arithmetic wraps modulo 2^32 like
 * torch's int32 accumulation, so the result is exact.
 *
 * Blocking. B is packed per (NC columns x KC rows) block into the workspace in VNNI order
 * (bp[k/4][n][k%4], zero padded to a multiple of 4 rows and NC columns) together with the
 * block's column sums; every row of A then streams over the packed block, MR rows at a time
 * with MR x 4 zmm accumulators. Any M, N, K works: K % 4 is a zero-padded tail, N % 64 a
 * masked store, M % 4 a narrower micro-kernel. Single-threaded.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "pdlkit_abi.h"

enum { KC = 512, NC = 64, MR = 4 };
#define WORKSPACE_BYTES ((size_t)KC * NC + NC * sizeof(int32_t))

#define AVX512_VNNI __attribute__((target("avx512f,avx512vnni")))

/* Pack B[k0:k0+kc, n0:n0+nc] (row stride ldb) into bp, and its column sums into colsum. */
static void pack_b(const int8_t* b, int64_t ldb, int64_t kc, int64_t nc, int8_t* bp,
                   int32_t* colsum) {
  int64_t groups = (kc + 3) / 4;
  memset(bp, 0, (size_t)(groups * NC * 4));
  memset(colsum, 0, NC * sizeof(int32_t));
  for (int64_t k = 0; k < kc; ++k) {
    const int8_t* row = b + k * ldb;
    int8_t* dst = bp + (k / 4) * NC * 4 + (k % 4);
    for (int64_t n = 0; n < nc; ++n) {
      dst[n * 4] = row[n];
      colsum[n] += row[n];
    }
  }
}

/* Four bytes of A as the unsigned operand: A + 128, zero-padded past kc (times B's zero
 * padding that contributes nothing). */
static inline uint32_t a_quad(const int8_t* a, int64_t k, int64_t kc) {
  uint32_t q = 0;
  if (k + 4 <= kc) {
    memcpy(&q, a + k, 4);
  } else {
    memcpy(&q, a + k, (size_t)(kc - k));
  }
  return q ^ 0x80808080u;
}

static inline __mmask16 column_mask(int64_t left) {
  if (left >= 16) return (__mmask16)0xFFFF;
  if (left <= 0) return 0;
  return (__mmask16)((1u << left) - 1u);
}

/* mr rows of C[:, n0:n0+nc] (+)= A-rows @ packed block. mr is a constant at every call. */
static inline __attribute__((always_inline)) AVX512_VNNI void micro_kernel(
    int mr, const int8_t* a, int64_t lda, int64_t kc, const int8_t* bp, const int32_t* colsum,
    int32_t* c, int64_t ldc, int64_t nc, int accumulate) {
  __m512i acc[MR][4];
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_si512();
  for (int64_t k = 0; k < kc; k += 4) {
    const int8_t* panel = bp + (k / 4) * NC * 4;
    __m512i b0 = _mm512_loadu_si512((const void*)(panel + 0));
    __m512i b1 = _mm512_loadu_si512((const void*)(panel + 64));
    __m512i b2 = _mm512_loadu_si512((const void*)(panel + 128));
    __m512i b3 = _mm512_loadu_si512((const void*)(panel + 192));
    for (int r = 0; r < mr; ++r) {
      __m512i av = _mm512_set1_epi32((int)a_quad(a + r * lda, k, kc));
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], av, b1);
      acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], av, b2);
      acc[r][3] = _mm512_dpbusd_epi32(acc[r][3], av, b3);
    }
  }
  for (int j = 0; j < 4; ++j) {
    __mmask16 m = column_mask(nc - 16 * j);
    if (!m) break;
    __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void*)(colsum + 16 * j)), 7);
    for (int r = 0; r < mr; ++r) {
      int32_t* dst = c + r * ldc + 16 * j;
      __m512i v = _mm512_sub_epi32(acc[r][j], corr);
      if (accumulate) v = _mm512_add_epi32(v, _mm512_maskz_loadu_epi32(m, dst));
      _mm512_mask_storeu_epi32(dst, m, v);
    }
  }
}

static AVX512_VNNI void gemm(const int8_t* a, const int8_t* b, int32_t* c, int64_t m,
                             int64_t n, int64_t k, void* workspace) {
  int8_t* bp = (int8_t*)workspace;
  int32_t* colsum = (int32_t*)(bp + (size_t)KC * NC);
  if (k == 0) {
    if (m * n > 0) memset(c, 0, (size_t)(m * n) * sizeof(int32_t));
    return;
  }
  for (int64_t n0 = 0; n0 < n; n0 += NC) {
    int64_t nc = n - n0 < NC ? n - n0 : NC;
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
      int64_t kc = k - k0 < KC ? k - k0 : KC;
      pack_b(b + k0 * n + n0, n, kc, nc, bp, colsum);
      int accumulate = k0 > 0;
      for (int64_t m0 = 0; m0 < m; m0 += MR) {
        const int8_t* ar = a + m0 * k + k0;
        int32_t* cr = c + m0 * n + n0;
        switch (m - m0 < MR ? m - m0 : MR) {
          case 4: micro_kernel(4, ar, k, kc, bp, colsum, cr, n, nc, accumulate); break;
          case 3: micro_kernel(3, ar, k, kc, bp, colsum, cr, n, nc, accumulate); break;
          case 2: micro_kernel(2, ar, k, kc, bp, colsum, cr, n, nc, accumulate); break;
          default: micro_kernel(1, ar, k, kc, bp, colsum, cr, n, nc, accumulate); break;
        }
      }
    }
  }
}

/* ---- the pdlkit contract ------------------------------------------------------------ */

static int32_t check_operands(const DLTensor* a, const DLTensor* b, char* error,
                              size_t error_size) {
  if (a->ndim != 2 || b->ndim != 2)
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                        "a and b must be 2-D, got %d-D and %d-D", (int)a->ndim, (int)b->ndim);
  if (!pdlkit_dtype_is(a->dtype, kDLInt, 8) || !pdlkit_dtype_is(b->dtype, kDLInt, 8))
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT, "a and b must be int8");
  if (a->shape[1] != b->shape[0])
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                        "a is [%lld, %lld] and b is [%lld, %lld]: inner sizes differ",
                        (long long)a->shape[0], (long long)a->shape[1],
                        (long long)b->shape[0], (long long)b->shape[1]);
  return PDLKIT_OK;
}

static int32_t int_mm_meta(const pdlkit_meta_frame* f) {
  if (f->num_inputs != 2 || f->num_outputs != 1 || f->max_ndim < 2)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT,
                        "expects 2 inputs and 1 output");
  const DLTensor* a = &f->inputs[0];
  const DLTensor* b = &f->inputs[1];
  int32_t st = check_operands(a, b, f->error, f->error_size);
  if (st != PDLKIT_OK) return st;
  DLTensor* out = &f->outputs[0];
  out->ndim = 2;
  out->shape[0] = a->shape[0];
  out->shape[1] = b->shape[1];
  out->dtype.code = kDLInt;
  out->dtype.bits = 32;
  out->dtype.lanes = 1;
  return PDLKIT_OK;
}

static int32_t int_mm_run(const pdlkit_call_frame* f) {
  if (f->num_inputs != 2 || f->num_outputs != 1)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT,
                        "expects 2 inputs and 1 output");
  const DLTensor* a = &f->inputs[0];
  const DLTensor* b = &f->inputs[1];
  DLTensor* c = &f->outputs[0];
  int32_t st = check_operands(a, b, f->error, f->error_size);
  if (st != PDLKIT_OK) return st;
  if (c->ndim != 2 || c->shape[0] != a->shape[0] || c->shape[1] != b->shape[1] ||
      !pdlkit_dtype_is(c->dtype, kDLInt, 32) || !pdlkit_is_contiguous(c))
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT,
                        "output must be a contiguous [M, N] int32 tensor");
  if (a->device.device_type != kDLCPU || b->device.device_type != kDLCPU)
    return pdlkit_error(f->error, f->error_size, PDLKIT_UNSUPPORTED, "CPU tensors only");
  if (!pdlkit_is_contiguous(a) || !pdlkit_is_contiguous(b))
    return pdlkit_error(f->error, f->error_size, PDLKIT_UNSUPPORTED,
                        "%s is not contiguous", pdlkit_is_contiguous(a) ? "b" : "a");
  if (f->workspace == NULL || f->workspace_size < WORKSPACE_BYTES)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT,
                        "workspace of %zu bytes, needs %zu", f->workspace_size,
                        (size_t)WORKSPACE_BYTES);
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512vnni"))
    return pdlkit_error(f->error, f->error_size, PDLKIT_UNSUPPORTED,
                        "this CPU has no AVX-512 VNNI");
  gemm((const int8_t*)a->data + a->byte_offset, (const int8_t*)b->data + b->byte_offset,
       (int32_t*)((char*)c->data + c->byte_offset), a->shape[0], b->shape[1], a->shape[1],
       f->workspace);
  return PDLKIT_OK;
}

static const DLDataType kInt8[] = {{kDLInt, 8, 1}};
static const int32_t kRank2[] = {2};

static const pdlkit_arg_desc kArgs[] = {
    {sizeof(pdlkit_arg_desc), "a", PDLKIT_KIND_TENSOR, kInt8, 1, kRank2, 1, NULL, NULL, 0, 0, 0},
    {sizeof(pdlkit_arg_desc), "b", PDLKIT_KIND_TENSOR, kInt8, 1, kRank2, 1, NULL, NULL, 0, 0, 0},
};

static const char* const kIsa[] = {"avx512f", "avx512_vnni"};

static const pdlkit_kernel_desc kIntMm = {
    sizeof(pdlkit_kernel_desc),
    "vnni_int8_gemm",
    1,
    "int_mm",
    kDLCPU,
    0,
    kArgs,
    2,
    kIsa,
    2,
    WORKSPACE_BYTES,
    PDLKIT_TRAIT_DETERMINISTIC,
    1,
    int_mm_meta,
    int_mm_run,
    "int8 x int8 -> int32 GEMM (torch._int_mm) with AVX-512 VNNI dpbusd; any M, N, K; "
    "declines non-contiguous inputs.",
};

static const pdlkit_kernel_desc* const kKernels[] = {&kIntMm};

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration* out, char* error,
                                      size_t error_size) {
  (void)host_minor; /* nothing here needs a newer host */
  PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
  out->kernels = kKernels;
  out->num_kernels = sizeof(kKernels) / sizeof(kKernels[0]);
  return PDLKIT_OK;
}
