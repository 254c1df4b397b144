// PT2E int8 linear with dynamic activation quantization and the weight quantized per tensor
// (qlinear_per_tensor.pdl.mlir with choose_qparams' tensor scale and zero point, as in
// qlinear_dynamic.pdl.mlir): logical op qlinear_dynamic_pt. Selected by targets that have a
// kernel for it (patterns/aarch64/int8.yaml).

// PT2E int8 linear with dynamic activation quantization (X86InductorQuantizer, is_dynamic=True):
// choose_qparams gives the activation's scale and zero point as tensors, so the dequantize is
// the generic torch.operator "torch.quantized_decomposed.dequantize_per_tensor.tensor".

// dq.tensor(x), dq_per_tensor(w) -> linear -> relu   ->   pdlkit_call("qlinear_dynamic", ..., "relu")
pdl.pattern @pt_qlinear_dyn_relu : benefit(3) {
  %xq = pdl.operand
  %xs = pdl.operand
  %xzp = pdl.operand
  %xmin = pdl.operand
  %xmax = pdl.operand
  %xdt = pdl.operand
  %xod = pdl.operand
  %tx = pdl.type
  %dqname = pdl.attribute = "torch.quantized_decomposed.dequantize_per_tensor.tensor"
  %dqx = pdl.operation "torch.operator"(%xq, %xs, %xzp, %xmin, %xmax, %xdt, %xod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) {"name" = %dqname} -> (%tx : !pdl.type)
  %x = pdl.result 0 of %dqx
  %wq = pdl.operand
  %ws = pdl.operand
  %wzp = pdl.operand
  %wmin = pdl.operand
  %wmax = pdl.operand
  %wdt = pdl.operand
  %wod = pdl.operand
  %tw = pdl.type
  %dqw = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%wq, %ws, %wzp, %wmin, %wmax, %wdt, %wod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tw : !pdl.type)
  %w = pdl.result 0 of %dqw
  %b = pdl.operand
  %ty = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %lin
  pdl.apply_native_constraint "is_tensor"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_tensor"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ws : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%wzp : !pdl.value)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  %act = pdl.operation "torch.aten.relu"(%y : !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %a = pdl.result 0 of %act
  pdl.rewrite %act {
    %op = pdl.attribute = "qlinear_dynamic_pt"
    %post = pdl.attribute = "relu"
    %noalgo = pdl.attribute = ""
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %post, %noalgo, %act : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.attribute, !pdl.operation)
  }
}

// dq.tensor(x), dq_per_tensor(w) -> linear -> gelu   ->   pdlkit_call("qlinear_dynamic", ..., "gelu")
pdl.pattern @pt_qlinear_dyn_gelu : benefit(3) {
  %xq = pdl.operand
  %xs = pdl.operand
  %xzp = pdl.operand
  %xmin = pdl.operand
  %xmax = pdl.operand
  %xdt = pdl.operand
  %xod = pdl.operand
  %tx = pdl.type
  %dqname = pdl.attribute = "torch.quantized_decomposed.dequantize_per_tensor.tensor"
  %dqx = pdl.operation "torch.operator"(%xq, %xs, %xzp, %xmin, %xmax, %xdt, %xod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) {"name" = %dqname} -> (%tx : !pdl.type)
  %x = pdl.result 0 of %dqx
  %wq = pdl.operand
  %ws = pdl.operand
  %wzp = pdl.operand
  %wmin = pdl.operand
  %wmax = pdl.operand
  %wdt = pdl.operand
  %wod = pdl.operand
  %tw = pdl.type
  %dqw = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%wq, %ws, %wzp, %wmin, %wmax, %wdt, %wod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tw : !pdl.type)
  %w = pdl.result 0 of %dqw
  %b = pdl.operand
  %ty = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %lin
  pdl.apply_native_constraint "is_tensor"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_tensor"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ws : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%wzp : !pdl.value)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  %approx = pdl.operand
  %act = pdl.operation "torch.aten.gelu"(%y, %approx : !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%approx : !pdl.value)
  %a = pdl.result 0 of %act
  pdl.rewrite %act {
    %op = pdl.attribute = "qlinear_dynamic_pt"
    %post = pdl.attribute = "gelu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %post, %approx, %act : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.value, !pdl.operation)
  }
}

// dq.tensor(x), dq_per_tensor(w) -> linear   ->   pdlkit_call("qlinear_dynamic", ..., "none")
pdl.pattern @pt_qlinear_dyn : benefit(2) {
  %xq = pdl.operand
  %xs = pdl.operand
  %xzp = pdl.operand
  %xmin = pdl.operand
  %xmax = pdl.operand
  %xdt = pdl.operand
  %xod = pdl.operand
  %tx = pdl.type
  %dqname = pdl.attribute = "torch.quantized_decomposed.dequantize_per_tensor.tensor"
  %dqx = pdl.operation "torch.operator"(%xq, %xs, %xzp, %xmin, %xmax, %xdt, %xod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) {"name" = %dqname} -> (%tx : !pdl.type)
  %x = pdl.result 0 of %dqx
  %wq = pdl.operand
  %ws = pdl.operand
  %wzp = pdl.operand
  %wmin = pdl.operand
  %wmax = pdl.operand
  %wdt = pdl.operand
  %wod = pdl.operand
  %tw = pdl.type
  %dqw = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%wq, %ws, %wzp, %wmin, %wmax, %wdt, %wod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tw : !pdl.type)
  %w = pdl.result 0 of %dqw
  %b = pdl.operand
  %ty = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %lin
  pdl.apply_native_constraint "is_tensor"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_tensor"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ws : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%wzp : !pdl.value)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  pdl.rewrite %lin {
    %op = pdl.attribute = "qlinear_dynamic_pt"
    %post = pdl.attribute = "none"
    %noalgo = pdl.attribute = ""
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %post, %noalgo, %lin : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.attribute, !pdl.operation)
  }
}
