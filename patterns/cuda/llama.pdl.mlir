// The fusions of an int8 Llama decoder layer on CUDA (kernels/cuda/fused.py), over the graph that
// transformers' LlamaModel gives after pdlkit.quantization.quantize(..., "int8-dynamic-per-token"):
// Q, K and V as one launch, RMSNorm + per-token quantization as one kernel, the residual add in
// the o- and down-projection epilogues. They run before int8_dynamic.pdl.mlir's patterns
// (higher benefits), which take what these leave.

// Three int8 linears over one quantized activation (q, k and v of an attention block share
// theirs; k and v narrower under GQA): one pattern with three roots joined by %q and %xs
//   ->   pdlkit_call("int8_linear3", q, xs, w0, s0, w1, s1, w2, s2, dt)
pdl.pattern @int8_linear3 : benefit(20) {
  %q = pdl.operand
  %xs = pdl.operand
  %aw = pdl.operand
  %aws = pdl.operand
  %att = pdl.type
  %atop = pdl.operation "torch.aten.t"(%aw : !pdl.value) -> (%att : !pdl.type)
  %awt = pdl.result 0 of %atop
  %ati = pdl.type
  %ammop = pdl.operation "torch.aten._int_mm"(%q, %awt : !pdl.value, !pdl.value) -> (%ati : !pdl.type)
  %amm = pdl.result 0 of %ammop
  %af32 = pdl.operand
  %aaccnb = pdl.operand
  %aacccp = pdl.operand
  %aaccmf = pdl.operand
  %aaccty = pdl.type
  %aaccop = pdl.operation "torch.aten.to.dtype"(%amm, %af32, %aaccnb, %aacccp, %aaccmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%aaccty : !pdl.type)
  %aacc = pdl.result 0 of %aaccop
  %at1 = pdl.type
  %am1op = pdl.operation "torch.aten.mul.Tensor"(%aacc, %xs : !pdl.value, !pdl.value) -> (%at1 : !pdl.type)
  %am1 = pdl.result 0 of %am1op
  %at2 = pdl.type
  %am2op = pdl.operation "torch.aten.mul.Tensor"(%am1, %aws : !pdl.value, !pdl.value) -> (%at2 : !pdl.type)
  %am2 = pdl.result 0 of %am2op
  %adt = pdl.operand
  %aoutnb = pdl.operand
  %aoutcp = pdl.operand
  %aoutmf = pdl.operand
  %aoutty = pdl.type
  %aoutop = pdl.operation "torch.aten.to.dtype"(%am2, %adt, %aoutnb, %aoutcp, %aoutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%aoutty : !pdl.type)
  %aout = pdl.result 0 of %aoutop
  %asix = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%af32, %asix : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%adt : !pdl.value)
  %atwo = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%aw, %atwo : !pdl.value, !pdl.attribute)
  %aone = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "has_rank"(%aws, %aone : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%amm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%aacc : !pdl.value)
  pdl.apply_native_constraint "single_use"(%am1 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%am2 : !pdl.value)
  %bw = pdl.operand
  %bws = pdl.operand
  %btt = pdl.type
  %btop = pdl.operation "torch.aten.t"(%bw : !pdl.value) -> (%btt : !pdl.type)
  %bwt = pdl.result 0 of %btop
  %bti = pdl.type
  %bmmop = pdl.operation "torch.aten._int_mm"(%q, %bwt : !pdl.value, !pdl.value) -> (%bti : !pdl.type)
  %bmm = pdl.result 0 of %bmmop
  %bf32 = pdl.operand
  %baccnb = pdl.operand
  %bacccp = pdl.operand
  %baccmf = pdl.operand
  %baccty = pdl.type
  %baccop = pdl.operation "torch.aten.to.dtype"(%bmm, %bf32, %baccnb, %bacccp, %baccmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%baccty : !pdl.type)
  %bacc = pdl.result 0 of %baccop
  %bt1 = pdl.type
  %bm1op = pdl.operation "torch.aten.mul.Tensor"(%bacc, %xs : !pdl.value, !pdl.value) -> (%bt1 : !pdl.type)
  %bm1 = pdl.result 0 of %bm1op
  %bt2 = pdl.type
  %bm2op = pdl.operation "torch.aten.mul.Tensor"(%bm1, %bws : !pdl.value, !pdl.value) -> (%bt2 : !pdl.type)
  %bm2 = pdl.result 0 of %bm2op
  %bdt = pdl.operand
  %boutnb = pdl.operand
  %boutcp = pdl.operand
  %boutmf = pdl.operand
  %boutty = pdl.type
  %boutop = pdl.operation "torch.aten.to.dtype"(%bm2, %bdt, %boutnb, %boutcp, %boutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%boutty : !pdl.type)
  %bout = pdl.result 0 of %boutop
  %bsix = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%bf32, %bsix : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%bdt : !pdl.value)
  %btwo = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%bw, %btwo : !pdl.value, !pdl.attribute)
  %bone = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "has_rank"(%bws, %bone : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%bmm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%bacc : !pdl.value)
  pdl.apply_native_constraint "single_use"(%bm1 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%bm2 : !pdl.value)
  %cw = pdl.operand
  %cws = pdl.operand
  %ctt = pdl.type
  %ctop = pdl.operation "torch.aten.t"(%cw : !pdl.value) -> (%ctt : !pdl.type)
  %cwt = pdl.result 0 of %ctop
  %cti = pdl.type
  %cmmop = pdl.operation "torch.aten._int_mm"(%q, %cwt : !pdl.value, !pdl.value) -> (%cti : !pdl.type)
  %cmm = pdl.result 0 of %cmmop
  %cf32 = pdl.operand
  %caccnb = pdl.operand
  %cacccp = pdl.operand
  %caccmf = pdl.operand
  %caccty = pdl.type
  %caccop = pdl.operation "torch.aten.to.dtype"(%cmm, %cf32, %caccnb, %cacccp, %caccmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%caccty : !pdl.type)
  %cacc = pdl.result 0 of %caccop
  %ct1 = pdl.type
  %cm1op = pdl.operation "torch.aten.mul.Tensor"(%cacc, %xs : !pdl.value, !pdl.value) -> (%ct1 : !pdl.type)
  %cm1 = pdl.result 0 of %cm1op
  %ct2 = pdl.type
  %cm2op = pdl.operation "torch.aten.mul.Tensor"(%cm1, %cws : !pdl.value, !pdl.value) -> (%ct2 : !pdl.type)
  %cm2 = pdl.result 0 of %cm2op
  %cdt = pdl.operand
  %coutnb = pdl.operand
  %coutcp = pdl.operand
  %coutmf = pdl.operand
  %coutty = pdl.type
  %coutop = pdl.operation "torch.aten.to.dtype"(%cm2, %cdt, %coutnb, %coutcp, %coutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%coutty : !pdl.type)
  %cout = pdl.result 0 of %coutop
  %csix = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%cf32, %csix : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%cdt : !pdl.value)
  %ctwo = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%cw, %ctwo : !pdl.value, !pdl.attribute)
  %cone = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "has_rank"(%cws, %cone : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%cmm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%cacc : !pdl.value)
  pdl.apply_native_constraint "single_use"(%cm1 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%cm2 : !pdl.value)
  pdl.apply_native_constraint "distinct"(%amm, %bmm : !pdl.value, !pdl.value)
  pdl.apply_native_constraint "distinct"(%amm, %cmm : !pdl.value, !pdl.value)
  pdl.apply_native_constraint "distinct"(%bmm, %cmm : !pdl.value, !pdl.value)
  pdl.apply_native_constraint "same_dtype"(%aout, %bout : !pdl.value, !pdl.value)
  pdl.apply_native_constraint "same_dtype"(%aout, %cout : !pdl.value, !pdl.value)
  pdl.rewrite %aoutop {
    %lop = pdl.attribute = "int8_linear3"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %q, %xs, %aw, %aws, %bw, %bws, %cw, %cws, %adt, %aoutop, %boutop, %coutop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation, !pdl.operation, !pdl.operation)
  }
}

