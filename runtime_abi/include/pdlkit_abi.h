/*
 * pdlkit_abi.h -- the C ABI between pdlkit (the host) and native kernel libraries.
 *
 * This header is the whole contract: a vendor builds a shared library against it alone,
 * without pdlkit's sources, and pdlkit loads that library without being rebuilt.
 *
 *   cc -O3 -shared -fPIC -I <pdlkit>/runtime_abi/include my_kernels.c -o libmy_kernels.so
 *
 * Drop the .so into a kernel folder (pdlkit.optimize(..., kernels=FOLDER) or
 * PDLKIT_KERNEL_PATH). pdlkit opens it, calls pdlkit_register(), validates every
 * descriptor it returns (names, dtypes, ISA features, shape rules) and binds each kernel as
 * a torch.library custom op. Patterns then reach a kernel through its logical op name:
 * pdlkit_call("int_mm", %a, %b, %root) picks a kernel whose descriptor has op = "int_mm".
 *
 * Lifecycle
 *   1. pdlkit_register(host_major, host_minor, &reg, error, error_size): the library fills
 *      reg (its own ABI version and its kernel descriptors). Descriptors and everything they
 *      point to must stay valid and unchanged for as long as the library is loaded (static
 *      data is the natural choice). The host never unloads a library it registered.
 *      The host may call it again (e.g. after a failed registration); return the same
 *      result every time.
 *   2. meta(frame): shapes and dtypes only (no data) -> each output's ndim, shape and dtype.
 *      Called at compile time (to plan and type the graph) and for new input shapes at run
 *      time; the host caches results per input signature.
 *   3. run(frame): called per call with host-allocated outputs of exactly the shapes and
 *      dtypes meta gave, a workspace of the declared size and the caller's stream.
 *
 * Rules for every function here
 *   - Return a pdlkit_status. Never throw a C++ exception, longjmp, abort or exit across the
 *     boundary: catch everything and return PDLKIT_INTERNAL with a message.
 *   - On failure write a NUL-terminated message into error[0 .. error_size) (pdlkit_set_error
 *     below truncates safely). The host reports it with the kernel's name and call site.
 *   - PDLKIT_UNSUPPORTED from run() declines one call: the host runs the subgraph the kernel
 *     replaced instead (per-call fallback) and counts it; the next call tries the kernel again.
 *     Use it for inputs you could handle only slowly or not at all (non-contiguous, odd
 *     alignment, a shape outside a fast path). INVALID_ARGUMENT and INTERNAL are errors.
 *   - run() must be thread-safe: several threads may call one kernel at once, each with its
 *     own frame and workspace.
 *   - run() writes only its outputs and its workspace; inputs are read-only.
 *
 * Versioning
 *   - PDLKIT_ABI_MAJOR changes only for incompatible changes; the host refuses a library
 *     built for another major and names both versions. A library should likewise return
 *     PDLKIT_UNSUPPORTED from pdlkit_register when host_major differs from the major it
 *     was built for (after filling reg.abi_major / reg.abi_minor).
 *   - PDLKIT_ABI_MINOR grows when fields are appended to structs or new enum values appear.
 *     Either side may be newer. Fields are only ever appended, and every pdlkit struct
 *     starts with `size_t struct_size` (= sizeof the struct as the writer compiled it), so:
 *       * the reader uses only fields that lie inside struct_size (PDLKIT_HAS_FIELD), and
 *         treats missing fields as zero;
 *       * arrays of pdlkit structs that the host passes to the library are arrays of
 *         pointers (index them normally);
 *       * arrays of pdlkit structs that the library returns (pdlkit_kernel_desc.args) are
 *         plain C arrays; the host steps through them by the first element's struct_size.
 *   - The first three fields of pdlkit_registration (struct_size, abi_major, abi_minor) are
 *     frozen across all majors, so a host can always read the library's version.
 *
 * ABI history
 *   1.0  the first release.
 *   1.1  optional tensor parameters (pdlkit_arg_desc.optional) and a pre-pack hook for
 *        constant weights (pdlkit_kernel_desc.prepack_arg / .prepack). A 1.0 library still
 *        loads: its shorter structs read as if the 1.1 fields were zero.
 *   1.2  several constant tensors packed as one (pdlkit_kernel_desc.prepack_with /
 *        .num_prepack_with; pdlkit_prepack_frame.with / .num_with): e.g. the Q, K and V
 *        weights of an attention block packed as one [3 N, K] GEMM weight. This is what
 *        pdlkit's own x86 kernels (qgemm_vnni.c, gemm_bf16.c, attention.c) needed to drop
 *        their private ctypes entry points; several outputs (num_outputs > 1) were there
 *        since 1.0, and thread counts need no field (a library built with -fopenmp links the
 *        OpenMP runtime torch loaded, so torch.set_num_threads applies to it). A 1.0 or 1.1
 *        library still loads (the 1.2 fields read as zero).
 *
 * Tensors are DLPack DLTensors (https://github.com/dmlc/dlpack): `data` + `byte_offset`
 * is the first element; `shape` and `strides` have `ndim` entries, strides in elements
 * (the host always passes strides for run(); it passes strides = NULL to meta()).
 * If you include <dlpack/dlpack.h> yourself, include it BEFORE this header: the DLPack
 * definitions below are then skipped.
 */
