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
