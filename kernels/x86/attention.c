/*
 * attention: quantize_per_tensor(scaled_dot_product_attention(q, k, v, mask)) on x86 with
 * AVX512_BF16, as pdlkit native kernels (C ABI 1.1 and up) of two logical ops: "attention_q" (output
 * [B, H, Sq, D]) and "attention_q_merged" (output [B, Sq, H * D]: the heads merged by
 * .transpose(1, 2).reshape(B, Sq, H * D) before the quantize, as PT2E BERT graphs have it).
 * The compute is attention_core.h, which qgemm_vnni.c includes as well for its
 * qkv_attention_q_merged kernel (the Q, K, V GEMM and the attention batch by batch).
 *
 *   out[b, h, i, :] = quantize(sum_j softmax_j(q[b,h,i,:] . k[b,h,j,:] * scale + mask) v[b,h,j,:])
 *   quantize(x)     = clamp(round_half_even(x * (float)(1.0 / out_scale)) + out_zp, qmin, qmax)
 *
 * which is PT2E's quantized_decomposed.quantize_per_tensor applied to the FP32 result of
 * aten.scaled_dot_product_attention (dropout 0). This is what PT2E int8 BERT computes for
 * every attention (X86InductorQuantizer quantizes the attention output for the next linear).
 *
 * Build (pdlkit builds it itself, see attention.py; this is the same command):
 *
 *   cc -O3 -shared -fPIC -Wall -I runtime_abi/include kernels/x86/attention.c -lm \
 *      -o libpdlkit_attention.so
 *
 * No -mavx512* flags on purpose: only the compute functions carry
 * __attribute__((target("avx512f,avx512bw,avx512bf16"))), so the library loads, registers and
 * answers meta() on any x86-64 CPU; run() returns PDLKIT_UNSUPPORTED where the CPU lacks one
 * of those (the host then runs the replaced subgraph).
 *
 * Parameters (the schema): q, k, v: float32 [B, H, S, D] (k and v with Sk rows), any strides
 * with the last dim contiguous (stride 1; other calls are declined); attn_mask: optional, rank
 * 4, broadcastable to [B, H, Sq, Sk] (size-1 or stride-0 dims), bool (false = masked out) or
 * float32 (added to the scores); is_causal (int): keep j <= i (top-left aligned, as torch);
 * scale (float): the softmax scale, where scale <= 0 (or NaN) stands for None, i.e.
 * 1 / sqrt(D) (an explicit non-positive scale is therefore not expressible); out_scale,
 * out_zp, out_qmin, out_qmax: the quantization; out_qmin >= 0 gives uint8, else int8.
 * Output: a new contiguous [B, H, Sq, D] (attention_q) or [B, Sq, H * D]
 * (attention_q_merged) uint8 / int8 tensor. A fully masked row gives
 * zeros before quantization (= out_zp), as torch's SDPA does on the CPU; a float mask of
 * -FLT_MAX (torch.finfo.min, HF's) is a finite number as in torch (a row of it averages v).
 * Declined (PDLKIT_UNSUPPORTED: the reference runs, whose NaN / inf results are torch's):
 * q, k or v with a NaN or an infinity (or beyond about 1e19, whose square overflows), and a
 * NaN or +inf in the float mask or the scores (-inf masks out, as in torch).
 *
 * Method, per (b, h) (two-pass softmax over whole rows, MR query rows at a time):
 *   1. Pack K and V to BF16 in the pair layout of _mm512_dpbf16_ps (a 32-bit lane of it
 *      holds two bf16, multiplied pairwise and added to one fp32 accumulator):
 *        kp[D/2][SkP] words, word (d2, j) = (k[j, 2 d2], k[j, 2 d2 + 1])   (16x16 transposes)
 *        vp[Sk/2][DP] words, word (j2, d) = (v[2 j2, d], v[2 j2 + 1, d])   (one vpermw)
 *      zero padded: odd D, odd Sk, SkP = Sk and DP = D rounded up to 16; and max_j |k_j|^2
 *      (one dpbf16 of each transposed word with itself: a row's squares in its lane).
 *   2. Q rows -> bf16 pair words (and |q_i|^2 the same way); S = Q K^T with MR x 64 fp32
 *      accumulators (4 zmm per row): per pair d2, one broadcast q word per row and 4 loads of
 *      kp[d2]; one dpbf16 each. Where a logit of the MR rows could exceed QK_BF16_MAX = 16
 *      (|q_i| |k_j| scale, Cauchy-Schwarz), S in float32 instead: K packed once per head as
 *      kf[D][SkP] floats (16x16 transposes), per d one broadcast q per row, 4 loads, 16 FMAs.
 *   3. Softmax in fp32, the MR rows phase by phase (their max / sum reductions overlap):
 *      t = s * scale * log2(e) (-inf where masked out, by is_causal, or past Sk; with a float
 *      mask t = s * scale + mask, times log2(e) after subtracting the max), m = max t,
 *      p = 2^(t - m) by our own vectorised exp2 (round to nearest n, f = t - n in
 *      [-0.5, 0.5], degree-5 polynomial, vscalefps by n; no libm). p is rounded
 *      to bf16 for the P V product and the row sum adds the rounded values, so the weights the
 *      product uses sum to exactly 1 after normalisation. A bool mask row that is one value
 *      (stride 0 along Sk: HF BERT's expanded mask) costs nothing per element.
 *   4. O = P V with MR x 64 accumulators over the pair words of P, then the epilogue folds
 *      1/rowsum and 1/out_scale into one multiply, rounds half to even (vcvtps2dq under
 *      _MM_FROUND_TO_NEAREST_INT), adds out_zp, clamps to [qmin, qmax] and stores bytes.
 *
 * Precision. The products use BF16 inputs (8-bit significand, relative rounding <= 2^-9)
 * with FP32 accumulation; softmax, normalisation and quantization are FP32. The result is an
 * 8-bit code right after: one step is out_scale, about 1/255 of the calibrated output range.
 * A logit's error from BF16 q and k grows with |q| |k| (2^-8 of sum_d |q_d k_d| at most): on
 * logits in the tens (q, k of standard deviation 3, 10, 30 at D = 64) BF16 Q K^T moved codes by
 * 3, 20, 55. Hence float32 Q K^T wherever a logit could exceed 16 (step 2); below, the logit
 * errors stay under about 0.06 (typically 0.002). P and V in BF16 move the output by at most
 * 2^-9 (max |v| + range of v): below a code where out_scale is calibrated on outputs that span
 * v's range, and averaged out over the Sk-long sums otherwise. Measured against FP32 SDPA +
 * quantize (tests/test_x86_attention.py, benchmarks/x86_attention.py): random q, k, v of
 * standard deviation 0.8 to 100, D 8 to 256, S 16 to 384, outlier tokens, output range
 * calibrated: no code off by more than one, 1-9% off by one; bert-mini's PT2E activations:
 * 1.3-1.6% off by one. It is not a bound: with an out_scale much finer than v's values (a
 * badly calibrated quantizer) a code can move by two.
 *
 * Threads: built with -fopenmp (attention.py tries that first), calls of 2^20 multiply-adds
 * (B H Sq Sk D) or more share their heads over torch's OpenMP threads, each thread with its
 * own scratch (allocated per call); otherwise, and without OpenMP, one thread. Memory: about
 * 8 Sk D bytes of packed K (bf16 pairs and float32) and V plus row buffers; the host's
 * workspace (WORKSPACE_BYTES, 576 KiB, one per thread, reused) holds them up to Sk D of about
 * 70000 (Sk 512 with D 128); larger calls allocate their scratch with aligned_alloc and
 * free it before returning (declining if that fails). Sk and D up to 65536.
 */
