// Quantized linears in schemes that no x86 kernel implements: weights quantized per group
// (int4/int8 "group-wise", e.g. weight-only quantization). No shipped kernel declares the
// logical op, so every match is reported as a near miss ("no kernel implements logical op
// 'qlinear_per_group'") and the GEMM stays with the default code generator, which computes
// dequantize -> linear exactly. A kernel declaring op="qlinear_per_group" turns the near
// misses into substitutions without any change here.

// x, dq_per_channel_group(w) -> linear   ->   pdlkit_call("qlinear_per_group", ...) (no shipped kernel)
pdl.pattern @qlinear_per_group : benefit(2) {
  %x = pdl.operand
  %wq = pdl.operand
  %ws = pdl.operand
  %wzp = pdl.operand
  %wmin = pdl.operand
  %wmax = pdl.operand
  %wdt = pdl.operand
  %wgroup = pdl.operand
  %wod = pdl.operand
  %tw = pdl.type
  %dqw = pdl.operation "torch.quantized_decomposed.dequantize_per_channel_group"(%wq, %ws, %wzp, %wmin, %wmax, %wdt, %wgroup, %wod : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tw : !pdl.type)
  %w = pdl.result 0 of %dqw
  %b = pdl.operand
  %ty = pdl.type
  %lin = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%ty : !pdl.type)
  pdl.rewrite %lin {
    %op = pdl.attribute = "qlinear_per_group"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %x, %wq, %ws, %wzp, %wmin, %wmax, %wgroup, %b, %lin : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
