// PT2E int8 linear whose result is added to a residual, as in a transformer block's output
// projection: dequantize -> linear [-> dropout in eval mode] -> add(., residual). The add runs
// as the GEMM's binary post-op.

// dq(x), dq(w) -> linear -> dropout(train=False) -> add(., residual)   ->   pdlkit_call("qlinear_add", ..., residual)
pdl.pattern @qlinear_add_dropout : benefit(4) {
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
  %p = pdl.operand
  %train = pdl.operand
  %drop = pdl.operation "torch.aten.dropout"(%y, %p, %train : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%train, %false : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %d = pdl.result 0 of %drop
  %res = pdl.operand
  %alpha = pdl.operand
  %add = pdl.operation "torch.aten.add.Tensor"(%d, %res, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%d : !pdl.value)
  pdl.apply_native_constraint "is_float_tensor"(%res : !pdl.value)
  pdl.rewrite %add {
    %op = pdl.attribute = "qlinear_add"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %res, %add : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear -> add(., residual)   ->   pdlkit_call("qlinear_add", ..., residual)
pdl.pattern @qlinear_add : benefit(3) {
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
  %res = pdl.operand
  %alpha = pdl.operand
  %add = pdl.operation "torch.aten.add.Tensor"(%y, %res, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  pdl.apply_native_constraint "is_float_tensor"(%res : !pdl.value)
  pdl.rewrite %add {
    %op = pdl.attribute = "qlinear_add"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %res, %add : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