#include "pdlkit_abi.h"
#include "attention_core.h" /* attn_params, layout_of, execute, has_isa */

/* ---- the pdlkit contract -------------------------------------------------------------- */

static const pdlkit_attribute* attr(const pdlkit_attribute* const* attrs, size_t n,
                                    const char* name, int32_t kind) {
  const pdlkit_attribute* a = pdlkit_find_attr(attrs, n, name);
  return a != NULL && a->kind == kind ? a : NULL;
}

static int32_t check_mask(const DLTensor* m, char* error, size_t error_size) {
  if (!pdlkit_is_none(m)) {
    if (m->ndim != 4)
      return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT, "attn_mask must be 4-D");
    if (!pdlkit_dtype_is(m->dtype, kDLBool, 8) && !pdlkit_dtype_is(m->dtype, kDLFloat, 32))
      return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                          "attn_mask must be bool or float32");
  }
  return PDLKIT_OK;
}

/* Ranks and dtypes of q, k, v and the mask (meta() and run()). */
static int32_t check_shapes(const DLTensor* in, size_t n, char* error, size_t error_size) {
  if (n != 4)
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                        "expects 4 tensor inputs (q, k, v, attn_mask), got %zu", n);
  for (int i = 0; i < 3; ++i)
    if (in[i].ndim != 4 || !pdlkit_dtype_is(in[i].dtype, kDLFloat, 32))
      return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                          "q, k, v must be 4-D float32");
  return check_mask(&in[3], error, error_size);
}

