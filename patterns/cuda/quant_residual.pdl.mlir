// One decoder layer's o- and down-projections from their float input on (kernels/cuda/fused.py's
// quant_int8_linear_residual): the per-token quantization (int8_dynamic.pdl.mlir's
// @quantize_per_token chain), the int8 GEMM and its rescale, the residual add, as one op; for one
// row one launch (the GEMM quantizes the row itself), two above. Off by default in int8.yaml
// (see the reason there); benefit 9 puts it before llama.pdl.mlir's RMSNorm + quantize (8) and
// residual (7) patterns, which take the same ops when it is off.

// residual + reshape(to(_int_mm(q, t(w)) * s * ws, dt)) where (q, s) is the per-token quantization
// of x (int8_dynamic.pdl.mlir's @quantize_per_token chain) and q feeds this GEMM alone: the
// o- and down-projections of a decoder layer, from the float activation on
//   ->   pdlkit_call("quant_int8_linear_residual", x, eps, 127.0, w, ws, residual, dt, shape)
pdl.pattern @quant_int8_linear_residual : benefit(9) {
  %x = pdl.operand
  %f32 = pdl.operand
  %xfnb = pdl.operand
  %xfcp = pdl.operand
  %xfmf = pdl.operand
  %xfty = pdl.type
  %xfop = pdl.operation "torch.aten.to.dtype"(%x, %f32, %xfnb, %xfcp, %xfmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%xfty : !pdl.type)
  %xf = pdl.result 0 of %xfop
  %at = pdl.type
  %absop = pdl.operation "torch.aten.abs"(%xf : !pdl.value) -> (%at : !pdl.type)
  %abs = pdl.result 0 of %absop
  %dims = pdl.operand
  %keep = pdl.operand
  %amt = pdl.type
  %amaxop = pdl.operation "torch.aten.amax"(%abs, %dims, %keep : !pdl.value, !pdl.value, !pdl.value) -> (%amt : !pdl.type)
  %amax = pdl.result 0 of %amaxop
  %eps = pdl.operand
  %nomax = pdl.operand
  %ct = pdl.type
  %clop = pdl.operation "torch.aten.clamp"(%amax, %eps, %nomax : !pdl.value, !pdl.value, !pdl.value) -> (%ct : !pdl.type)
  %cl = pdl.result 0 of %clop
  %qmax = pdl.operand
  %st = pdl.type
  %sop = pdl.operation "torch.aten.div.Scalar"(%cl, %qmax : !pdl.value, !pdl.value) -> (%st : !pdl.type)
  %s = pdl.result 0 of %sop
  %dt = pdl.type
  %dop = pdl.operation "torch.aten.div.Tensor"(%xf, %s : !pdl.value, !pdl.value) -> (%dt : !pdl.type)
  %d = pdl.result 0 of %dop
  %rt = pdl.type
  %rop = pdl.operation "torch.aten.round"(%d : !pdl.value) -> (%rt : !pdl.type)
  %r = pdl.result 0 of %rop
  %lo = pdl.operand
  %hi = pdl.operand
  %c2t = pdl.type
  %c2op = pdl.operation "torch.aten.clamp"(%r, %lo, %hi : !pdl.value, !pdl.value, !pdl.value) -> (%c2t : !pdl.type)
  %c2 = pdl.result 0 of %c2op
  %i8 = pdl.operand
  %qnb = pdl.operand
  %qcp = pdl.operand
  %qmf = pdl.operand
  %qty = pdl.type
  %qop = pdl.operation "torch.aten.to.dtype"(%c2, %i8, %qnb, %qcp, %qmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%qty : !pdl.type)
  %q = pdl.result 0 of %qop
  %six = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%f32, %six : !pdl.value, !pdl.attribute)
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%i8, %one : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%x, %two : !pdl.value, !pdl.attribute)
  %last = pdl.attribute = [-1]
  pdl.apply_native_constraint "constant_equals"(%dims, %last : !pdl.value, !pdl.attribute)
  %true = pdl.attribute = true
  pdl.apply_native_constraint "constant_equals"(%keep, %true : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%eps : !pdl.value)
  pdl.apply_native_constraint "is_none"(%nomax : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%qmax : !pdl.value)
  %m127 = pdl.attribute = -1.270000e+02 : f64
  pdl.apply_native_constraint "constant_equals"(%lo, %m127 : !pdl.value, !pdl.attribute)
  %p127 = pdl.attribute = 1.270000e+02 : f64
  pdl.apply_native_constraint "constant_equals"(%hi, %p127 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%qmax, %p127 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%abs : !pdl.value)
  pdl.apply_native_constraint "single_use"(%amax : !pdl.value)
  pdl.apply_native_constraint "single_use"(%cl : !pdl.value)
  pdl.apply_native_constraint "single_use"(%d : !pdl.value)
  pdl.apply_native_constraint "single_use"(%r : !pdl.value)
  pdl.apply_native_constraint "single_use"(%c2 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%q : !pdl.value)
  %lw = pdl.operand
  %lws = pdl.operand
  %ltt = pdl.type
  %ltop = pdl.operation "torch.aten.t"(%lw : !pdl.value) -> (%ltt : !pdl.type)
  %lwt = pdl.result 0 of %ltop
  %lti = pdl.type
  %lmmop = pdl.operation "torch.aten._int_mm"(%q, %lwt : !pdl.value, !pdl.value) -> (%lti : !pdl.type)
  %lmm = pdl.result 0 of %lmmop
  %lf32 = pdl.operand
  %laccnb = pdl.operand
  %lacccp = pdl.operand
  %laccmf = pdl.operand
  %laccty = pdl.type
  %laccop = pdl.operation "torch.aten.to.dtype"(%lmm, %lf32, %laccnb, %lacccp, %laccmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%laccty : !pdl.type)
  %lacc = pdl.result 0 of %laccop
  %lt1 = pdl.type
  %lm1op = pdl.operation "torch.aten.mul.Tensor"(%lacc, %s : !pdl.value, !pdl.value) -> (%lt1 : !pdl.type)
  %lm1 = pdl.result 0 of %lm1op
  %lt2 = pdl.type
  %lm2op = pdl.operation "torch.aten.mul.Tensor"(%lm1, %lws : !pdl.value, !pdl.value) -> (%lt2 : !pdl.type)
  %lm2 = pdl.result 0 of %lm2op
  %ldt = pdl.operand
  %loutnb = pdl.operand
  %loutcp = pdl.operand
  %loutmf = pdl.operand
  %loutty = pdl.type
  %loutop = pdl.operation "torch.aten.to.dtype"(%lm2, %ldt, %loutnb, %loutcp, %loutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%loutty : !pdl.type)
  %lout = pdl.result 0 of %loutop
  %lsix = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%lf32, %lsix : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%ldt : !pdl.value)
  %ltwo = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%lw, %ltwo : !pdl.value, !pdl.attribute)
  %lone = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "has_rank"(%lws, %lone : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%lmm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%lacc : !pdl.value)
  pdl.apply_native_constraint "single_use"(%lm1 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%lm2 : !pdl.value)
  %rshape = pdl.operand
  %rrt = pdl.type
  %rrop = pdl.operation "torch.aten.reshape"(%lout, %rshape : !pdl.value, !pdl.value) -> (%rrt : !pdl.type)
  %rr = pdl.result 0 of %rrop
  pdl.apply_native_constraint "single_use"(%lout : !pdl.value)
  pdl.apply_native_constraint "single_use"(%rr : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%rshape : !pdl.value)
  %res = pdl.operand
  %ralpha = pdl.operand
  %rat = pdl.type
  %raddop = pdl.operation "torch.aten.add.Tensor"(%res, %rr, %ralpha : !pdl.value, !pdl.value, !pdl.value) -> (%rat : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%ralpha, %lone : !pdl.value, !pdl.attribute)
  pdl.rewrite %raddop {
    %lop = pdl.attribute = "quant_int8_linear_residual"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %x, %eps, %qmax, %lw, %lws, %res, %ldt, %rshape, %raddop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