// Llama's RMSNorm (transformers' LlamaRMSNorm: float32 sum of squares, rsqrt, cast back,
// times the weight), flattened to rows, then the per-token quantization of
// quantization/int8_dynamic.py   ->   pdlkit_call("rmsnorm_quantize_per_token", x, weight, eps, dtype, q_eps, qmax)
pdl.pattern @rmsnorm_quantize_per_token : benefit(8) {
  %x = pdl.operand
  %weight = pdl.operand
  %eps = pdl.operand
  %dtype = pdl.operand
  %non_blocking = pdl.operand
  %copy = pdl.operand
  %memory_format = pdl.operand
  %to_t = pdl.type
  %to = pdl.operation "torch.aten.to.dtype"(%x, %dtype, %non_blocking, %copy, %memory_format : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%to_t : !pdl.type)
  %to_out = pdl.result 0 of %to
  %exponent = pdl.operand
  %pow_1_t = pdl.type
  %pow_1 = pdl.operation "torch.aten.pow.Tensor_Scalar"(%to_out, %exponent : !pdl.value, !pdl.value) -> (%pow_1_t : !pdl.type)
  %pow_1_out = pdl.result 0 of %pow_1
  %dim = pdl.operand
  %keepdim = pdl.operand
  %mean_dtype = pdl.operand
  %mean_t = pdl.type
  %mean = pdl.operation "torch.aten.mean.dim"(%pow_1_out, %dim, %keepdim, %mean_dtype : !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%mean_t : !pdl.type)
  %mean_out = pdl.result 0 of %mean
  %alpha = pdl.operand
  %add_t = pdl.type
  %add = pdl.operation "torch.aten.add.Scalar"(%mean_out, %eps, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%add_t : !pdl.type)
  %add_out = pdl.result 0 of %add
  %rsqrt_t = pdl.type
  %rsqrt = pdl.operation "torch.aten.rsqrt"(%add_out : !pdl.value) -> (%rsqrt_t : !pdl.type)
  %rsqrt_out = pdl.result 0 of %rsqrt
  %mul_t = pdl.type
  %mul = pdl.operation "torch.aten.mul.Tensor"(%to_out, %rsqrt_out : !pdl.value, !pdl.value) -> (%mul_t : !pdl.type)
  %mul_out = pdl.result 0 of %mul
  %to_1_dtype = pdl.operand
  %to_1_non_blocking = pdl.operand
  %to_1_copy = pdl.operand
  %to_1_memory_format = pdl.operand
  %to_1_t = pdl.type
  %to_1 = pdl.operation "torch.aten.to.dtype"(%mul_out, %to_1_dtype, %to_1_non_blocking, %to_1_copy, %to_1_memory_format : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%to_1_t : !pdl.type)
  %to_1_out = pdl.result 0 of %to_1
  %mul_1_t = pdl.type
  %mul_1 = pdl.operation "torch.aten.mul.Tensor"(%weight, %to_1_out : !pdl.value, !pdl.value) -> (%mul_1_t : !pdl.type)
  %mul_1_out = pdl.result 0 of %mul_1
  %shape = pdl.operand
  %reshape_t = pdl.type
  %reshape_op = pdl.operation "torch.aten.reshape"(%mul_1_out, %shape : !pdl.value, !pdl.value) -> (%reshape_t : !pdl.type)
  %dtype_value = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%dtype, %dtype_value : !pdl.value, !pdl.attribute)
  %non_blocking_value = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%non_blocking, %non_blocking_value : !pdl.value, !pdl.attribute)
  %copy_value = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%copy, %copy_value : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_none"(%memory_format : !pdl.value)
  %exponent_value = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "constant_equals"(%exponent, %exponent_value : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%pow_1_out : !pdl.value)
  %dim_value = pdl.attribute = [-1 : i64]
  pdl.apply_native_constraint "constant_equals"(%dim, %dim_value : !pdl.value, !pdl.attribute)
  %keepdim_value = pdl.attribute = true
  pdl.apply_native_constraint "constant_equals"(%keepdim, %keepdim_value : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_none"(%mean_dtype : !pdl.value)
  pdl.apply_native_constraint "single_use"(%mean_out : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%eps : !pdl.value)
  %alpha_value = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %alpha_value : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%add_out : !pdl.value)
  pdl.apply_native_constraint "single_use"(%rsqrt_out : !pdl.value)
  pdl.apply_native_constraint "single_use"(%mul_out : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%to_1_dtype : !pdl.value)
  %to_1_non_blocking_value = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%to_1_non_blocking, %to_1_non_blocking_value : !pdl.value, !pdl.attribute)
  %to_1_copy_value = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%to_1_copy, %to_1_copy_value : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_none"(%to_1_memory_format : !pdl.value)
  pdl.apply_native_constraint "single_use"(%to_1_out : !pdl.value)
  pdl.apply_native_constraint "single_use"(%mul_1_out : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%shape : !pdl.value)
  %xq = pdl.result 0 of %reshape_op
  pdl.apply_native_constraint "single_use"(%xq : !pdl.value)
    %q_f32 = pdl.operand
  %q_xfnb = pdl.operand
  %q_xfcp = pdl.operand
  %q_xfmf = pdl.operand
  %q_xfty = pdl.type
  %q_xfop = pdl.operation "torch.aten.to.dtype"(%xq, %q_f32, %q_xfnb, %q_xfcp, %q_xfmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%q_xfty : !pdl.type)
  %q_xf = pdl.result 0 of %q_xfop
  %q_at = pdl.type
  %q_absop = pdl.operation "torch.aten.abs"(%q_xf : !pdl.value) -> (%q_at : !pdl.type)
  %q_abs = pdl.result 0 of %q_absop
  %q_dims = pdl.operand
  %q_keep = pdl.operand
  %q_amt = pdl.type
  %q_amaxop = pdl.operation "torch.aten.amax"(%q_abs, %q_dims, %q_keep : !pdl.value, !pdl.value, !pdl.value) -> (%q_amt : !pdl.type)
  %q_amax = pdl.result 0 of %q_amaxop
  %q_eps = pdl.operand
  %q_nomax = pdl.operand
  %q_ct = pdl.type
  %q_clop = pdl.operation "torch.aten.clamp"(%q_amax, %q_eps, %q_nomax : !pdl.value, !pdl.value, !pdl.value) -> (%q_ct : !pdl.type)
  %q_cl = pdl.result 0 of %q_clop
  %q_qmax = pdl.operand
  %q_st = pdl.type
  %q_sop = pdl.operation "torch.aten.div.Scalar"(%q_cl, %q_qmax : !pdl.value, !pdl.value) -> (%q_st : !pdl.type)
  %q_s = pdl.result 0 of %q_sop
  %q_dt = pdl.type
  %q_dop = pdl.operation "torch.aten.div.Tensor"(%q_xf, %q_s : !pdl.value, !pdl.value) -> (%q_dt : !pdl.type)
  %q_d = pdl.result 0 of %q_dop
  %q_rt = pdl.type
  %q_rop = pdl.operation "torch.aten.round"(%q_d : !pdl.value) -> (%q_rt : !pdl.type)
  %q_r = pdl.result 0 of %q_rop
  %q_lo = pdl.operand
  %q_hi = pdl.operand
  %q_c2t = pdl.type
  %q_c2op = pdl.operation "torch.aten.clamp"(%q_r, %q_lo, %q_hi : !pdl.value, !pdl.value, !pdl.value) -> (%q_c2t : !pdl.type)
  %q_c2 = pdl.result 0 of %q_c2op
  %q_i8 = pdl.operand
  %q_qnb = pdl.operand
  %q_qcp = pdl.operand
  %q_qmf = pdl.operand
  %q_qty = pdl.type
  %q_qop = pdl.operation "torch.aten.to.dtype"(%q_c2, %q_i8, %q_qnb, %q_qcp, %q_qmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%q_qty : !pdl.type)
  %q_q = pdl.result 0 of %q_qop
  %q_six = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%q_f32, %q_six : !pdl.value, !pdl.attribute)
  %q_one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%q_i8, %q_one : !pdl.value, !pdl.attribute)
  %q_two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%xq, %q_two : !pdl.value, !pdl.attribute)
  %q_last = pdl.attribute = [-1]
  pdl.apply_native_constraint "constant_equals"(%q_dims, %q_last : !pdl.value, !pdl.attribute)
  %q_true = pdl.attribute = true
  pdl.apply_native_constraint "constant_equals"(%q_keep, %q_true : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%q_eps : !pdl.value)
  pdl.apply_native_constraint "is_none"(%q_nomax : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%q_qmax : !pdl.value)
  %q_m127 = pdl.attribute = -1.270000e+02 : f64
  pdl.apply_native_constraint "constant_equals"(%q_lo, %q_m127 : !pdl.value, !pdl.attribute)
  %q_p127 = pdl.attribute = 1.270000e+02 : f64
  pdl.apply_native_constraint "constant_equals"(%q_hi, %q_p127 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%q_qmax, %q_p127 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%q_abs : !pdl.value)
  pdl.apply_native_constraint "single_use"(%q_amax : !pdl.value)
  pdl.apply_native_constraint "single_use"(%q_cl : !pdl.value)
  pdl.apply_native_constraint "single_use"(%q_d : !pdl.value)
  pdl.apply_native_constraint "single_use"(%q_r : !pdl.value)
  pdl.apply_native_constraint "single_use"(%q_c2 : !pdl.value)
  pdl.rewrite %q_qop {
    %lop = pdl.attribute = "rmsnorm_quantize_per_token"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %x, %weight, %eps, %to_1_dtype, %q_eps, %q_qmax, %q_qop, %q_sop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation, !pdl.operation)
  }
}

// residual + reshape(to(_int_mm(q, t(w)) * xs * ws, dt))   (a decoder layer's "hidden_states =
// residual + hidden_states" after the o- and down-projections)
//   ->   pdlkit_call("int8_linear_residual", q, xs, w, ws, residual, dt, shape)
pdl.pattern @int8_linear_residual : benefit(7) {
  %q = pdl.operand
  %xs = pdl.operand
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
  %lm1op = pdl.operation "torch.aten.mul.Tensor"(%lacc, %xs : !pdl.value, !pdl.value) -> (%lt1 : !pdl.type)
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
    %lop = pdl.attribute = "int8_linear_residual"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %q, %xs, %lw, %lws, %res, %ldt, %rshape, %raddop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