#ifndef PDLKIT_ABI_H_
#define PDLKIT_ABI_H_

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PDLKIT_ABI_MAJOR 1
#define PDLKIT_ABI_MINOR 2

#if defined(_WIN32)
#define PDLKIT_EXPORT __declspec(dllexport)
#else
#define PDLKIT_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* DLPack (the subset pdlkit uses; field-for-field the layout of dlpack.h 1.x).             */
/* ---------------------------------------------------------------------------------------- */
#if !defined(DLPACK_DLPACK_H_) && !defined(DLPACK_VERSION) && !defined(DLPACK_MAJOR_VERSION)
#define PDLKIT_DEFINES_DLPACK 1

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U
} DLDataTypeCode;

typedef struct {
  uint8_t code;   /* a DLDataTypeCode */
  uint8_t bits;   /* bits per lane: 8 for int8, 16 for bfloat16, ... */
  uint16_t lanes; /* always 1 for pdlkit */
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides; /* in elements; NULL = compact row-major */
  uint64_t byte_offset;
} DLTensor;
#endif /* DLPack */

/* ---------------------------------------------------------------------------------------- */
/* Status codes                                                                               */
/* ---------------------------------------------------------------------------------------- */
typedef enum {
  PDLKIT_OK = 0,
  PDLKIT_UNSUPPORTED = 1,      /* decline: the host falls back to the replaced subgraph */
  PDLKIT_INVALID_ARGUMENT = 2, /* the arguments break the kernel's contract: an error */
  PDLKIT_INTERNAL = 3          /* anything else that went wrong: an error */
} pdlkit_status;

/* ---------------------------------------------------------------------------------------- */
/* Argument and attribute kinds                                                               */
/* ---------------------------------------------------------------------------------------- */
/* The kernel's parameters, in order, are its schema (a Python signature such as
 * `(Tensor a, Tensor b, int group, float eps, str mode, int[] dims) -> Tensor`). At a call,
 * TENSOR parameters become frame->inputs (in parameter order); every other parameter
 * becomes one attribute named after the parameter (attributes sorted by name). */
typedef enum {
  PDLKIT_KIND_TENSOR = 1,      /* parameter: an input tensor */
  PDLKIT_KIND_INT = 2,         /* parameter or attribute: int64_t */
  PDLKIT_KIND_FLOAT = 3,       /* parameter or attribute: double */
  PDLKIT_KIND_STRING = 4,      /* parameter or attribute: UTF-8 string */
  PDLKIT_KIND_INT_LIST = 5,    /* parameter or attribute: int64_t[] */
  PDLKIT_KIND_DENSE_TENSOR = 6 /* attribute only: a constant tensor the host owns (reserved:
                                  the 1.0 host passes every tensor parameter as an input) */
} pdlkit_kind;

/* One attribute of a call. `name` is the parameter name; read the field of its kind. */
typedef struct pdlkit_attribute {
  size_t struct_size;
  const char* name;
  int32_t kind; /* a pdlkit_kind other than PDLKIT_KIND_TENSOR */
  int64_t i;                   /* PDLKIT_KIND_INT */
  double f;                    /* PDLKIT_KIND_FLOAT */
  const char* s;               /* PDLKIT_KIND_STRING: s_size bytes, also NUL-terminated */
  size_t s_size;
  const int64_t* ints;         /* PDLKIT_KIND_INT_LIST */
  size_t num_ints;
  const DLTensor* tensor;      /* PDLKIT_KIND_DENSE_TENSOR */
} pdlkit_attribute;

/* ---------------------------------------------------------------------------------------- */
/* Frames: what meta() and run() receive                                                      */
/* ---------------------------------------------------------------------------------------- */
struct pdlkit_kernel_desc;