/* run() only: the sizes agree. (meta() skips this: with dynamic shapes the host probes meta
 * by doubling one size symbol at a time, and sizes that are equal but carry different
 * symbols would then disagree; the output's shape needs only q's sizes.) */
static int32_t check_agreement(const DLTensor* in, char* error, size_t error_size) {
  const DLTensor *q = &in[0], *k = &in[1], *v = &in[2];
  if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] ||
      v->shape[1] != q->shape[1] || k->shape[3] != q->shape[3] || v->shape[3] != q->shape[3] ||
      v->shape[2] != k->shape[2])
    return pdlkit_error(error, error_size, PDLKIT_INVALID_ARGUMENT,
                        "q [B, H, Sq, D], k and v [B, H, Sk, D] do not agree");
  return PDLKIT_OK;
}

/* merged = 0: out [B, H, Sq, D] (attention_q); 1: out [B, Sq, H * D], the heads merged as
 * attention's output projection reads them (attention_q_merged). */
static int32_t meta(const pdlkit_meta_frame* f, int merged) {
  int32_t st = check_shapes(f->inputs, f->num_inputs, f->error, f->error_size);
  if (st != PDLKIT_OK) return st;
  if (f->num_outputs != 1 || f->max_ndim < 4)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "one 4-D output");
  const pdlkit_attribute* qmin = attr(f->attrs, f->num_attrs, "out_qmin", PDLKIT_KIND_INT);
  if (qmin == NULL)
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "no int out_qmin");
  DLTensor* y = &f->outputs[0];
  const int64_t* qs = f->inputs[0].shape;
  if (merged) {
    y->ndim = 3;
    y->shape[0] = qs[0], y->shape[1] = qs[2], y->shape[2] = qs[1] * qs[3];
  } else {
    y->ndim = 4;
    for (int d = 0; d < 4; ++d) y->shape[d] = qs[d];
  }
  y->dtype.code = qmin->i >= 0 ? kDLUInt : kDLInt;
  y->dtype.bits = 8;
  y->dtype.lanes = 1;
  return PDLKIT_OK;
}

static int32_t attention_q_meta(const pdlkit_meta_frame* f) { return meta(f, 0); }
static int32_t attention_q_merged_meta(const pdlkit_meta_frame* f) { return meta(f, 1); }

#define DECLINE(...) pdlkit_error(f->error, f->error_size, PDLKIT_UNSUPPORTED, __VA_ARGS__)

