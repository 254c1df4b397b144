// linear(x, w, b)   ->   pdlkit_call("linear", x, w, b)
// The lowest benefit: linears that no fused pattern claimed. The weight must be a 2-D
// float tensor (kernels pre-pack it) that no dequantize op produced, the activation a float tensor.
pdl.pattern @linear : benefit(1) {
  %x = pdl.operand
  %w = pdl.operand
  %b = pdl.operand
  %t = pdl.type
  %linear = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%t : !pdl.type)
  pdl.apply_native_constraint "is_float_tensor"(%x : !pdl.value)
  pdl.apply_native_constraint "not_dequantized"(%w : !pdl.value)  // quantized GEMMs are the int8 patterns' or Inductor's
  pdl.apply_native_constraint "is_float_tensor"(%w : !pdl.value)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%w, %two : !pdl.value, !pdl.attribute)
  pdl.rewrite %linear {
    %op = pdl.attribute = "linear"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %x, %w, %b, %linear : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