/* meta(): given input shapes/dtypes and attributes, fill every output's ndim, shape and
 * dtype. inputs[i].data and .strides are NULL. outputs[j].shape points to a host buffer of
 * max_ndim entries; set outputs[j].ndim (<= max_ndim), .shape[0 .. ndim) and .dtype.
 * Must be pure: the same inputs give the same outputs. With dynamic shapes the host calls
 * meta several times with probe sizes; every output dim must then be a constant, one input
 * dim or one INT attribute (e.g. M and N of a GEMM), not a formula of several. */
typedef struct pdlkit_meta_frame {
  size_t struct_size;
  const struct pdlkit_kernel_desc* kernel; /* the descriptor being asked */
  const DLTensor* inputs;
  size_t num_inputs;
  const pdlkit_attribute* const* attrs; /* sorted by name (strcmp order) */
  size_t num_attrs;
  DLTensor* outputs; /* num_outputs of the descriptor; fill ndim, shape, dtype */
  size_t num_outputs;
  int32_t max_ndim;
  char* error;
  size_t error_size;
} pdlkit_meta_frame;

/* run(): compute. Outputs are preallocated by the host: compact row-major, of the shapes
 * and dtypes meta() gave, on the kernel's device. */
typedef struct pdlkit_call_frame {
  size_t struct_size;
  const struct pdlkit_kernel_desc* kernel; /* the descriptor being called */
  const DLTensor* inputs;                  /* the TENSOR parameters, in parameter order */
  size_t num_inputs;
  DLTensor* outputs;                       /* host-allocated; write their data only */
  size_t num_outputs;
  const pdlkit_attribute* const* attrs;    /* the other parameters, sorted by name */
  size_t num_attrs;
  void* stream;          /* CUDA: the caller's cudaStream_t; CPU: NULL */
  void* workspace;       /* workspace_size bytes, 64-byte aligned (NULL if 0) */
  size_t workspace_size;
  char* error;           /* NUL-terminated message on failure */
  size_t error_size;
} pdlkit_call_frame;

/* prepack() (ABI 1.1): reorder a constant weight once into the kernel's own layout; with
 * prepack_with (ABI 1.2) together with other constant tensors (e.g. wk and wv beside wq), which
 * the frame passes in `with`: one packed buffer for several constants. The host calls it twice
 * per weight: first with packed == NULL to learn packed_size (set it), then with a buffer of
 * packed_size bytes, 64-byte aligned, to fill. The host caches the result (bounded, keyed by
 * the weight tensor's identity and version, and those of the prepack_with tensors) and passes
 * it to run() in place of the prepack_arg input: a 1-D uint8 DLTensor of packed_size bytes
 * (prepack_with tensors still arrive as inputs, as they are). meta() always sees the logical
 * (unpacked) weight. Make the packed bytes self-describing (sizes in a header) so that run()
 * can check them. Must be thread-safe and deterministic. */
typedef struct pdlkit_prepack_frame {
  size_t struct_size;
  const struct pdlkit_kernel_desc* kernel; /* the descriptor whose weight is packed */
  const DLTensor* weight;                  /* the logical weight: contiguous, on the CPU */
  const pdlkit_attribute* const* attrs;    /* the call's non-tensor parameters, sorted */
  size_t num_attrs;
  void* packed;                            /* NULL: size query; else packed_size bytes */
  size_t packed_size;                      /* set by the query, read-only on the second call */
  char* error;
  size_t error_size;
  /* ---- ABI 1.2 ---- */
  const DLTensor* with;                    /* the prepack_with tensors, in the descriptor's
                                              order (contiguous, on the CPU); NULL if none */
  size_t num_with;
} pdlkit_prepack_frame;

typedef int32_t (*pdlkit_meta_fn)(const pdlkit_meta_frame* frame);
typedef int32_t (*pdlkit_run_fn)(const pdlkit_call_frame* frame);
typedef int32_t (*pdlkit_prepack_fn)(pdlkit_prepack_frame* frame);

/* ---------------------------------------------------------------------------------------- */
/* Descriptors: what a kernel declares (checked when the library is loaded)                   */
/* ---------------------------------------------------------------------------------------- */

/* One parameter. The shape rule fields apply to TENSOR parameters only. The host checks
 * what it can prove at compile time (rank, divisibility of static dims) when choosing a
 * kernel and the rest (contiguity, alignment, symbolic sizes) before each call: a call that
 * breaks a rule runs the replaced subgraph instead. dtypes and ranks list the only values
 * accepted; an empty list accepts any. */
