// PT2E int8 linear, written once for every target: dequantize_per_tensor(x) and
// dequantize_per_channel(w) feeding aten.linear, optionally an activation, optionally
// quantize_per_tensor of the result (X86InductorQuantizer graphs with u8 activations; Arm /
// XNNPACK quantizers with s8 ones). One pattern per shape; longer chains have higher benefit.
// The logical ops (qlinear, qlinear_q: kernels/ops/logical_ops.py) are the same on every
// target; which kernel runs them is the registry's choice by ISA and dtype. A target's
// manifest selects this file (patterns/x86/int8.yaml, patterns/aarch64/int8.yaml).

// dq(x), dq(w) -> linear -> relu -> q   ->   pdlkit_call("qlinear_q", ..., "relu")
pdl.pattern @qlinear_relu_q : benefit(5) {
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
  %act = pdl.operation "torch.aten.relu"(%y : !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %a = pdl.result 0 of %act
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %q = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%a, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "single_use"(%a : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.rewrite %q {
    %op = pdl.attribute = "qlinear_q"
    %post = pdl.attribute = "relu"
    %noalgo = pdl.attribute = ""
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %os, %ozp, %omin, %omax, %post, %noalgo, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear -> relu   ->   pdlkit_call("qlinear", ..., "relu")
pdl.pattern @qlinear_relu : benefit(3) {
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
  %act = pdl.operation "torch.aten.relu"(%y : !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %a = pdl.result 0 of %act
  pdl.rewrite %act {
    %op = pdl.attribute = "qlinear"
    %post = pdl.attribute = "relu"
    %noalgo = pdl.attribute = ""
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %post, %noalgo, %act : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear -> gelu -> q   ->   pdlkit_call("qlinear_q", ..., "gelu")
pdl.pattern @qlinear_gelu_q : benefit(5) {
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
  %approx = pdl.operand
  %act = pdl.operation "torch.aten.gelu"(%y, %approx : !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%approx : !pdl.value)
  %a = pdl.result 0 of %act
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %q = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%a, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "single_use"(%a : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.rewrite %q {
    %op = pdl.attribute = "qlinear_q"
    %post = pdl.attribute = "gelu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %os, %ozp, %omin, %omax, %post, %approx, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.value, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear -> gelu   ->   pdlkit_call("qlinear", ..., "gelu")
pdl.pattern @qlinear_gelu : benefit(3) {
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
  %approx = pdl.operand
  %act = pdl.operation "torch.aten.gelu"(%y, %approx : !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%approx : !pdl.value)
  %a = pdl.result 0 of %act
  pdl.rewrite %act {
    %op = pdl.attribute = "qlinear"
    %post = pdl.attribute = "gelu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %post, %approx, %act : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.value, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear -> q   ->   pdlkit_call("qlinear_q", ..., "none")
pdl.pattern @qlinear_q : benefit(4) {
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
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %q = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%y, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.rewrite %q {
    %op = pdl.attribute = "qlinear_q"
    %post = pdl.attribute = "none"
    %noalgo = pdl.attribute = ""
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %os, %ozp, %omin, %omax, %post, %noalgo, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> linear   ->   pdlkit_call("qlinear", ..., "none")
pdl.pattern @qlinear : benefit(2) {
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
  pdl.rewrite %lin {
    %op = pdl.attribute = "qlinear"
    %post = pdl.attribute = "none"
    %noalgo = pdl.attribute = ""
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %post, %noalgo, %lin : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.attribute, !pdl.operation)
  }
}
