// torch._int_mm(a, b)   ->   pdlkit_call("int_mm", a, b)
// int8 [M, K] @ int8 [K, N] -> int32 [M, N]; the kernel (e.g. vnni_int8_gemm, a native
// library built from kernels/x86/vnni_int8_gemm.c) declares the int8 dtypes and ranks.
pdl.pattern @int_mm : benefit(1) {
  %a = pdl.operand
  %b = pdl.operand
  %t = pdl.type
  %mm = pdl.operation "torch.aten._int_mm"(%a, %b : !pdl.value, !pdl.value) -> (%t : !pdl.type)
  pdl.rewrite %mm {
    %op = pdl.attribute = "int_mm"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %a, %b, %mm : !pdl.attribute, !pdl.value, !pdl.value, !pdl.operation)
  }
}
