/* What the x86 GEMM libraries (qgemm_vnni.c, gemm_bf16.c) need around pdlkit's C ABI: reading
 * a call's tensors and attributes, and the header of the weights their prepack hooks write.
 * Header-only; pdlkit_abi.h is the contract, this is convenience on top of it. */
#ifndef PDLKIT_X86_ABI_H
#define PDLKIT_X86_ABI_H

#include <stdio.h>
#include <stdlib.h>

#include "pdlkit_abi.h"

/* return X86_ERR(f, PDLKIT_UNSUPPORTED, "K = %lld", k): a status with its message in f->error */
#define X86_ERR(f, status, ...) pdlkit_error((f)->error, (f)->error_size, (status), __VA_ARGS__)

static inline void *x86_data(const DLTensor *t) { return (char *)t->data + t->byte_offset; }

/* The attribute `name` of this kind, or NULL. */
static inline const pdlkit_attribute *x86_attr(const pdlkit_attribute *const *attrs, size_t n,
                                               const char *name, int32_t kind) {
    const pdlkit_attribute *a = pdlkit_find_attr(attrs, n, name);
    return a != NULL && a->kind == kind ? a : NULL;
}

/* post_op / algorithm (or GELU with `approximate` when op is "gelu") -> 0 none, 1 ReLU, 2 GELU
 * (erf), 3 GELU (tanh); -1 for anything else. */
static inline int x86_act(const char *op, const pdlkit_attribute *algo) {
    const char *a = algo != NULL ? algo->s : "";
    if (op[0] == '\0' || strcmp(op, "none") == 0) return a[0] == '\0' || !strcmp(a, "none") ? 0 : -1;
    if (strcmp(op, "relu") == 0) return a[0] == '\0' || !strcmp(a, "none") ? 1 : -1;
    if (strcmp(op, "gelu") != 0) return -1;
    return a[0] == '\0' || !strcmp(a, "none") ? 2 : !strcmp(a, "tanh") ? 3 : -1;
}

/* x as m rows of its last dim K, row i at x + i * ldx elements: the last dim contiguous and
 * every leading dim stepping by whole rows (a strided [B, K] view such as BERT's pooler input
 * x[:, 0] is read in place). 0, or -1 where no single row stride describes x (then *ldx is K,
 * the row stride of x86_compact's copy). */
static inline int x86_rows(const DLTensor *x, int64_t *m, int64_t *ldx) {
    const int32_t nd = x->ndim;
    int64_t rows = 1, ld = -1, expect = 0;
    for (int32_t d = 0; d + 1 < nd; d++) rows *= x->shape[d];
    *m = rows;
    *ldx = x->shape[nd - 1];
    if (rows <= 1 || x->strides == NULL) return 0;
    if (x->shape[nd - 1] > 1 && x->strides[nd - 1] != 1) return -1;
    for (int32_t d = nd - 2; d >= 0; d--) {
        if (x->shape[d] == 1) continue;
        if (ld < 0) {
            ld = x->strides[d];
            expect = ld * x->shape[d];
        } else if (x->strides[d] != expect) {
            return -1;
        } else {
            expect *= x->shape[d];
        }
    }
    if (ld < 0) return -1;
    *ldx = ld;
    return 0;
}

/* A compact row-major copy of x (esize bytes per element) for a layout x86_rows refuses (a
 * transposed view); NULL without memory. The caller frees it. */
static inline void *x86_compact(const DLTensor *x, size_t esize) {
    int64_t total = 1, idx[64] = {0};
    for (int32_t d = 0; d < x->ndim; d++) total *= x->shape[d];
    char *out = (char *)malloc(total > 0 ? (size_t)total * esize : 1);
    if (out == NULL || x->ndim > 64) {
        free(out);
        return NULL;
    }
    const char *base = (const char *)x86_data(x);
    for (int64_t i = 0; i < total; i++) {
        int64_t at = 0;
        for (int32_t d = 0; d < x->ndim; d++) at += idx[d] * x->strides[d];
        memcpy(out + i * (int64_t)esize, base + at * (int64_t)esize, esize);
        for (int32_t d = x->ndim - 1; d >= 0 && ++idx[d] == x->shape[d]; d--) idx[d] = 0;
    }
    return out;
}

