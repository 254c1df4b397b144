/*
 * abi_driver: calls a pdlkit native kernel library exactly as the host does, from files.
 *
 * Used to verify the AArch64 kernels on an x86 machine under qemu-user, through the same
 * entry points pdlkit's loader uses (pdlkit_register -> descriptor -> prepack -> meta -> run
 * with a real pdlkit_call_frame). Build for AArch64 and run under qemu:
 *
 *   aarch64-linux-gnu-gcc -O1 -I runtime_abi/include kernels/aarch64/abi_driver.c -ldl \
 *       -o abi_driver
 *   qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu ./abi_driver LIB.so CASE_DIR...
 *   qemu-aarch64 -L /usr/aarch64-linux-gnu ./abi_driver LIB.so --describe
 *
 * A case directory holds case.txt (written by tests/test_aarch64.py):
 *   kernel NAME
 *   input CODE BITS NDIM D0 .. Dn FILE      one per TENSOR parameter, in parameter order
 *   input none                              an absent optional tensor
 *   attr int NAME VALUE | attr float NAME HEXFLOAT | attr str NAME [VALUE]
 * and the driver writes status.txt ("STATUS message"), packed.bin (what prepack produced, if
 * the kernel has a prepack hook) and, on success, for output j out<j>.txt
 * ("CODE BITS NDIM D0 .. Dn") and out<j>.bin (raw, row-major).
 * --describe prints every descriptor as one JSON object per line.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdlkit_abi.h"

enum { MAX_IN = 32, MAX_ATTR = 32, MAX_DIM = 8, MAX_OUT = 8, LINE = 4096 };

static void* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* buf = aligned_alloc(64, (size_t)(n > 0 ? (n + 63) / 64 * 64 : 64));
  if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return buf;
}

static int cmp_attr(const void* a, const void* b) {
  return strcmp((*(const pdlkit_attribute* const*)a)->name, (*(const pdlkit_attribute* const*)b)->name);
}

static void compact_strides(DLTensor* t, int64_t* strides) {
  int64_t s = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    strides[d] = s;
    s *= t->shape[d];
  }
  t->strides = strides;
}

static size_t nbytes(const DLTensor* t) {
  size_t n = (t->dtype.bits + 7u) / 8u;
  for (int32_t d = 0; d < t->ndim; ++d) n *= (size_t)t->shape[d];
  return n;
}

static void write_status(const char* dir, int32_t status, const char* msg) {
  char path[LINE];
  snprintf(path, sizeof(path), "%s/status.txt", dir);
  FILE* f = fopen(path, "w");
  if (!f) return;
  fprintf(f, "%d %s\n", (int)status, msg);
  fclose(f);
}

static const pdlkit_kernel_desc* find(const pdlkit_registration* reg, const char* name) {
  for (size_t i = 0; i < reg->num_kernels; ++i)
    if (strcmp(reg->kernels[i]->name, name) == 0) return reg->kernels[i];
  return NULL;
}

/* Runs one case directory; returns 0 when it could be run at all (any kernel status). */
static int run_case(const pdlkit_registration* reg, const char* dir) {
  char path[LINE], line[LINE], name[256] = "";
  snprintf(path, sizeof(path), "%s/case.txt", dir);
  FILE* f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "%s: cannot open\n", path);
    return 1;
  }
  static DLTensor in[MAX_IN];
  static int64_t shapes[MAX_IN][MAX_DIM], strides[MAX_IN][MAX_DIM];
  static pdlkit_attribute attrs[MAX_ATTR];
  static char attr_names[MAX_ATTR][128], attr_strs[MAX_ATTR][256];
  const pdlkit_attribute* attr_ptrs[MAX_ATTR];
  size_t n_in = 0, n_attr = 0;
  memset(in, 0, sizeof(in));
  memset(attrs, 0, sizeof(attrs));
  while (fgets(line, sizeof(line), f)) {
    line[strcspn(line, "\n")] = '\0';
    char* tok = strtok(line, " ");
    if (!tok) continue;
    if (strcmp(tok, "kernel") == 0) {
      snprintf(name, sizeof(name), "%s", strtok(NULL, " "));
    } else if (strcmp(tok, "input") == 0) {
      DLTensor* t = &in[n_in];
      char* first = strtok(NULL, " ");
      if (strcmp(first, "none") != 0) {
        t->dtype.code = (uint8_t)atoi(first);
        t->dtype.bits = (uint8_t)atoi(strtok(NULL, " "));
        t->dtype.lanes = 1;
        t->ndim = atoi(strtok(NULL, " "));
        t->shape = shapes[n_in];
        for (int32_t d = 0; d < t->ndim; ++d) t->shape[d] = atoll(strtok(NULL, " "));
        t->device.device_type = kDLCPU;
        char file[LINE];
        snprintf(file, sizeof(file), "%s/%s", dir, strtok(NULL, " "));
        size_t size = 0;
        t->data = read_file(file, &size);
        if (!t->data || size != nbytes(t)) {
          fprintf(stderr, "%s: %zu bytes, expected %zu\n", file, size, nbytes(t));
          fclose(f);
          return 1;
        }
        compact_strides(t, strides[n_in]);
      }
      ++n_in;
    } else if (strcmp(tok, "attr") == 0) {
      pdlkit_attribute* a = &attrs[n_attr];
      char* kind = strtok(NULL, " ");
      snprintf(attr_names[n_attr], sizeof(attr_names[0]), "%s", strtok(NULL, " "));
      char* value = strtok(NULL, "");
      a->struct_size = sizeof(*a);
      a->name = attr_names[n_attr];
      if (strcmp(kind, "int") == 0) {
        a->kind = PDLKIT_KIND_INT;
        a->i = atoll(value);
      } else if (strcmp(kind, "float") == 0) {
        a->kind = PDLKIT_KIND_FLOAT;
        a->f = strtod(value, NULL); /* hex floats: exact */
      } else {
        a->kind = PDLKIT_KIND_STRING;
        snprintf(attr_strs[n_attr], sizeof(attr_strs[0]), "%s", value ? value : "");
        a->s = attr_strs[n_attr];
        a->s_size = strlen(a->s);
      }
      attr_ptrs[n_attr] = a;
      ++n_attr;
    }
  }
  fclose(f);
  qsort(attr_ptrs, n_attr, sizeof(attr_ptrs[0]), cmp_attr); /* the host sorts by name */

  const pdlkit_kernel_desc* k = find(reg, name);
  if (!k) {
    write_status(dir, -1, "no such kernel");
    return 0;
  }
  char error[1024] = "";
  /* meta sees the logical inputs */
  DLTensor meta_in[MAX_IN], out[MAX_OUT];
  int64_t out_shapes[MAX_OUT][MAX_DIM], out_strides[MAX_OUT][MAX_DIM];
  memcpy(meta_in, in, sizeof(DLTensor) * n_in);
  for (size_t i = 0; i < n_in; ++i) meta_in[i].data = NULL, meta_in[i].strides = NULL;
  memset(out, 0, sizeof(out));
  for (size_t j = 0; j < k->num_outputs; ++j) out[j].shape = out_shapes[j];
  pdlkit_meta_frame mf = {sizeof(mf), k, meta_in, n_in, attr_ptrs, n_attr,
                          out, k->num_outputs, MAX_DIM, error, sizeof(error)};
  int32_t st = k->meta(&mf);
  if (st != PDLKIT_OK) {
    write_status(dir, st, error);
    return 0;
  }
  /* prepack (ABI 1.1): the packed bytes replace the prepack_arg input for run() */
  DLTensor run_in[MAX_IN];
  memcpy(run_in, in, sizeof(DLTensor) * n_in);
  int64_t packed_shape[1];
  if (PDLKIT_HAS_FIELD(k, pdlkit_kernel_desc, prepack) && k->prepack_arg) {
    size_t t = 0, slot = (size_t)-1;
    const char* arg = (const char*)k->args;
    for (size_t i = 0; i < k->num_args; ++i) {
      const pdlkit_arg_desc* a = (const pdlkit_arg_desc*)(arg + i * k->args[0].struct_size);
      if (a->kind != PDLKIT_KIND_TENSOR) continue;
      if (strcmp(a->name, k->prepack_arg) == 0) slot = t;
      ++t;
    }
    pdlkit_prepack_frame pf = {sizeof(pf), k, &in[slot], attr_ptrs, n_attr, NULL, 0, error,
                               sizeof(error)};
    st = k->prepack(&pf);
    if (st == PDLKIT_OK) {
      pf.packed = aligned_alloc(64, (pf.packed_size + 63) / 64 * 64);
      st = k->prepack(&pf);
    }
    if (st != PDLKIT_OK) {
      write_status(dir, st, error);
      return 0;
    }
    packed_shape[0] = (int64_t)pf.packed_size;
    snprintf(path, sizeof(path), "%s/packed.bin", dir); /* for tests of the documented layout */
    FILE* pb = fopen(path, "wb");
    if (pb) {
      fwrite(pf.packed, 1, pf.packed_size, pb);
      fclose(pb);
    }
    DLTensor* p = &run_in[slot];
    p->data = pf.packed;
    p->ndim = 1;
    p->shape = packed_shape;
    p->dtype.code = kDLUInt, p->dtype.bits = 8, p->dtype.lanes = 1;
    p->byte_offset = 0;
    compact_strides(p, strides[slot] /* the logical strides are not needed any more */);
  }
  for (size_t j = 0; j < k->num_outputs; ++j) {
    out[j].data = aligned_alloc(64, (nbytes(&out[j]) + 63) / 64 * 64 + 64);
    out[j].device.device_type = kDLCPU;
    compact_strides(&out[j], out_strides[j]);
  }
  void* workspace = k->workspace_size ? aligned_alloc(64, (k->workspace_size + 63) / 64 * 64) : NULL;
  pdlkit_call_frame cf = {sizeof(cf), k, run_in, n_in, out, k->num_outputs, attr_ptrs, n_attr,
                          NULL, workspace, k->workspace_size, error, sizeof(error)};
  st = k->run(&cf);
  write_status(dir, st, error);
  if (st != PDLKIT_OK) return 0;
  for (size_t j = 0; j < k->num_outputs; ++j) {
    snprintf(path, sizeof(path), "%s/out%zu.txt", dir, j);
    FILE* t = fopen(path, "w");
    fprintf(t, "%d %d %d", out[j].dtype.code, out[j].dtype.bits, (int)out[j].ndim);
    for (int32_t d = 0; d < out[j].ndim; ++d) fprintf(t, " %lld", (long long)out[j].shape[d]);
    fprintf(t, "\n");
    fclose(t);
    snprintf(path, sizeof(path), "%s/out%zu.bin", dir, j);
    FILE* b = fopen(path, "wb");
    fwrite(out[j].data, 1, nbytes(&out[j]), b);
    fclose(b);
  }
  return 0;
}