static int32_t run(const pdlkit_call_frame* f, int merged) {
  int32_t st = check_shapes(f->inputs, f->num_inputs, f->error, f->error_size);
  if (st == PDLKIT_OK) st = check_agreement(f->inputs, f->error, f->error_size);
  if (st != PDLKIT_OK) return st;
  const DLTensor *q = &f->inputs[0], *k = &f->inputs[1], *v = &f->inputs[2];
  const DLTensor* m = &f->inputs[3];
  const DLTensor* y = &f->outputs[0];
  const pdlkit_attribute* at[6];
  static const char* const names[6] = {"is_causal", "out_qmax", "out_qmin",
                                       "out_scale", "out_zp",   "scale"};
  static const int32_t kinds[6] = {PDLKIT_KIND_INT,   PDLKIT_KIND_INT, PDLKIT_KIND_INT,
                                   PDLKIT_KIND_FLOAT, PDLKIT_KIND_INT, PDLKIT_KIND_FLOAT};
  for (int i = 0; i < 6; ++i)
    if ((at[i] = attr(f->attrs, f->num_attrs, names[i], kinds[i])) == NULL)
      return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT,
                          "missing attribute %s", names[i]);
  attn_params p;
  memset(&p, 0, sizeof(p));
  p.B = q->shape[0], p.H = q->shape[1], p.Sq = q->shape[2], p.Sk = k->shape[2];
  p.D = q->shape[3];
  int is_u8 = at[2]->i >= 0;
  const int64_t want3[3] = {p.B, p.Sq, p.H * p.D};
  int shape_ok = f->num_outputs == 1 && y->ndim == (merged ? 3 : 4);
  for (int d = 0; shape_ok && d < y->ndim; ++d)
    shape_ok = y->shape[d] == (merged ? want3[d] : q->shape[d]);
  if (!shape_ok || !pdlkit_is_contiguous(y) ||
      !pdlkit_dtype_is(y->dtype, is_u8 ? kDLUInt : kDLInt, 8))
    return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT,
                        "output must be a contiguous %s 8-bit tensor",
                        merged ? "[B, Sq, H * D]" : "[B, H, Sq, D]");
  if (p.B * p.H * p.Sq * p.D == 0) return PDLKIT_OK;
  for (int i = 0; i < 4; ++i)
    if (!pdlkit_is_none(&f->inputs[i]) && f->inputs[i].device.device_type != kDLCPU)
      return DECLINE("CPU tensors only");
  for (int i = 0; i < 3; ++i)
    if (f->inputs[i].shape[3] > 1 && f->inputs[i].strides[3] != 1)
      return DECLINE("%s: the last dim is not contiguous", i == 0 ? "q" : i == 1 ? "k" : "v");
  if (p.Sk == 0) return DECLINE("no keys (Sk = 0)");
  if (p.Sk > MAX_DIM || p.D > MAX_DIM)
    return DECLINE("Sk = %lld or D = %lld above %d", (long long)p.Sk, (long long)p.D, MAX_DIM);
  double scale = at[5]->f, out_scale = at[3]->f;
  if (!(out_scale > 0.0) || !isfinite(out_scale))
    return DECLINE("out_scale %g is not a positive number", out_scale);
  int64_t qmin = at[2]->i, qmax = at[1]->i, zp = at[4]->i;
  if (qmin > qmax || qmin < (is_u8 ? 0 : -128) || qmax > (is_u8 ? 255 : 127) || zp < -(1 << 20) ||
      zp > (1 << 20))
    return DECLINE("quantization range [%lld, %lld] / zero point %lld not 8-bit", (long long)qmin,
                   (long long)qmax, (long long)zp);
  if (!has_isa()) return DECLINE("this CPU lacks AVX512F / AVX512BW / AVX512_BF16");

  if (!(scale > 0.0)) scale = 1.0 / sqrt((double)p.D); /* scale <= 0 / NaN: None */
  p.scale = (float)scale;
  p.inv_out_scale = (float)(1.0 / out_scale);
  p.zp = (int32_t)zp, p.qmin = (int32_t)qmin, p.qmax = (int32_t)qmax;
  p.causal = at[0]->i != 0;
  const DLTensor* t3[3] = {q, k, v};
  const float** ptr3[3] = {&p.q, &p.k, &p.v};
  int64_t* s3[3] = {p.qs, p.ks, p.vs};
  for (int i = 0; i < 3; ++i) {
    *ptr3[i] = (const float*)((const char*)t3[i]->data + t3[i]->byte_offset);
    for (int d = 0; d < 3; ++d) s3[i][d] = t3[i]->strides[d];
  }
  if (!pdlkit_is_none(m)) {
    const int64_t want[4] = {p.B, p.H, p.Sq, p.Sk};
    for (int d = 0; d < 4; ++d) {
      if (m->shape[d] != want[d] && m->shape[d] != 1)
        return DECLINE("attn_mask dim %d is %lld, not 1 or %lld", d, (long long)m->shape[d],
                       (long long)want[d]);
      p.ms[d] = m->shape[d] == 1 ? 0 : m->strides[d];
    }
    p.mask = (const uint8_t*)m->data + m->byte_offset;
    p.mask_float = pdlkit_dtype_is(m->dtype, kDLFloat, 32);
    if (p.Sk == 1) p.ms[3] = 1; /* one column: its stride is irrelevant */
  }
  p.out = (int8_t*)((char*)y->data + y->byte_offset);
  if (merged) /* out[b, i, h D + d] */
    p.os[0] = p.Sq * p.H * p.D, p.os[1] = p.D, p.os[2] = p.H * p.D;
  else /* out[b, h, i, d] */
    p.os[0] = p.H * p.Sq * p.D, p.os[1] = p.Sq * p.D, p.os[2] = p.D;

  int rc = execute(&p, (char*)f->workspace, f->workspace_size);
  if (rc > 0)
    return DECLINE("q, k, v, a score q . k * scale or the mask is not finite (NaN or inf; a "
                   "mask's -inf is fine): the reference runs, whose NaN / inf results are torch's");
  if (rc < 0) return DECLINE("no memory for the attention's scratch");
  return PDLKIT_OK;
}

