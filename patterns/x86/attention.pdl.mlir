// PT2E int8 attention (X86InductorQuantizer): aten.scaled_dot_product_attention (dropout 0,
// no GQA) whose FP32 result only feeds quantize_per_tensor -> one AVX512_BF16 kernel that
// computes attention and quantizes in its store (kernels/x86/attention.c, op "attention_q").
// The mask may be a tensor or None (it reaches the kernel as None); scale=None is passed as
// 0.0, the kernel's convention for 1/sqrt(D).

// sdpa(q, k, v, mask, 0.0, causal, scale) -> q(., s, zp, qmin, qmax)   ->   pdlkit_call("attention_q", ...)
pdl.pattern @attention_q : benefit(4) {
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
  %f32 = pdl.attribute = "f32"
  pdl.apply_native_constraint "has_dtype"(%q, %f32 : !pdl.value, !pdl.attribute)
  %zero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%causal : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_not_none"(%scale : !pdl.value)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%gqa, %false : !pdl.value, !pdl.attribute)
  %y = pdl.result 0 of %sdpa
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %quant = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%y, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omin : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omax : !pdl.value)
  pdl.rewrite %quant {
    %op = pdl.attribute = "attention_q"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %q, %k, %v, %mask, %causal, %scale, %os, %ozp, %omin, %omax, %quant : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}

// sdpa(q, k, v, mask, 0.0, causal, scale=None) -> q(., s, zp, qmin, qmax)   ->   pdlkit_call("attention_q", ..., scale=0.0)
pdl.pattern @attention_q_default_scale : benefit(4) {
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
  %f32 = pdl.attribute = "f32"
  pdl.apply_native_constraint "has_dtype"(%q, %f32 : !pdl.value, !pdl.attribute)
  %zero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%causal : !pdl.value)
  pdl.apply_native_constraint "is_none"(%scale : !pdl.value)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%gqa, %false : !pdl.value, !pdl.attribute)
  %y = pdl.result 0 of %sdpa
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %quant = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%y, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omin : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omax : !pdl.value)
  pdl.rewrite %quant {
    %op = pdl.attribute = "attention_q"
    %default = pdl.attribute = 0.0 : f64
    pdl.apply_native_rewrite "pdlkit_call"(%op, %q, %k, %v, %mask, %causal, %default, %os, %ozp, %omin, %omax, %quant : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}

// sdpa(q, k, v, mask, 0.0, causal, scale) -> reshape(same shape) -> transpose(1, 2) -> reshape([B, S, H * D]) -> q(...)   ->   pdlkit_call("attention_q_merged", ...)
// (PT2E BERT: X86InductorQuantizer quantizes the merged heads that the output projection reads)
pdl.pattern @attention_q_merged : benefit(6) {
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
  %f32 = pdl.attribute = "f32"
  pdl.apply_native_constraint "has_dtype"(%q, %f32 : !pdl.value, !pdl.attribute)
  %zero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%causal : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_not_none"(%scale : !pdl.value)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%gqa, %false : !pdl.value, !pdl.attribute)
  %y = pdl.result 0 of %sdpa
  %shape0 = pdl.operand
  %same = pdl.operation "torch.aten.reshape"(%y, %shape0 : !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %y0 = pdl.result 0 of %same
  %one = pdl.operand
  %two = pdl.operand
  %tt = pdl.type
  %tr = pdl.operation "torch.aten.transpose.int"(%y0, %one, %two : !pdl.value, !pdl.value, !pdl.value) -> (%tt : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y0 : !pdl.value)
  %i1 = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%one, %i1 : !pdl.value, !pdl.attribute)
  %i2 = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "constant_equals"(%two, %i2 : !pdl.value, !pdl.attribute)
  %yt = pdl.result 0 of %tr
  %shape1 = pdl.operand
  %tm = pdl.type
  %merge = pdl.operation "torch.aten.reshape"(%yt, %shape1 : !pdl.value, !pdl.value) -> (%tm : !pdl.type)
  pdl.apply_native_constraint "single_use"(%yt : !pdl.value)
  %ym = pdl.result 0 of %merge
  %three = pdl.attribute = 3 : i64
  pdl.apply_native_constraint "has_rank"(%ym, %three : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%ym : !pdl.value)
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %quant = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%ym, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omin : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omax : !pdl.value)
  pdl.rewrite %quant {
    %op = pdl.attribute = "attention_q_merged"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %q, %k, %v, %mask, %causal, %scale, %os, %ozp, %omin, %omax, %quant : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