static void describe(const pdlkit_registration* reg) {
  for (size_t i = 0; i < reg->num_kernels; ++i) {
    const pdlkit_kernel_desc* k = reg->kernels[i];
    printf("{\"name\": \"%s\", \"version\": %d, \"op\": \"%s\", \"device_type\": %d, "
           "\"priority\": %d, \"workspace\": %zu, \"num_outputs\": %zu, \"isa\": [",
           k->name, (int)k->version, k->op, (int)k->device_type, (int)k->priority,
           k->workspace_size, k->num_outputs);
    for (size_t j = 0; j < k->num_isa; ++j) printf("%s\"%s\"", j ? ", " : "", k->isa[j]);
    printf("], \"prepack_arg\": %s%s%s, \"args\": [",
           k->prepack_arg ? "\"" : "", k->prepack_arg ? k->prepack_arg : "null",
           k->prepack_arg ? "\"" : "");
    const char* base = (const char*)k->args;
    for (size_t j = 0; j < k->num_args; ++j) {
      const pdlkit_arg_desc* a = (const pdlkit_arg_desc*)(base + j * k->args[0].struct_size);
      printf("%s{\"name\": \"%s\", \"kind\": %d, \"dtypes\": [", j ? ", " : "", a->name,
             (int)a->kind);
      for (size_t d = 0; d < a->num_dtypes; ++d)
        printf("%s[%d, %d]", d ? ", " : "", a->dtypes[d].code, a->dtypes[d].bits);
      printf("], \"ranks\": [");
      for (size_t d = 0; d < a->num_ranks; ++d) printf("%s%d", d ? ", " : "", (int)a->ranks[d]);
      printf("], \"contiguous\": %d, \"optional\": %d}", (int)a->contiguous, (int)a->optional);
    }
    printf("]}\n");
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s LIB.so (--describe | CASE_DIR...)\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  pdlkit_register_fn reg_fn = (pdlkit_register_fn)dlsym(lib, PDLKIT_REGISTER_SYMBOL);
  if (!reg_fn) {
    fprintf(stderr, "%s: no %s\n", argv[1], PDLKIT_REGISTER_SYMBOL);
    return 2;
  }
  pdlkit_registration reg;
  memset(&reg, 0, sizeof(reg));
  reg.struct_size = sizeof(reg);
  char error[1024] = "";
  int32_t st = reg_fn(PDLKIT_ABI_MAJOR, PDLKIT_ABI_MINOR, &reg, error, sizeof(error));
  if (st != PDLKIT_OK) {
    fprintf(stderr, "pdlkit_register: status %d: %s\n", (int)st, error);
    return 2;
  }
  if (strcmp(argv[2], "--describe") == 0) {
    describe(&reg);
    return 0;
  }
  int bad = 0;
  for (int i = 2; i < argc; ++i) bad |= run_case(&reg, argv[i]);
  return bad;
}