static int32_t attention_q_run(const pdlkit_call_frame* f) { return run(f, 0); }
static int32_t attention_q_merged_run(const pdlkit_call_frame* f) { return run(f, 1); }

static const DLDataType kF32[] = {{kDLFloat, 32, 1}};
static const DLDataType kMask[] = {{kDLBool, 8, 1}, {kDLFloat, 32, 1}};
static const int32_t kRank4[] = {4};

#define QKV(name) \
  {sizeof(pdlkit_arg_desc), name, PDLKIT_KIND_TENSOR, kF32, 1, kRank4, 1, NULL, NULL, 0, 0, 0, 0}
#define ARG(name, kind) {sizeof(pdlkit_arg_desc), name, kind, NULL, 0, NULL, 0, NULL, NULL, 0, 0, 0, 0}

static const pdlkit_arg_desc kArgs[] = {
    QKV("q"),
    QKV("k"),
    QKV("v"),
    {sizeof(pdlkit_arg_desc), "attn_mask", PDLKIT_KIND_TENSOR, kMask, 2, kRank4, 1, NULL, NULL, 0,
     0, 0, 1},
    ARG("is_causal", PDLKIT_KIND_INT),
    ARG("scale", PDLKIT_KIND_FLOAT),
    ARG("out_scale", PDLKIT_KIND_FLOAT),
    ARG("out_zp", PDLKIT_KIND_INT),
    ARG("out_qmin", PDLKIT_KIND_INT),
    ARG("out_qmax", PDLKIT_KIND_INT),
};

/* avx512bw is not among pdlkit's ISA feature names (runtime_abi/capability.py); every CPU with
 * AVX512_BF16 has it, and run() checks all three itself. */
static const char* const kIsa[] = {"avx512f", "avx512_bf16"};

#define DESC(name, op, meta_fn, run_fn, doc)                                                 \
  {sizeof(pdlkit_kernel_desc), name, 1, op, kDLCPU, 10 /* priority */, kArgs,                  \
   sizeof(kArgs) / sizeof(kArgs[0]), kIsa, sizeof(kIsa) / sizeof(kIsa[0]), WORKSPACE_BYTES,     \
   PDLKIT_TRAIT_DETERMINISTIC, 1, meta_fn, run_fn, doc, NULL, NULL}

static const pdlkit_kernel_desc kAttentionQ = DESC(
    "x86_attention_q_bf16", "attention_q", attention_q_meta, attention_q_run,
    "quantize_per_tensor(scaled_dot_product_attention(q, k, v, mask)) -> u8 / s8 [B, H, Sq, D]: "
    "AVX512_BF16 dpbf16 for Q K^T (float32 FMA where a logit could exceed 16) and P V with "
    "fp32 accumulation, fp32 softmax (own exp2), quantization fused into the store; any B, H, "
    "S, D, bool / float / no mask, causal; declines a non-contiguous last dim and NaN / inf "
    "inputs, scores or mask values (but a mask's -inf).");

static const pdlkit_kernel_desc kAttentionQMerged = DESC(
    "x86_attention_q_merged_bf16", "attention_q_merged", attention_q_merged_meta,
    attention_q_merged_run,
    "attention_q with the heads merged: quantize_per_tensor(sdpa(q, k, v, mask).transpose(1, 2)"
    ".reshape(B, Sq, H * D)) -> u8 / s8, stored straight into the [B, Sq, H * D] layout the "
    "output projection reads (PT2E BERT graphs); same method as x86_attention_q_bf16.");

static const pdlkit_kernel_desc* const kKernels[] = {&kAttentionQ, &kAttentionQMerged};

PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration* out, char* error,
                                      size_t error_size) {
  PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size);
  if (host_minor < 1) /* attn_mask is an optional tensor (ABI 1.1) */
    return pdlkit_error(error, error_size, PDLKIT_UNSUPPORTED,
                        "needs a host speaking pdlkit ABI >= 1.1 (optional attn_mask), got 1.%u",
                        (unsigned)host_minor);
  out->kernels = kKernels;
  out->num_kernels = sizeof(kKernels) / sizeof(kKernels[0]);
  return PDLKIT_OK;
}
