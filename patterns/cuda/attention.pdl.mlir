// The attention of a decode step (one query token per sequence over a key/value cache), as
// transformers' Llama calls it through its "sdpa" attention: aten.scaled_dot_product_attention
// with q [B, Hq, 1, D] and the cache's k, v [B, Hkv, L, D], enable_gqa where Hq > Hkv (no
// mask), or Hq = Hkv; a mask tensor or None, dropout 0, not causal   ->   pdlkit_call("attention",
// ...), the Triton decode kernel of kernels/cuda/attention.py (it declines the rest: the site
// keeps SDPA). Prefill (query length above 1, is_causal) does not match.

// sdpa(q, k, v, mask, 0.0, false, scale, gqa) with one query token   ->   pdlkit_call("attention", ...)
pdl.pattern @decode_attention : benefit(4) {
  %q = pdl.operand
  %k = pdl.operand
  %v = pdl.operand
  %mask = pdl.operand
  %dropout = pdl.operand
  %causal = pdl.operand
  %scale = pdl.operand
  %gqa = pdl.operand
  %ty = pdl.type
  %sdpa = pdl.operation "torch.aten.scaled_dot_product_attention"(%q, %k, %v, %mask, %dropout, %causal, %scale, %gqa : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "is_float_tensor"(%q : !pdl.value)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%q, %four : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "dim_equals"(%q, %two, %one : !pdl.value, !pdl.attribute, !pdl.attribute)
  %zero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %zero : !pdl.value, !pdl.attribute)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%causal, %false : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_not_none"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%gqa : !pdl.value)
  pdl.rewrite %sdpa {
    %op = pdl.attribute = "attention"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %q, %k, %v, %mask, %causal, %scale, %gqa, %sdpa : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}

// the same with scale=None   ->   pdlkit_call("attention", ..., scale=0.0) (0.0: 1 / sqrt(D))
pdl.pattern @decode_attention_default_scale : benefit(4) {
  %q = pdl.operand
  %k = pdl.operand
  %v = pdl.operand
  %mask = pdl.operand
  %dropout = pdl.operand
  %causal = pdl.operand
  %scale = pdl.operand
  %gqa = pdl.operand
  %ty = pdl.type
  %sdpa = pdl.operation "torch.aten.scaled_dot_product_attention"(%q, %k, %v, %mask, %dropout, %causal, %scale, %gqa : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "is_float_tensor"(%q : !pdl.value)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%q, %four : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "dim_equals"(%q, %two, %one : !pdl.value, !pdl.attribute, !pdl.attribute)
  %zero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %zero : !pdl.value, !pdl.attribute)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%causal, %false : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_none"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%gqa : !pdl.value)
  pdl.rewrite %sdpa {
    %op = pdl.attribute = "attention"
    %default = pdl.attribute = 0.0 : f64
    pdl.apply_native_rewrite "pdlkit_call"(%op, %q, %k, %v, %mask, %causal, %default, %gqa, %sdpa : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.value, !pdl.operation)
  }
}

// transformers' repeat_kv, as its "sdpa" attention calls it where a mask keeps SDPA's own GQA
// off (a static cache's generate passes one): k and v each go through unsqueeze(2) -> expand ->
// reshape into [B, Hq, L, D], a copy of the cache Hq / Hkv times over. The kernel reads the
// cache as it is, with its query heads grouped (enable_gqa = true): query head h takes cache
// head h // (Hq / Hkv), the head the copy gave it.
//   sdpa(q, repeat_kv(k), repeat_kv(v), mask, 0.0, false, scale, false) with one query token
//     ->   pdlkit_call("attention", q, k, v, mask, false, scale, true)
pdl.pattern @decode_attention_repeat_kv : benefit(5) {
  %q = pdl.operand
  %k = pdl.operand
  %v = pdl.operand
  %kdim = pdl.operand
  %ksizes = pdl.operand
  %kimplicit = pdl.operand
  %kshape = pdl.operand
  %kt1 = pdl.type
  %kt2 = pdl.type
  %kt3 = pdl.type
  %kunsq = pdl.operation "torch.aten.unsqueeze"(%k, %kdim : !pdl.value, !pdl.value) -> (%kt1 : !pdl.type)
  %ku = pdl.result 0 of %kunsq
  %kexp = pdl.operation "torch.aten.expand"(%ku, %ksizes, %kimplicit : !pdl.value, !pdl.value, !pdl.value) -> (%kt2 : !pdl.type)
  %ke = pdl.result 0 of %kexp
  %krep = pdl.operation "torch.aten.reshape"(%ke, %kshape : !pdl.value, !pdl.value) -> (%kt3 : !pdl.type)
  %k2 = pdl.result 0 of %krep
  %vdim = pdl.operand
  %vsizes = pdl.operand
  %vimplicit = pdl.operand
  %vshape = pdl.operand
  %vt1 = pdl.type
  %vt2 = pdl.type
  %vt3 = pdl.type
  %vunsq = pdl.operation "torch.aten.unsqueeze"(%v, %vdim : !pdl.value, !pdl.value) -> (%vt1 : !pdl.type)
  %vu = pdl.result 0 of %vunsq
  %vexp = pdl.operation "torch.aten.expand"(%vu, %vsizes, %vimplicit : !pdl.value, !pdl.value, !pdl.value) -> (%vt2 : !pdl.type)
  %ve = pdl.result 0 of %vexp
  %vrep = pdl.operation "torch.aten.reshape"(%ve, %vshape : !pdl.value, !pdl.value) -> (%vt3 : !pdl.type)
  %v2 = pdl.result 0 of %vrep
  %mask = pdl.operand
  %dropout = pdl.operand
  %causal = pdl.operand
  %scale = pdl.operand
  %gqa = pdl.operand
  %ty = pdl.type
  %sdpa = pdl.operation "torch.aten.scaled_dot_product_attention"(%q, %k2, %v2, %mask, %dropout, %causal, %scale, %gqa : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "is_float_tensor"(%q : !pdl.value)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%q, %four : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "dim_equals"(%q, %two, %one : !pdl.value, !pdl.attribute, !pdl.attribute)
  %kept = pdl.attribute = [0, 2, 3]
  %heads = pdl.attribute = [0, 1]
  pdl.apply_native_constraint "constant_equals"(%kdim, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%k, %four : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dims"(%k, %k2, %kept : !pdl.value, !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dims"(%q, %k2, %heads : !pdl.value, !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%ku : !pdl.value)
  pdl.apply_native_constraint "single_use"(%ke : !pdl.value)
  pdl.apply_native_constraint "single_use"(%k2 : !pdl.value)
  pdl.apply_native_constraint "constant_equals"(%vdim, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%v, %four : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dims"(%v, %v2, %kept : !pdl.value, !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dims"(%q, %v2, %heads : !pdl.value, !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%vu : !pdl.value)
  pdl.apply_native_constraint "single_use"(%ve : !pdl.value)
  pdl.apply_native_constraint "single_use"(%v2 : !pdl.value)
  %zero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %zero : !pdl.value, !pdl.attribute)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%causal, %false : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_not_none"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%gqa : !pdl.value)
  pdl.rewrite %sdpa {
    %op = pdl.attribute = "attention"
    %grouped = pdl.attribute = true
    pdl.apply_native_rewrite "pdlkit_call"(%op, %q, %k, %v, %mask, %causal, %scale, %grouped, %sdpa : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// the same with scale=None   ->   pdlkit_call("attention", ..., scale=0.0, true)
pdl.pattern @decode_attention_repeat_kv_default_scale : benefit(5) {
  %q = pdl.operand
  %k = pdl.operand
  %v = pdl.operand
  %kdim = pdl.operand
  %ksizes = pdl.operand
  %kimplicit = pdl.operand
  %kshape = pdl.operand
  %kt1 = pdl.type
  %kt2 = pdl.type
  %kt3 = pdl.type
  %kunsq = pdl.operation "torch.aten.unsqueeze"(%k, %kdim : !pdl.value, !pdl.value) -> (%kt1 : !pdl.type)
  %ku = pdl.result 0 of %kunsq
  %kexp = pdl.operation "torch.aten.expand"(%ku, %ksizes, %kimplicit : !pdl.value, !pdl.value, !pdl.value) -> (%kt2 : !pdl.type)
  %ke = pdl.result 0 of %kexp
  %krep = pdl.operation "torch.aten.reshape"(%ke, %kshape : !pdl.value, !pdl.value) -> (%kt3 : !pdl.type)
  %k2 = pdl.result 0 of %krep
  %vdim = pdl.operand
  %vsizes = pdl.operand
  %vimplicit = pdl.operand
  %vshape = pdl.operand
  %vt1 = pdl.type
  %vt2 = pdl.type
  %vt3 = pdl.type
  %vunsq = pdl.operation "torch.aten.unsqueeze"(%v, %vdim : !pdl.value, !pdl.value) -> (%vt1 : !pdl.type)
  %vu = pdl.result 0 of %vunsq
  %vexp = pdl.operation "torch.aten.expand"(%vu, %vsizes, %vimplicit : !pdl.value, !pdl.value, !pdl.value) -> (%vt2 : !pdl.type)
  %ve = pdl.result 0 of %vexp
  %vrep = pdl.operation "torch.aten.reshape"(%ve, %vshape : !pdl.value, !pdl.value) -> (%vt3 : !pdl.type)
  %v2 = pdl.result 0 of %vrep
  %mask = pdl.operand
  %dropout = pdl.operand
  %causal = pdl.operand
  %scale = pdl.operand
  %gqa = pdl.operand
  %ty = pdl.type
  %sdpa = pdl.operation "torch.aten.scaled_dot_product_attention"(%q, %k2, %v2, %mask, %dropout, %causal, %scale, %gqa : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "is_float_tensor"(%q : !pdl.value)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%q, %four : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "dim_equals"(%q, %two, %one : !pdl.value, !pdl.attribute, !pdl.attribute)
  %kept = pdl.attribute = [0, 2, 3]
  %heads = pdl.attribute = [0, 1]
  pdl.apply_native_constraint "constant_equals"(%kdim, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%k, %four : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dims"(%k, %k2, %kept : !pdl.value, !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dims"(%q, %k2, %heads : !pdl.value, !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%ku : !pdl.value)
  pdl.apply_native_constraint "single_use"(%ke : !pdl.value)
  pdl.apply_native_constraint "single_use"(%k2 : !pdl.value)
  pdl.apply_native_constraint "constant_equals"(%vdim, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%v, %four : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dims"(%v, %v2, %kept : !pdl.value, !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dims"(%q, %v2, %heads : !pdl.value, !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%vu : !pdl.value)
  pdl.apply_native_constraint "single_use"(%ve : !pdl.value)
  pdl.apply_native_constraint "single_use"(%v2 : !pdl.value)
  %zero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %zero : !pdl.value, !pdl.attribute)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%causal, %false : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_none"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%gqa : !pdl.value)
  pdl.rewrite %sdpa {
    %op = pdl.attribute = "attention"
    %grouped = pdl.attribute = true
    %default = pdl.attribute = 0.0 : f64
    pdl.apply_native_rewrite "pdlkit_call"(%op, %q, %k, %v, %mask, %causal, %default, %grouped, %sdpa : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.attribute, !pdl.operation)
  }
}
