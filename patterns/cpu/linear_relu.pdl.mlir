// linear(x, w, b) -> relu(.)   ->   pdlkit_call("linear_relu", x, w, b)
pdl.pattern @linear_relu : benefit(2) {
  %x = pdl.operand
  %w = pdl.operand
  %b = pdl.operand
  %t = pdl.type
  %linear = pdl.operation "torch.aten.linear"(%x, %w, %b : !pdl.value, !pdl.value, !pdl.value) -> (%t : !pdl.type)
  %y = pdl.result 0 of %linear
  %relu = pdl.operation "torch.aten.relu"(%y : !pdl.value) -> (%t : !pdl.type)
  pdl.apply_native_constraint "is_float_tensor"(%x : !pdl.value)
  pdl.apply_native_constraint "not_dequantized"(%w : !pdl.value)  // quantized GEMMs are the int8 patterns' or Inductor's
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  pdl.rewrite %relu {
    %op = pdl.attribute = "linear_relu"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %x, %w, %b, %relu : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
