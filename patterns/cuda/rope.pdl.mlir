// A matmul of inner dimension 1, as transformers' rotary embeddings (Llama's up to 5.17)
// compute their frequencies: inv_freq [B, 64, 1] @ positions [B, 1, S]
//   matmul(a [B, M, 1], b [B, 1, N])   ->   pdlkit_call("matmul_outer", a, b)
// kernels/cuda/rope.py multiplies instead, and Inductor fuses that with the cos and sin after it.
pdl.pattern @matmul_outer : benefit(1) {
  %a = pdl.operand
  %b = pdl.operand
  %t = pdl.type
  %op = pdl.operation "torch.aten.matmul"(%a, %b : !pdl.value, !pdl.value) -> (%t : !pdl.type)
  %one = pdl.attribute = 1 : i64
  %two = pdl.attribute = 2 : i64
  %three = pdl.attribute = 3 : i64
  pdl.apply_native_constraint "has_rank"(%a, %three : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%b, %three : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "dim_equals"(%a, %two, %one : !pdl.value, !pdl.attribute, !pdl.attribute)
  pdl.apply_native_constraint "dim_equals"(%b, %one, %one : !pdl.value, !pdl.attribute, !pdl.attribute)
  pdl.rewrite %op {
    %lop = pdl.attribute = "matmul_outer"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %a, %b, %op : !pdl.attribute, !pdl.value, !pdl.value, !pdl.operation)
  }
}
