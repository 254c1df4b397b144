// PT2E int8 2-D convolution (X86InductorQuantizer): dequantize_per_tensor(x) and
// dequantize_per_channel(w) feeding aten.conv2d, optionally ReLU, optionally
// quantize_per_tensor of the result -> kernels/x86/qconv_onednn.py. Longer chains have higher
// benefit. Stride, padding, dilation and groups must be constants; they reach the kernel.

// dq(x), dq(w) -> conv2d -> relu -> q   ->   pdlkit_call("qconv_q", ..., "relu")
pdl.pattern @qconv_relu_q : benefit(5) {
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
  %stride = pdl.operand
  %pad = pdl.operand
  %dil = pdl.operand
  %groups = pdl.operand
  %ty = pdl.type
  %conv = pdl.operation "torch.aten.conv2d"(%x, %w, %b, %stride, %pad, %dil, %groups : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %conv
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%stride : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%pad : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%dil : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%groups : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %four : !pdl.value, !pdl.attribute)
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
    %op = pdl.attribute = "qconv_q"
    %post = pdl.attribute = "relu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %stride, %pad, %dil, %groups, %os, %ozp, %omin, %omax, %post, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> conv2d -> q   ->   pdlkit_call("qconv_q", ..., "none")
pdl.pattern @qconv_q : benefit(4) {
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
  %stride = pdl.operand
  %pad = pdl.operand
  %dil = pdl.operand
  %groups = pdl.operand
  %ty = pdl.type
  %conv = pdl.operation "torch.aten.conv2d"(%x, %w, %b, %stride, %pad, %dil, %groups : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %conv
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%stride : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%pad : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%dil : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%groups : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %four : !pdl.value, !pdl.attribute)
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
    %op = pdl.attribute = "qconv_q"
    %post = pdl.attribute = "none"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %stride, %pad, %dil, %groups, %os, %ozp, %omin, %omax, %post, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> conv2d -> relu   ->   pdlkit_call("qconv", ..., "relu")
pdl.pattern @qconv_relu : benefit(3) {
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
  %stride = pdl.operand
  %pad = pdl.operand
  %dil = pdl.operand
  %groups = pdl.operand
  %ty = pdl.type
  %conv = pdl.operation "torch.aten.conv2d"(%x, %w, %b, %stride, %pad, %dil, %groups : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %conv
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%stride : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%pad : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%dil : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%groups : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %four : !pdl.value, !pdl.attribute)
  %act = pdl.operation "torch.aten.relu"(%y : !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %a = pdl.result 0 of %act
  pdl.rewrite %act {
    %op = pdl.attribute = "qconv"
    %post = pdl.attribute = "relu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %stride, %pad, %dil, %groups, %post, %act : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> conv2d   ->   pdlkit_call("qconv", ..., "none")
pdl.pattern @qconv : benefit(2) {
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
  %stride = pdl.operand
  %pad = pdl.operand
  %dil = pdl.operand
  %groups = pdl.operand
  %ty = pdl.type
  %conv = pdl.operation "torch.aten.conv2d"(%x, %w, %b, %stride, %pad, %dil, %groups : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %conv
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%stride : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%pad : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%dil : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%groups : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %four : !pdl.value, !pdl.attribute)
  pdl.rewrite %conv {
    %op = pdl.attribute = "qconv"
    %post = pdl.attribute = "none"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %stride, %pad, %dil, %groups, %post, %conv : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// A ResNet block's second convolution: dq(x), dq(w) -> conv2d -> add(., dq(residual))
// [-> relu] -> q   ->   pdlkit_call("qconv_add_q", ..., residual codes, ...): oneDNN's
// convolution with the residual summed in and the requantization fused (as PyTorch's own
// int8 path does). The residual is read in either operand order of the add.

// dq(x), dq(w) -> add(conv2d, dq(residual)) -> relu -> q   ->   pdlkit_call("qconv_add_q", ..., "relu")
pdl.pattern @qconv_add_relu_q : benefit(7) {
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
  %stride = pdl.operand
  %pad = pdl.operand
  %dil = pdl.operand
  %groups = pdl.operand
  %ty = pdl.type
  %conv = pdl.operation "torch.aten.conv2d"(%x, %w, %b, %stride, %pad, %dil, %groups : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %conv
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%stride : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%pad : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%dil : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%groups : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %four : !pdl.value, !pdl.attribute)
  %rq = pdl.operand
  %rs = pdl.operand
  %rzp = pdl.operand
  %rmin = pdl.operand
  %rmax = pdl.operand
  %rdt = pdl.operand
  %rod = pdl.operand
  %tr = pdl.type
  %dqr = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%rq, %rs, %rzp, %rmin, %rmax, %rdt, %rod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tr : !pdl.type)
  %r = pdl.result 0 of %dqr
  pdl.apply_native_constraint "is_constant"(%rs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%rzp : !pdl.value)
  %alpha = pdl.operand
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  %add = pdl.operation "torch.aten.add.Tensor"(%y, %r, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %s = pdl.result 0 of %add
  %act = pdl.operation "torch.aten.relu"(%s : !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
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
    %op = pdl.attribute = "qconv_add_q"
    %post = pdl.attribute = "relu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %stride, %pad, %dil, %groups, %rq, %rs, %rzp, %os, %ozp, %omin, %omax, %post, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> add(dq(residual), conv2d) -> relu -> q   ->   pdlkit_call("qconv_add_q", ..., "relu")
pdl.pattern @qconv_add_relu_q_rhs : benefit(7) {
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
  %stride = pdl.operand
  %pad = pdl.operand
  %dil = pdl.operand
  %groups = pdl.operand
  %ty = pdl.type
  %conv = pdl.operation "torch.aten.conv2d"(%x, %w, %b, %stride, %pad, %dil, %groups : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %conv
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%stride : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%pad : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%dil : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%groups : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %four : !pdl.value, !pdl.attribute)
  %rq = pdl.operand
  %rs = pdl.operand
  %rzp = pdl.operand
  %rmin = pdl.operand
  %rmax = pdl.operand
  %rdt = pdl.operand
  %rod = pdl.operand
  %tr = pdl.type
  %dqr = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%rq, %rs, %rzp, %rmin, %rmax, %rdt, %rod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tr : !pdl.type)
  %r = pdl.result 0 of %dqr
  pdl.apply_native_constraint "is_constant"(%rs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%rzp : !pdl.value)
  %alpha = pdl.operand
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  %add = pdl.operation "torch.aten.add.Tensor"(%r, %y, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %s = pdl.result 0 of %add
  %act = pdl.operation "torch.aten.relu"(%s : !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
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
    %op = pdl.attribute = "qconv_add_q"
    %post = pdl.attribute = "relu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %stride, %pad, %dil, %groups, %rq, %rs, %rzp, %os, %ozp, %omin, %omax, %post, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> add(conv2d, dq(residual)) -> q   ->   pdlkit_call("qconv_add_q", ..., "none")
pdl.pattern @qconv_add_q : benefit(6) {
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
  %stride = pdl.operand
  %pad = pdl.operand
  %dil = pdl.operand
  %groups = pdl.operand
  %ty = pdl.type
  %conv = pdl.operation "torch.aten.conv2d"(%x, %w, %b, %stride, %pad, %dil, %groups : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %conv
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%stride : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%pad : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%dil : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%groups : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %four : !pdl.value, !pdl.attribute)
  %rq = pdl.operand
  %rs = pdl.operand
  %rzp = pdl.operand
  %rmin = pdl.operand
  %rmax = pdl.operand
  %rdt = pdl.operand
  %rod = pdl.operand
  %tr = pdl.type
  %dqr = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%rq, %rs, %rzp, %rmin, %rmax, %rdt, %rod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tr : !pdl.type)
  %r = pdl.result 0 of %dqr
  pdl.apply_native_constraint "is_constant"(%rs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%rzp : !pdl.value)
  %alpha = pdl.operand
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  %add = pdl.operation "torch.aten.add.Tensor"(%y, %r, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %s = pdl.result 0 of %add
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %q = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%s, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.rewrite %q {
    %op = pdl.attribute = "qconv_add_q"
    %post = pdl.attribute = "none"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %stride, %pad, %dil, %groups, %rq, %rs, %rzp, %os, %ozp, %omin, %omax, %post, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// dq(x), dq(w) -> add(dq(residual), conv2d) -> q   ->   pdlkit_call("qconv_add_q", ..., "none")
pdl.pattern @qconv_add_q_rhs : benefit(6) {
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
  %stride = pdl.operand
  %pad = pdl.operand
  %dil = pdl.operand
  %groups = pdl.operand
  %ty = pdl.type
  %conv = pdl.operation "torch.aten.conv2d"(%x, %w, %b, %stride, %pad, %dil, %groups : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  %y = pdl.result 0 of %conv
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%stride : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%pad : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%dil : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%groups : !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%wax, %zero : !pdl.value, !pdl.attribute)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  %four = pdl.attribute = 4 : i64
  pdl.apply_native_constraint "has_rank"(%wq, %four : !pdl.value, !pdl.attribute)
  %rq = pdl.operand
  %rs = pdl.operand
  %rzp = pdl.operand
  %rmin = pdl.operand
  %rmax = pdl.operand
  %rdt = pdl.operand
  %rod = pdl.operand
  %tr = pdl.type
  %dqr = pdl.operation "torch.quantized_decomposed.dequantize_per_tensor"(%rq, %rs, %rzp, %rmin, %rmax, %rdt, %rod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tr : !pdl.type)
  %r = pdl.result 0 of %dqr
  pdl.apply_native_constraint "is_constant"(%rs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%rzp : !pdl.value)
  %alpha = pdl.operand
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  %add = pdl.operation "torch.aten.add.Tensor"(%r, %y, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %s = pdl.result 0 of %add
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %q = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%s, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.rewrite %q {
    %op = pdl.attribute = "qconv_add_q"
    %post = pdl.attribute = "none"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %ws, %wzp, %b, %stride, %pad, %dil, %groups, %rq, %rs, %rzp, %os, %ozp, %omin, %omax, %post, %q : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}
