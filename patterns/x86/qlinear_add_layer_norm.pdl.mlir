// PT2E int8 transformer blocks, the output projections (attention output and FFN down):
// dequantize -> linear [-> dropout(eval)] -> add(., residual) -> layer_norm [-> quantize].
// One VNNI GEMM finishes each block of rows with the add, the LayerNorm and the codes while
// the rows are in L1 (kernels/x86/qgemm_vnni.c): the float32 result replaces the LayerNorm
// (it feeds the next residual add), the codes replace the quantize (they feed the next GEMM).
// Without this, Inductor runs add + LayerNorm + quantize as a kernel of its own that reads the
// GEMM's float32 output back (about 88 us per 512 x 256 call on a Zen 4 core).

// dq(x), dq(w) -> linear -> dropout(train=False) -> add(., residual) -> layer_norm -> q(., s, zp, qmin, qmax)   ->   pdlkit_call("qlinear_add_layer_norm_q", ..., residual, layer_norm, q)
pdl.pattern @qlinear_dropout_add_layer_norm_q : benefit(10) {
  %xq = pdl.operand
  %xs = pdl.operand
  %xzp = pdl.operand
  %xmin = pdl.operand
  %xmax = pdl.operand
  %xdt = pdl.operand
  %xod = pdl.operand
  %tx = pdl.type
  %dqx = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%xq, %xs, %xzp, %xmin, %xmax, %xdt, %xod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tx : !pdl.type)
  %x = pdl.result 0 of %dqx
  %wq = pdl.operand
  %ws = pdl.operand
  %wzp = pdl.operand
  %wax = pdl.operand
  %wmin = pdl.operand
  %wmax = pdl.operand
  %wdt = pdl.operand
  %wod = pdl.operand
  %tw = pdl.type
  %dqw = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wq, %ws, %wzp, %wax, %wmin, %wmax, %wdt, %wod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tw : !pdl.type)
  %w = pdl.result 0 of %dqw
  %b = pdl.operand
  %ty = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %lin
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %p = pdl.operand
  %train = pdl.operand
  %drop = pdl.operation "torch.aten.dropout"(%y, %p, %train : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%train, %false : !pdl.value, !pdl.attribute)
  %d = pdl.result 0 of %drop
  pdl.apply_native_constraint "single_use"(%d : !pdl.value)
  %res = pdl.operand
  %alpha = pdl.operand
  %add = pdl.operation "torch.aten.add.Tensor"(%d, %res, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_float_tensor"(%res : !pdl.value)
  %s = pdl.result 0 of %add
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
  %shape = pdl.operand
  %g = pdl.operand
  %beta = pdl.operand
  %eps = pdl.operand
  %cudnn = pdl.operand
  %ln = pdl.operation "torch.aten.layer_norm"(%s, %shape, %g, %beta, %eps, %cudnn : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%shape : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%eps : !pdl.value)
  %n = pdl.result 0 of %ln
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %quant = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%n, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omin : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omax : !pdl.value)
  pdl.rewrite %quant {
    %op = pdl.attribute = "qlinear_add_layer_norm_q"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %res, %shape, %g, %beta, %eps, %os, %ozp, %omin, %omax, %ln, %quant : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear -> add(., residual) -> layer_norm -> q(., s, zp, qmin, qmax)   ->   pdlkit_call("qlinear_add_layer_norm_q", ..., residual, layer_norm, q)
pdl.pattern @qlinear_add_layer_norm_q : benefit(9) {
  %xq = pdl.operand
  %xs = pdl.operand
  %xzp = pdl.operand
  %xmin = pdl.operand
  %xmax = pdl.operand
  %xdt = pdl.operand
  %xod = pdl.operand
  %tx = pdl.type
  %dqx = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%xq, %xs, %xzp, %xmin, %xmax, %xdt, %xod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tx : !pdl.type)
  %x = pdl.result 0 of %dqx
  %wq = pdl.operand
  %ws = pdl.operand
  %wzp = pdl.operand
  %wax = pdl.operand
  %wmin = pdl.operand
  %wmax = pdl.operand
  %wdt = pdl.operand
  %wod = pdl.operand
  %tw = pdl.type
  %dqw = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wq, %ws, %wzp, %wax, %wmin, %wmax, %wdt, %wod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tw : !pdl.type)
  %w = pdl.result 0 of %dqw
  %b = pdl.operand
  %ty = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %lin
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %res = pdl.operand
  %alpha = pdl.operand
  %add = pdl.operation "torch.aten.add.Tensor"(%y, %res, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_float_tensor"(%res : !pdl.value)
  %s = pdl.result 0 of %add
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
  %shape = pdl.operand
  %g = pdl.operand
  %beta = pdl.operand
  %eps = pdl.operand
  %cudnn = pdl.operand
  %ln = pdl.operation "torch.aten.layer_norm"(%s, %shape, %g, %beta, %eps, %cudnn : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%shape : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%eps : !pdl.value)
  %n = pdl.result 0 of %ln
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %quant = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%n, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omin : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omax : !pdl.value)
  pdl.rewrite %quant {
    %op = pdl.attribute = "qlinear_add_layer_norm_q"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %res, %shape, %g, %beta, %eps, %os, %ozp, %omin, %omax, %ln, %quant : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear -> dropout(train=False) -> add(., residual) -> layer_norm   ->   pdlkit_call("qlinear_add_layer_norm", ..., residual, layer_norm)
pdl.pattern @qlinear_dropout_add_layer_norm : benefit(8) {
  %xq = pdl.operand
  %xs = pdl.operand
  %xzp = pdl.operand
  %xmin = pdl.operand
  %xmax = pdl.operand
  %xdt = pdl.operand
  %xod = pdl.operand
  %tx = pdl.type
  %dqx = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%xq, %xs, %xzp, %xmin, %xmax, %xdt, %xod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tx : !pdl.type)
  %x = pdl.result 0 of %dqx
  %wq = pdl.operand
  %ws = pdl.operand
  %wzp = pdl.operand
  %wax = pdl.operand
  %wmin = pdl.operand
  %wmax = pdl.operand
  %wdt = pdl.operand
  %wod = pdl.operand
  %tw = pdl.type
  %dqw = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wq, %ws, %wzp, %wax, %wmin, %wmax, %wdt, %wod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tw : !pdl.type)
  %w = pdl.result 0 of %dqw
  %b = pdl.operand
  %ty = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %lin
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %p = pdl.operand
  %train = pdl.operand
  %drop = pdl.operation "torch.aten.dropout"(%y, %p, %train : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%train, %false : !pdl.value, !pdl.attribute)
  %d = pdl.result 0 of %drop
  pdl.apply_native_constraint "single_use"(%d : !pdl.value)
  %res = pdl.operand
  %alpha = pdl.operand
  %add = pdl.operation "torch.aten.add.Tensor"(%d, %res, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_float_tensor"(%res : !pdl.value)
  %s = pdl.result 0 of %add
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
  %shape = pdl.operand
  %g = pdl.operand
  %beta = pdl.operand
  %eps = pdl.operand
  %cudnn = pdl.operand
  %ln = pdl.operation "torch.aten.layer_norm"(%s, %shape, %g, %beta, %eps, %cudnn : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%shape : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%eps : !pdl.value)
  pdl.rewrite %ln {
    %op = pdl.attribute = "qlinear_add_layer_norm"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %res, %shape, %g, %beta, %eps, %ln : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear -> add(., residual) -> layer_norm   ->   pdlkit_call("qlinear_add_layer_norm", ..., residual, layer_norm)
pdl.pattern @qlinear_add_layer_norm : benefit(7) {
  %xq = pdl.operand
  %xs = pdl.operand
  %xzp = pdl.operand
  %xmin = pdl.operand
  %xmax = pdl.operand
  %xdt = pdl.operand
  %xod = pdl.operand
  %tx = pdl.type
  %dqx = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%xq, %xs, %xzp, %xmin, %xmax, %xdt, %xod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tx : !pdl.type)
  %x = pdl.result 0 of %dqx
  %wq = pdl.operand
  %ws = pdl.operand
  %wzp = pdl.operand
  %wax = pdl.operand
  %wmin = pdl.operand
  %wmax = pdl.operand
  %wdt = pdl.operand
  %wod = pdl.operand
  %tw = pdl.type
  %dqw = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wq, %ws, %wzp, %wax, %wmin, %wmax, %wdt, %wod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tw : !pdl.type)
  %w = pdl.result 0 of %dqw
  %b = pdl.operand
  %ty = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %lin
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %res = pdl.operand
  %alpha = pdl.operand
  %add = pdl.operation "torch.aten.add.Tensor"(%y, %res, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_float_tensor"(%res : !pdl.value)
  %s = pdl.result 0 of %add
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
  %shape = pdl.operand
  %g = pdl.operand
  %beta = pdl.operand
  %eps = pdl.operand
  %cudnn = pdl.operand
  %ln = pdl.operation "torch.aten.layer_norm"(%s, %shape, %g, %beta, %eps, %cudnn : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%shape : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%eps : !pdl.value)
  pdl.rewrite %ln {
    %op = pdl.attribute = "qlinear_add_layer_norm"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %res, %shape, %g, %beta, %eps, %ln : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
