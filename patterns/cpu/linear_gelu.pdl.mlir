// linear(x, w, b) -> gelu(., approximate)   ->   pdlkit_call("linear_gelu", x, w, b, approximate)
// The linear's result must feed only the gelu, so replacing the gelu makes the linear dead.
pdl.pattern @linear_gelu : benefit(2) {
  %x = pdl.operand
  %w = pdl.operand
  %b = pdl.operand
  %t = pdl.type
  %linear = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%t : !pdl.type)
  %y = pdl.result 0 of %linear
  %approximate = pdl.operand
  %gelu = pdl.operation "torch.aten.gelu"(%y, %approximate : !pdl.value, !pdl.value) -> (%t : !pdl.type)
  pdl.apply_native_constraint "is_float_tensor"(%x : !pdl.value)
  pdl.apply_native_constraint "not_dequantized"(%w : !pdl.value)  // quantized GEMMs are the int8 patterns' or Inductor's
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%approximate : !pdl.value)
  pdl.rewrite %gelu {
    %op = pdl.attribute = "linear_gelu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %x, %w, %b, %approximate, %gelu : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
