// int8 dynamic per-token quantization in plain torch ops (pdlkit.quantization.int8_dynamic,
// the form `torch._int_mm` users write): the SiLU-gated GEMM pair of a Llama MLP, a GEMM with
// its rescale epilogue, and the per-token quantization itself. Longer chains first.

// silu(view(L(q, wg))) * view(L(q, wu))   ->   pdlkit_call("int8_gated_silu", q, xs, wg, sg, wu, su, dtype, shape)
pdl.pattern @int8_gated_silu_3d : benefit(12) {
  %q = pdl.operand
  %xs = pdl.operand
  %gw = pdl.operand
  %gws = pdl.operand
  %gtt = pdl.type
  %gtop = pdl.operation "torch.aten.t"(%gw : !pdl.value) -> (%gtt : !pdl.type)
  %gwt = pdl.result 0 of %gtop
  %gti = pdl.type
  %gmmop = pdl.operation "torch.aten._int_mm"(%q, %gwt : !pdl.value, !pdl.value) -> (%gti : !pdl.type)
  %gmm = pdl.result 0 of %gmmop
  %gf32 = pdl.operand
  %gaccnb = pdl.operand
  %gacccp = pdl.operand
  %gaccmf = pdl.operand
  %gaccty = pdl.type
  %gaccop = pdl.operation "torch.aten.to.dtype"(%gmm, %gf32, %gaccnb, %gacccp, %gaccmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%gaccty : !pdl.type)
  %gacc = pdl.result 0 of %gaccop
  %gt1 = pdl.type
  %gm1op = pdl.operation "torch.aten.mul.Tensor"(%gacc, %xs : !pdl.value, !pdl.value) -> (%gt1 : !pdl.type)
  %gm1 = pdl.result 0 of %gm1op
  %gt2 = pdl.type
  %gm2op = pdl.operation "torch.aten.mul.Tensor"(%gm1, %gws : !pdl.value, !pdl.value) -> (%gt2 : !pdl.type)
  %gm2 = pdl.result 0 of %gm2op
  %gdt = pdl.operand
  %goutnb = pdl.operand
  %goutcp = pdl.operand
  %goutmf = pdl.operand
  %goutty = pdl.type
  %goutop = pdl.operation "torch.aten.to.dtype"(%gm2, %gdt, %goutnb, %goutcp, %goutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%goutty : !pdl.type)
  %gout = pdl.result 0 of %goutop
  %gsix = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%gf32, %gsix : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%gdt : !pdl.value)
  %gtwo = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%gw, %gtwo : !pdl.value, !pdl.attribute)
  %gone = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "has_rank"(%gws, %gone : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%gmm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%gacc : !pdl.value)
  pdl.apply_native_constraint "single_use"(%gm1 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%gm2 : !pdl.value)
  %uw = pdl.operand
  %uws = pdl.operand
  %utt = pdl.type
  %utop = pdl.operation "torch.aten.t"(%uw : !pdl.value) -> (%utt : !pdl.type)
  %uwt = pdl.result 0 of %utop
  %uti = pdl.type
  %ummop = pdl.operation "torch.aten._int_mm"(%q, %uwt : !pdl.value, !pdl.value) -> (%uti : !pdl.type)
  %umm = pdl.result 0 of %ummop
  %uf32 = pdl.operand
  %uaccnb = pdl.operand
  %uacccp = pdl.operand
  %uaccmf = pdl.operand
  %uaccty = pdl.type
  %uaccop = pdl.operation "torch.aten.to.dtype"(%umm, %uf32, %uaccnb, %uacccp, %uaccmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%uaccty : !pdl.type)
  %uacc = pdl.result 0 of %uaccop
  %ut1 = pdl.type
  %um1op = pdl.operation "torch.aten.mul.Tensor"(%uacc, %xs : !pdl.value, !pdl.value) -> (%ut1 : !pdl.type)
  %um1 = pdl.result 0 of %um1op
  %ut2 = pdl.type
  %um2op = pdl.operation "torch.aten.mul.Tensor"(%um1, %uws : !pdl.value, !pdl.value) -> (%ut2 : !pdl.type)
  %um2 = pdl.result 0 of %um2op
  %udt = pdl.operand
  %uoutnb = pdl.operand
  %uoutcp = pdl.operand
  %uoutmf = pdl.operand
  %uoutty = pdl.type
  %uoutop = pdl.operation "torch.aten.to.dtype"(%um2, %udt, %uoutnb, %uoutcp, %uoutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%uoutty : !pdl.type)
  %uout = pdl.result 0 of %uoutop
  %usix = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%uf32, %usix : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%udt : !pdl.value)
  %utwo = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%uw, %utwo : !pdl.value, !pdl.attribute)
  %uone = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "has_rank"(%uws, %uone : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%umm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%uacc : !pdl.value)
  pdl.apply_native_constraint "single_use"(%um1 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%um2 : !pdl.value)
  %gshape = pdl.operand
  %grt = pdl.type
  %grop = pdl.operation "torch.aten.reshape"(%gout, %gshape : !pdl.value, !pdl.value) -> (%grt : !pdl.type)
  %gr = pdl.result 0 of %grop
  %ushape = pdl.operand
  %urt = pdl.type
  %urop = pdl.operation "torch.aten.reshape"(%uout, %ushape : !pdl.value, !pdl.value) -> (%urt : !pdl.type)
  %ur = pdl.result 0 of %urop
  pdl.apply_native_constraint "single_use"(%gout : !pdl.value)
  pdl.apply_native_constraint "single_use"(%uout : !pdl.value)
  %st = pdl.type
  %siluop = pdl.operation "torch.aten.silu"(%gr : !pdl.value) -> (%st : !pdl.type)
  %silu = pdl.result 0 of %siluop
  pdl.apply_native_constraint "single_use"(%gr : !pdl.value)
  %ht = pdl.type
  %hop = pdl.operation "torch.aten.mul.Tensor"(%silu, %ur : !pdl.value, !pdl.value) -> (%ht : !pdl.type)
  pdl.apply_native_constraint "single_use"(%silu : !pdl.value)
  pdl.apply_native_constraint "single_use"(%ur : !pdl.value)
  pdl.apply_native_constraint "same_dtype"(%gout, %uout : !pdl.value, !pdl.value)
  pdl.rewrite %hop {
    %lop = pdl.attribute = "int8_gated_silu"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %q, %xs, %gw, %gws, %uw, %uws, %udt, %ushape, %hop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}