typedef struct pdlkit_arg_desc {
  size_t struct_size;
  const char* name;           /* a C identifier; becomes the Python parameter name */
  int32_t kind;               /* pdlkit_kind: TENSOR, INT, FLOAT, STRING or INT_LIST */
  const DLDataType* dtypes;   /* TENSOR: the accepted dtypes (lanes = 1) */
  size_t num_dtypes;
  const int32_t* ranks;       /* TENSOR: the accepted ranks */
  size_t num_ranks;
  const int32_t* divisible_dims; /* TENSOR: shape[divisible_dims[i]] % divisible_by[i] == 0 */
  const int64_t* divisible_by;   /*         (dims may be negative: -1 is the last) */
  size_t num_divisible;
  int32_t contiguous;         /* TENSOR: nonzero = must be compact row-major */
  uint32_t alignment;         /* TENSOR: data alignment in bytes (power of two), 0 = any */
  /* ---- ABI 1.1 ---- */
  int32_t optional;           /* TENSOR: nonzero = may be None (Python `Tensor | None`); an
                                 absent tensor arrives as a DLTensor with data == NULL,
                                 ndim == 0 and dtype {0, 0, 0} (lanes 0: no real tensor
                                 has that): test it with pdlkit_is_none() */
} pdlkit_arg_desc;

/* Traits: promises the kernel makes (a bitmask). */
#define PDLKIT_TRAIT_DETERMINISTIC ((uint64_t)1 << 0)      /* same inputs -> same bits */
#define PDLKIT_TRAIT_INPLACE ((uint64_t)1 << 1)            /* may alias outputs to inputs */
#define PDLKIT_TRAIT_GRAPH_CAPTURE_SAFE ((uint64_t)1 << 2) /* CUDA-graph capturable */

typedef struct pdlkit_kernel_desc {
  size_t struct_size;
  const char* name;        /* unique with version among all loaded kernels; a C identifier */
  int32_t version;         /* >= 1; the highest version of a name wins */
  const char* op;          /* the logical op patterns name in pdlkit_call, e.g. "int_mm" */
  int32_t device_type;     /* kDLCPU or kDLCUDA */
  int32_t priority;        /* higher wins among eligible kernels of one op; 0 = default */
  const pdlkit_arg_desc* args; /* the parameters, in order (a plain array) */
  size_t num_args;
  const char* const* isa;  /* required ISA features, e.g. "avx512_vnni", "amx_int8",
                              "avx512_bf16", "i8mm", "sve2", "sm_90"; the host refuses names
                              it does not know */
  size_t num_isa;
  size_t workspace_size;   /* bytes of scratch the host passes to every run() */
  uint64_t traits;         /* PDLKIT_TRAIT_* */
  size_t num_outputs;      /* >= 1 */
  pdlkit_meta_fn meta;     /* required */
  pdlkit_run_fn run;       /* required */
  const char* doc;         /* one paragraph for `pdlkit kernels` / explain; may be NULL */
  /* ---- ABI 1.1 ---- */
  const char* prepack_arg;   /* the TENSOR parameter packed by `prepack`, or NULL for none */
  pdlkit_prepack_fn prepack; /* required when prepack_arg is set */
  /* ---- ABI 1.2 ---- */
  const char* const* prepack_with; /* other required TENSOR parameters packed together with
                                      prepack_arg (pdlkit_prepack_frame.with), or NULL */
  size_t num_prepack_with;
} pdlkit_kernel_desc;

/* ---------------------------------------------------------------------------------------- */
/* Registration: the one symbol a library exports                                             */
/* ---------------------------------------------------------------------------------------- */
typedef struct pdlkit_registration {
  size_t struct_size;  /* set by the host */
  uint32_t abi_major;  /* set by the library: PDLKIT_ABI_MAJOR it was built with */
  uint32_t abi_minor;  /* set by the library: PDLKIT_ABI_MINOR it was built with */
  const pdlkit_kernel_desc* const* kernels; /* set by the library */
  size_t num_kernels;
} pdlkit_registration;

/* Exported by every kernel library, with exactly this name and signature:
 *
 *   PDLKIT_EXPORT int32_t pdlkit_register(uint32_t host_major, uint32_t host_minor,
 *                                         pdlkit_registration* out,
 *                                         char* error, size_t error_size);
 *
 * Fill out->abi_major/abi_minor first (PDLKIT_REGISTRATION_BEGIN does), then the kernels.
 * Return PDLKIT_OK, or a status with a message (e.g. PDLKIT_UNSUPPORTED when the host's
 * major differs, or when the machine lacks something the library needs at all). */
typedef int32_t (*pdlkit_register_fn)(uint32_t host_major, uint32_t host_minor,
                                      pdlkit_registration* out, char* error, size_t error_size);
#define PDLKIT_REGISTER_SYMBOL "pdlkit_register"