/* ints as Python prints a list ("[4, 8]", with open = '[') or a tuple ("(8,)", open = '('),
 * into buf. */
static inline const char *x86_ints(char *buf, size_t size, const int64_t *v, size_t n, char open) {
    size_t at = (size_t)snprintf(buf, size, "%c", open);
    for (size_t i = 0; i < n && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, i ? ", %lld" : "%lld", (long long)v[i]);
    if (at < size) snprintf(buf + at, size - at, open == '(' ? (n == 1 ? ",)" : ")") : "]");
    return buf;
}

/* Whether t is n contiguous elements of this dtype (rank 1). */
static inline int x86_vector(const DLTensor *t, int64_t n, uint8_t code, uint8_t bits) {
    return t->ndim == 1 && t->shape[0] == n && pdlkit_dtype_is(t->dtype, code, bits) &&
           (n <= 1 || t->strides == NULL || t->strides[0] == 1);
}

/* The first 64 bytes of a packed weight; the library's own layout follows. */
typedef struct {
    uint32_t magic;   /* the library's */
    uint32_t flags;   /* the engine the prepack asked for (QG_AMX / GB_AMX) */
    int64_t n, k;     /* the logical weight [n, k] */
    int64_t bytes;    /* the packed size, header included */
    int64_t x_zp;     /* int8 GEMMs: the activation zero point the column terms were made for */
    int64_t reserved[3];
} x86_pack_header;

_Static_assert(sizeof(x86_pack_header) == 64, "one cache line");

/* The header of a weight packed by the library with this magic, or NULL. */
static inline const x86_pack_header *x86_packed(const DLTensor *w, uint32_t magic) {
    if (!pdlkit_dtype_is(w->dtype, kDLUInt, 8) || w->ndim != 1 || w->shape[0] < 64) return NULL;
    const x86_pack_header *h = (const x86_pack_header *)x86_data(w);
    return h->magic == magic && h->bytes == w->shape[0] ? h : NULL;
}

/* Fill a prepack frame's header (the second call), or answer its size query (the first):
 * returns the header to write the rest after, or NULL when the call is done (size answered)
 * or failed (*st set). */
static inline x86_pack_header *x86_pack_begin(pdlkit_prepack_frame *f, uint32_t magic,
                                              uint32_t flags, int64_t n, int64_t k, size_t bytes,
                                              int32_t *st) {
    *st = PDLKIT_OK;
    if (f->packed == NULL) {
        f->packed_size = bytes;
        return NULL;
    }
    if (f->packed_size != bytes) {
        *st = X86_ERR(f, PDLKIT_INVALID_ARGUMENT, "a packed buffer of %zu bytes, not %zu",
                      f->packed_size, bytes);
        return NULL;
    }
    x86_pack_header *h = (x86_pack_header *)f->packed;
    memset(h, 0, sizeof(*h));
    h->magic = magic;
    h->flags = flags;
    h->n = n;
    h->k = k;
    h->bytes = (int64_t)bytes;
    return h;
}

/* meta() of a linear: y [..., N] of `dtype` for x [..., K] and a weight [N, K]. */
static inline int32_t x86_linear_meta(const pdlkit_meta_frame *f, size_t w_at, DLDataType dtype) {
    const DLTensor *x = &f->inputs[0], *w = &f->inputs[w_at];
    if (f->num_outputs < 1 || x->ndim < 1 || x->ndim > f->max_ndim || w->ndim != 2 ||
        w->shape[1] != x->shape[x->ndim - 1])
        return X86_ERR(f, PDLKIT_INVALID_ARGUMENT,
                       "the weight must be [N, K] with K the activations' last dim");
    DLTensor *y = &f->outputs[0];
    y->ndim = x->ndim;
    for (int32_t d = 0; d + 1 < x->ndim; d++) y->shape[d] = x->shape[d];
    y->shape[x->ndim - 1] = w->shape[0];
    y->dtype = dtype;
    return PDLKIT_OK;
}

#endif