// silu(L(q, wg)) * L(q, wu)   ->   pdlkit_call("int8_gated_silu", q, xs, wg, sg, wu, su, dtype, None)
pdl.pattern @int8_gated_silu : benefit(11) {
  %q = pdl.operand
  %xs = pdl.operand
  %gw = pdl.operand
  %gws = pdl.operand
  %gtt = pdl.type
  %gtop = pdl.operation "torch.aten.t"(%gw : !pdl.value) -> (%gtt : !pdl.type)
  %gwt = pdl.result 0 of %gtop
  %gti = pdl.type
  %gmmop = pdl.operation "torch.aten._int_mm"(%q, %gwt : !pdl.value, !pdl.value) -> (%gti : !pdl.type)
  %gmm = pdl.result 0 of %gmmop
  %gf32 = pdl.operand
  %gaccnb = pdl.operand
  %gacccp = pdl.operand
  %gaccmf = pdl.operand
  %gaccty = pdl.type
  %gaccop = pdl.operation "torch.aten.to.dtype"(%gmm, %gf32, %gaccnb, %gacccp, %gaccmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%gaccty : !pdl.type)
  %gacc = pdl.result 0 of %gaccop
  %gt1 = pdl.type
  %gm1op = pdl.operation "torch.aten.mul.Tensor"(%gacc, %xs : !pdl.value, !pdl.value) -> (%gt1 : !pdl.type)
  %gm1 = pdl.result 0 of %gm1op
  %gt2 = pdl.type
  %gm2op = pdl.operation "torch.aten.mul.Tensor"(%gm1, %gws : !pdl.value, !pdl.value) -> (%gt2 : !pdl.type)
  %gm2 = pdl.result 0 of %gm2op
  %gdt = pdl.operand
  %goutnb = pdl.operand
  %goutcp = pdl.operand
  %goutmf = pdl.operand
  %goutty = pdl.type
  %goutop = pdl.operation "torch.aten.to.dtype"(%gm2, %gdt, %goutnb, %goutcp, %goutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%goutty : !pdl.type)
  %gout = pdl.result 0 of %goutop
  %gsix = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%gf32, %gsix : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%gdt : !pdl.value)
  %gtwo = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%gw, %gtwo : !pdl.value, !pdl.attribute)
  %gone = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "has_rank"(%gws, %gone : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%gmm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%gacc : !pdl.value)
  pdl.apply_native_constraint "single_use"(%gm1 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%gm2 : !pdl.value)
  %uw = pdl.operand
  %uws = pdl.operand
  %utt = pdl.type
  %utop = pdl.operation "torch.aten.t"(%uw : !pdl.value) -> (%utt : !pdl.type)
  %uwt = pdl.result 0 of %utop
  %uti = pdl.type
  %ummop = pdl.operation "torch.aten._int_mm"(%q, %uwt : !pdl.value, !pdl.value) -> (%uti : !pdl.type)
  %umm = pdl.result 0 of %ummop
  %uf32 = pdl.operand
  %uaccnb = pdl.operand
  %uacccp = pdl.operand
  %uaccmf = pdl.operand
  %uaccty = pdl.type
  %uaccop = pdl.operation "torch.aten.to.dtype"(%umm, %uf32, %uaccnb, %uacccp, %uaccmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%uaccty : !pdl.type)
  %uacc = pdl.result 0 of %uaccop
  %ut1 = pdl.type
  %um1op = pdl.operation "torch.aten.mul.Tensor"(%uacc, %xs : !pdl.value, !pdl.value) -> (%ut1 : !pdl.type)
  %um1 = pdl.result 0 of %um1op
  %ut2 = pdl.type
  %um2op = pdl.operation "torch.aten.mul.Tensor"(%um1, %uws : !pdl.value, !pdl.value) -> (%ut2 : !pdl.type)
  %um2 = pdl.result 0 of %um2op
  %udt = pdl.operand
  %uoutnb = pdl.operand
  %uoutcp = pdl.operand
  %uoutmf = pdl.operand
  %uoutty = pdl.type
  %uoutop = pdl.operation "torch.aten.to.dtype"(%um2, %udt, %uoutnb, %uoutcp, %uoutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%uoutty : !pdl.type)
  %uout = pdl.result 0 of %uoutop
  %usix = pdl.attribute = 6 : i64
  pdl.apply_native_constraint "constant_equals"(%uf32, %usix : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%udt : !pdl.value)
  %utwo = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%uw, %utwo : !pdl.value, !pdl.attribute)
  %uone = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "has_rank"(%uws, %uone : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%umm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%uacc : !pdl.value)
  pdl.apply_native_constraint "single_use"(%um1 : !pdl.value)
  pdl.apply_native_constraint "single_use"(%um2 : !pdl.value)
  %st = pdl.type
  %siluop = pdl.operation "torch.aten.silu"(%gout : !pdl.value) -> (%st : !pdl.type)
  %silu = pdl.result 0 of %siluop
  pdl.apply_native_constraint "single_use"(%gout : !pdl.value)
  %ht = pdl.type
  %hop = pdl.operation "torch.aten.mul.Tensor"(%silu, %uout : !pdl.value, !pdl.value) -> (%ht : !pdl.type)
  pdl.apply_native_constraint "single_use"(%silu : !pdl.value)
  pdl.apply_native_constraint "single_use"(%uout : !pdl.value)
  pdl.apply_native_constraint "same_dtype"(%gout, %uout : !pdl.value, !pdl.value)
  pdl.rewrite %hop {
    %none = pdl.attribute = unit
    %lop = pdl.attribute = "int8_gated_silu"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %q, %xs, %gw, %gws, %uw, %uws, %udt, %none, %hop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// to(_int_mm(q, t(w)) * xs * ws + b, dt)   ->   pdlkit_call("int8_linear", q, xs, w, ws, b, dt)
pdl.pattern @int8_linear_bias : benefit(6) {
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
  %lb = pdl.operand
  %lalpha = pdl.operand
  %lt3 = pdl.type
  %laddop = pdl.operation "torch.aten.add.Tensor"(%lm2, %lb, %lalpha : !pdl.value, !pdl.value, !pdl.value) -> (%lt3 : !pdl.type)
  %ladd = pdl.result 0 of %laddop
  %ldt = pdl.operand
  %loutnb = pdl.operand
  %loutcp = pdl.operand
  %loutmf = pdl.operand
  %loutty = pdl.type
  %loutop = pdl.operation "torch.aten.to.dtype"(%ladd, %ldt, %loutnb, %loutcp, %loutmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%loutty : !pdl.type)
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
  pdl.apply_native_constraint "single_use"(%ladd : !pdl.value)
  pdl.apply_native_constraint "constant_equals"(%lalpha, %lone : !pdl.value, !pdl.attribute)
  pdl.rewrite %loutop {
    %lop = pdl.attribute = "int8_linear"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %q, %xs, %lw, %lws, %lb, %ldt, %loutop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}

// to(_int_mm(q, t(w)) * xs * ws, dt)   ->   pdlkit_call("int8_linear", q, xs, w, ws, None, dt)
pdl.pattern @int8_linear : benefit(5) {
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
  pdl.rewrite %loutop {
    %none = pdl.attribute = unit
    %lop = pdl.attribute = "int8_linear"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %q, %xs, %lw, %lws, %none, %ldt, %loutop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.value, !pdl.operation)
  }
}

// to(clamp(round(x / s), -127, 127), int8), s = clamp(amax|x|, eps) / 127   ->   pdlkit_call("quantize_per_token", x, eps, 127.0)
pdl.pattern @quantize_per_token : benefit(4) {
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
  pdl.rewrite %qop {
    %lop = pdl.attribute = "quantize_per_token"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %x, %eps, %qmax, %qop, %sop : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.operation, !pdl.operation)
  }
}