/* ---------------------------------------------------------------------------------------- */
/* Helpers (header-only; no pdlkit code is linked)                                            */
/* ---------------------------------------------------------------------------------------- */

/* True when `ptr` (whose struct_size the other side set) contains `field`. */
#define PDLKIT_HAS_FIELD(ptr, type, field) \
  ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* Start of pdlkit_register: report our version, refuse another major. */
#define PDLKIT_REGISTRATION_BEGIN(host_major, out, error, error_size)                      \
  do {                                                                                     \
    (out)->abi_major = PDLKIT_ABI_MAJOR;                                                   \
    (out)->abi_minor = PDLKIT_ABI_MINOR;                                                   \
    if ((host_major) != PDLKIT_ABI_MAJOR) {                                                \
      pdlkit_set_error((error), (error_size), "built for pdlkit ABI %d.%d, host is %u.x",  \
                       PDLKIT_ABI_MAJOR, PDLKIT_ABI_MINOR, (unsigned)(host_major));        \
      return PDLKIT_UNSUPPORTED;                                                           \
    }                                                                                      \
  } while (0)

#if defined(__GNUC__) || defined(__clang__)
#define PDLKIT_PRINTF(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define PDLKIT_PRINTF(fmt_index, first_arg)
#endif

/* Write a printf-style message into error[0 .. error_size), truncated, NUL-terminated. */
static inline PDLKIT_PRINTF(3, 4) void pdlkit_set_error(char* error, size_t error_size,
                                                        const char* fmt, ...) {
  if (error == NULL || error_size == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error, error_size, fmt, ap);
  va_end(ap);
  error[error_size - 1] = '\0';
}

/* The same, returning `status`, for one-line failures:
 *   return pdlkit_error(f->error, f->error_size, PDLKIT_INVALID_ARGUMENT, "K is %lld", k); */
static inline PDLKIT_PRINTF(4, 5) int32_t pdlkit_error(char* error, size_t error_size,
                                                       int32_t status, const char* fmt, ...) {
  if (error != NULL && error_size != 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, error_size, fmt, ap);
    va_end(ap);
    error[error_size - 1] = '\0';
  }
  return status;
}

/* The attribute called `name`, or NULL (binary search: attributes are sorted by name). */
static inline const pdlkit_attribute* pdlkit_find_attr(const pdlkit_attribute* const* attrs,
                                                       size_t num_attrs, const char* name) {
  size_t lo = 0, hi = num_attrs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(attrs[mid]->name, name);
    if (c == 0) return attrs[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

/* True when `t` is compact row-major (as torch defines it: dims of size 1 may have any
 * stride, and an empty tensor is contiguous). */
static inline int pdlkit_is_contiguous(const DLTensor* t) {
  if (t->strides == NULL) return 1;
  for (int32_t d = 0; d < t->ndim; ++d)
    if (t->shape[d] == 0) return 1;
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

/* True for an absent optional tensor (ABI 1.1: pdlkit_arg_desc.optional). */
static inline int pdlkit_is_none(const DLTensor* t) {
  return t->data == NULL && t->ndim == 0 && t->dtype.lanes == 0;
}

static inline int pdlkit_dtype_is(DLDataType t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

/* The address of `t`'s first element (data + byte_offset). */
static inline const void* pdlkit_data(const DLTensor* t) {
  return (const char*)t->data + t->byte_offset;
}

/* The number of elements of `t` (1 for a 0-d tensor). */
static inline int64_t pdlkit_numel(const DLTensor* t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}

/* The value of a one-element float64 or float32 tensor (a scale passed as a tensor, as
 * torch's dynamic quantization computes it) in *out: 0, or -1 for any other tensor. */
static inline int pdlkit_scalar_f64(const DLTensor* t, double* out) {
  if (pdlkit_numel(t) != 1) return -1;
  if (pdlkit_dtype_is(t->dtype, kDLFloat, 64)) *out = *(const double*)pdlkit_data(t);
  else if (pdlkit_dtype_is(t->dtype, kDLFloat, 32)) *out = *(const float*)pdlkit_data(t);
  else return -1;
  return 0;
}

/* The value of a one-element int64 or int32 tensor (a zero point) in *out: 0, or -1. */
static inline int pdlkit_scalar_i64(const DLTensor* t, int64_t* out) {
  if (pdlkit_numel(t) != 1) return -1;
  if (pdlkit_dtype_is(t->dtype, kDLInt, 64)) *out = *(const int64_t*)pdlkit_data(t);
  else if (pdlkit_dtype_is(t->dtype, kDLInt, 32)) *out = *(const int32_t*)pdlkit_data(t);
  else return -1;
  return 0;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PDLKIT_ABI_H_ */
