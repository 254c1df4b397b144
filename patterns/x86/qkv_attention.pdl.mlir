// PT2E int8 self-attention (X86InductorQuantizer, HF BERT): the Q, K and V projections of one
// quantized activation, their head views, SDPA and the quantize of the merged heads that the
// output projection reads, as one kernel call (kernels/x86/qlinear_vnni.py,
// qkv_attention_q_merged_vnni): one VNNI GEMM with N = 3 H D writes q | k | v side by side and
// attention.c reads head views of them. Without this: three GEMM calls and attention_q_merged
// (attention.pdl.mlir), four calls per layer, each with its per-call cost (~25 us in the model).
// The three views must agree (same_constant); SDPA's scale must be given (HF BERT passes it).
// HF BERT reshapes SDPA's output to its own shape before the transpose (first pattern); a
// module written by hand usually does not (second).

// q, k, v = (dq(x) @ dq(w*).T + b*).reshape([B, S, -1, D]).transpose(1, 2); sdpa(q, k, v, mask, 0.0, causal, scale) -> reshape(same shape) -> transpose(1, 2) -> reshape([B, S, H * D]) -> q(...)   ->   pdlkit_call("qkv_attention_q_merged", ...)
pdl.pattern @qkv_attention_q_merged : benefit(11) {
  %zero = pdl.attribute = 0 : i64
  %i1 = pdl.attribute = 1 : i64
  %i2 = pdl.attribute = 2 : i64
  %two = pdl.attribute = 2 : i64
  %three = pdl.attribute = 3 : i64
  %i8 = pdl.attribute = "int8"
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
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "has_rank"(%xq, %three : !pdl.value, !pdl.attribute)
  %wq = pdl.operand
  %sq = pdl.operand
  %zq = pdl.operand
  %axq = pdl.operand
  %wminq = pdl.operand
  %wmaxq = pdl.operand
  %wdtq = pdl.operand
  %wodq = pdl.operand
  %twq = pdl.type
  %dqwq = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wq, %sq, %zq, %axq, %wminq, %wmaxq, %wdtq, %wodq : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%twq : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%axq, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  %dwq = pdl.result 0 of %dqwq
  %bq = pdl.operand
  %tyq = pdl.type
  %linq = pdl.operation "torch.aten.linear"(%x, %dwq, %bq : !pdl.value, !pdl.value, !pdl.value) -> (%tyq : !pdl.type)
  %yq = pdl.result 0 of %linq
  pdl.apply_native_constraint "single_use"(%yq : !pdl.value)
  %hsq = pdl.operand
  %thq = pdl.type
  %headsq = pdl.operation "torch.aten.reshape"(%yq, %hsq : !pdl.value, !pdl.value) -> (%thq : !pdl.type)
  %hq = pdl.result 0 of %headsq
  pdl.apply_native_constraint "single_use"(%hq : !pdl.value)
  %oneq = pdl.operand
  %twoq = pdl.operand
  %ttq = pdl.type
  %trq = pdl.operation "torch.aten.transpose.int"(%hq, %oneq, %twoq : !pdl.value, !pdl.value, !pdl.value) -> (%ttq : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%oneq, %i1 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%twoq, %i2 : !pdl.value, !pdl.attribute)
  %q = pdl.result 0 of %trq
  pdl.apply_native_constraint "single_use"(%q : !pdl.value)
  %wk = pdl.operand
  %sk = pdl.operand
  %zk = pdl.operand
  %axk = pdl.operand
  %wmink = pdl.operand
  %wmaxk = pdl.operand
  %wdtk = pdl.operand
  %wodk = pdl.operand
  %twk = pdl.type
  %dqwk = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wk, %sk, %zk, %axk, %wmink, %wmaxk, %wdtk, %wodk : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%twk : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%axk, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_dtype"(%wk, %i8 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%wk, %two : !pdl.value, !pdl.attribute)
  %dwk = pdl.result 0 of %dqwk
  %bk = pdl.operand
  %tyk = pdl.type
  %link = pdl.operation "torch.aten.linear"(%x, %dwk, %bk : !pdl.value, !pdl.value, !pdl.value) -> (%tyk : !pdl.type)
  %yk = pdl.result 0 of %link
  pdl.apply_native_constraint "single_use"(%yk : !pdl.value)
  %hsk = pdl.operand
  %thk = pdl.type
  %headsk = pdl.operation "torch.aten.reshape"(%yk, %hsk : !pdl.value, !pdl.value) -> (%thk : !pdl.type)
  %hk = pdl.result 0 of %headsk
  pdl.apply_native_constraint "single_use"(%hk : !pdl.value)
  %onek = pdl.operand
  %twok = pdl.operand
  %ttk = pdl.type
  %trk = pdl.operation "torch.aten.transpose.int"(%hk, %onek, %twok : !pdl.value, !pdl.value, !pdl.value) -> (%ttk : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%onek, %i1 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%twok, %i2 : !pdl.value, !pdl.attribute)
  %k = pdl.result 0 of %trk
  pdl.apply_native_constraint "single_use"(%k : !pdl.value)
  %wv = pdl.operand
  %sv = pdl.operand
  %zv = pdl.operand
  %axv = pdl.operand
  %wminv = pdl.operand
  %wmaxv = pdl.operand
  %wdtv = pdl.operand
  %wodv = pdl.operand
  %twv = pdl.type
  %dqwv = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wv, %sv, %zv, %axv, %wminv, %wmaxv, %wdtv, %wodv : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%twv : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%axv, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_dtype"(%wv, %i8 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%wv, %two : !pdl.value, !pdl.attribute)
  %dwv = pdl.result 0 of %dqwv
  %bv = pdl.operand
  %tyv = pdl.type
  %linv = pdl.operation "torch.aten.linear"(%x, %dwv, %bv : !pdl.value, !pdl.value, !pdl.value) -> (%tyv : !pdl.type)
  %yv = pdl.result 0 of %linv
  pdl.apply_native_constraint "single_use"(%yv : !pdl.value)
  %hsv = pdl.operand
  %thv = pdl.type
  %headsv = pdl.operation "torch.aten.reshape"(%yv, %hsv : !pdl.value, !pdl.value) -> (%thv : !pdl.type)
  %hv = pdl.result 0 of %headsv
  pdl.apply_native_constraint "single_use"(%hv : !pdl.value)
  %onev = pdl.operand
  %twov = pdl.operand
  %ttv = pdl.type
  %trv = pdl.operation "torch.aten.transpose.int"(%hv, %onev, %twov : !pdl.value, !pdl.value, !pdl.value) -> (%ttv : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%onev, %i1 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%twov, %i2 : !pdl.value, !pdl.attribute)
  %v = pdl.result 0 of %trv
  pdl.apply_native_constraint "single_use"(%v : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%hsq : !pdl.value)
  pdl.apply_native_constraint "same_constant"(%hsq, %hsk : !pdl.value, !pdl.value)
  pdl.apply_native_constraint "same_constant"(%hsq, %hsv : !pdl.value, !pdl.value)
  %mask = pdl.operand
  %dropout = pdl.operand
  %causal = pdl.operand
  %scale = pdl.operand
  %gqa = pdl.operand
  %ta = pdl.type
  %sdpa = pdl.operation "torch.aten.scaled_dot_product_attention"(%q, %k, %v, %mask, %dropout, %causal, %scale, %gqa : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ta : !pdl.type)
  %fzero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %fzero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%causal : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_not_none"(%scale : !pdl.value)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%gqa, %false : !pdl.value, !pdl.attribute)
  %y = pdl.result 0 of %sdpa
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %shape0 = pdl.operand
  %same = pdl.operation "torch.aten.reshape"(%y, %shape0 : !pdl.value, !pdl.value) -> (%ta : !pdl.type)
  %y0 = pdl.result 0 of %same
  pdl.apply_native_constraint "single_use"(%y0 : !pdl.value)
  %one = pdl.operand
  %twob = pdl.operand
  %tt = pdl.type
  %tr = pdl.operation "torch.aten.transpose.int"(%y0, %one, %twob : !pdl.value, !pdl.value, !pdl.value) -> (%tt : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%one, %i1 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%twob, %i2 : !pdl.value, !pdl.attribute)
  %yt = pdl.result 0 of %tr
  pdl.apply_native_constraint "single_use"(%yt : !pdl.value)
  %shape1 = pdl.operand
  %tm = pdl.type
  %merge = pdl.operation "torch.aten.reshape"(%yt, %shape1 : !pdl.value, !pdl.value) -> (%tm : !pdl.type)
  %ym = pdl.result 0 of %merge
  pdl.apply_native_constraint "has_rank"(%ym, %three : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%ym : !pdl.value)
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %quant = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%ym, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omin : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omax : !pdl.value)
  pdl.rewrite %quant {
    %op = pdl.attribute = "qkv_attention_q_merged"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %sq, %zq, %bq, %wk, %sk, %zk, %bk, %wv, %sv, %zv, %bv, %hsq, %mask, %causal, %scale, %os, %ozp, %omin, %omax, %quant : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}

// q, k, v = (dq(x) @ dq(w*).T + b*).reshape([B, S, -1, D]).transpose(1, 2); sdpa(q, k, v, mask, 0.0, causal, scale) -> transpose(1, 2) -> reshape([B, S, H * D]) -> q(...)   ->   pdlkit_call("qkv_attention_q_merged", ...)
pdl.pattern @qkv_attention_q_merged_direct : benefit(11) {
  %zero = pdl.attribute = 0 : i64
  %i1 = pdl.attribute = 1 : i64
  %i2 = pdl.attribute = 2 : i64
  %two = pdl.attribute = 2 : i64
  %three = pdl.attribute = 3 : i64
  %i8 = pdl.attribute = "int8"
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
  pdl.apply_native_constraint "is_constant"(%xs : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%xzp : !pdl.value)
  pdl.apply_native_constraint "has_rank"(%xq, %three : !pdl.value, !pdl.attribute)
  %wq = pdl.operand
  %sq = pdl.operand
  %zq = pdl.operand
  %axq = pdl.operand
  %wminq = pdl.operand
  %wmaxq = pdl.operand
  %wdtq = pdl.operand
  %wodq = pdl.operand
  %twq = pdl.type
  %dqwq = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wq, %sq, %zq, %axq, %wminq, %wmaxq, %wdtq, %wodq : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%twq : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%axq, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_dtype"(%wq, %i8 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%wq, %two : !pdl.value, !pdl.attribute)
  %dwq = pdl.result 0 of %dqwq
  %bq = pdl.operand
  %tyq = pdl.type
  %linq = pdl.operation "torch.aten.linear"(%x, %dwq, %bq : !pdl.value, !pdl.value, !pdl.value) -> (%tyq : !pdl.type)
  %yq = pdl.result 0 of %linq
  pdl.apply_native_constraint "single_use"(%yq : !pdl.value)
  %hsq = pdl.operand
  %thq = pdl.type
  %headsq = pdl.operation "torch.aten.reshape"(%yq, %hsq : !pdl.value, !pdl.value) -> (%thq : !pdl.type)
  %hq = pdl.result 0 of %headsq
  pdl.apply_native_constraint "single_use"(%hq : !pdl.value)
  %oneq = pdl.operand
  %twoq = pdl.operand
  %ttq = pdl.type
  %trq = pdl.operation "torch.aten.transpose.int"(%hq, %oneq, %twoq : !pdl.value, !pdl.value, !pdl.value) -> (%ttq : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%oneq, %i1 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%twoq, %i2 : !pdl.value, !pdl.attribute)
  %q = pdl.result 0 of %trq
  pdl.apply_native_constraint "single_use"(%q : !pdl.value)
  %wk = pdl.operand
  %sk = pdl.operand
  %zk = pdl.operand
  %axk = pdl.operand
  %wmink = pdl.operand
  %wmaxk = pdl.operand
  %wdtk = pdl.operand
  %wodk = pdl.operand
  %twk = pdl.type
  %dqwk = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wk, %sk, %zk, %axk, %wmink, %wmaxk, %wdtk, %wodk : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%twk : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%axk, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_dtype"(%wk, %i8 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%wk, %two : !pdl.value, !pdl.attribute)
  %dwk = pdl.result 0 of %dqwk
  %bk = pdl.operand
  %tyk = pdl.type
  %link = pdl.operation "torch.aten.linear"(%x, %dwk, %bk : !pdl.value, !pdl.value, !pdl.value) -> (%tyk : !pdl.type)
  %yk = pdl.result 0 of %link
  pdl.apply_native_constraint "single_use"(%yk : !pdl.value)
  %hsk = pdl.operand
  %thk = pdl.type
  %headsk = pdl.operation "torch.aten.reshape"(%yk, %hsk : !pdl.value, !pdl.value) -> (%thk : !pdl.type)
  %hk = pdl.result 0 of %headsk
  pdl.apply_native_constraint "single_use"(%hk : !pdl.value)
  %onek = pdl.operand
  %twok = pdl.operand
  %ttk = pdl.type
  %trk = pdl.operation "torch.aten.transpose.int"(%hk, %onek, %twok : !pdl.value, !pdl.value, !pdl.value) -> (%ttk : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%onek, %i1 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%twok, %i2 : !pdl.value, !pdl.attribute)
  %k = pdl.result 0 of %trk
  pdl.apply_native_constraint "single_use"(%k : !pdl.value)
  %wv = pdl.operand
  %sv = pdl.operand
  %zv = pdl.operand
  %axv = pdl.operand
  %wminv = pdl.operand
  %wmaxv = pdl.operand
  %wdtv = pdl.operand
  %wodv = pdl.operand
  %twv = pdl.type
  %dqwv = pdl.operation "torch.quantized_decomposed.dequantize_per_channel"(%wv, %sv, %zv, %axv, %wminv, %wmaxv, %wdtv, %wodv : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%twv : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%axv, %zero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_dtype"(%wv, %i8 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%wv, %two : !pdl.value, !pdl.attribute)
  %dwv = pdl.result 0 of %dqwv
  %bv = pdl.operand
  %tyv = pdl.type
  %linv = pdl.operation "torch.aten.linear"(%x, %dwv, %bv : !pdl.value, !pdl.value, !pdl.value) -> (%tyv : !pdl.type)
  %yv = pdl.result 0 of %linv
  pdl.apply_native_constraint "single_use"(%yv : !pdl.value)
  %hsv = pdl.operand
  %thv = pdl.type
  %headsv = pdl.operation "torch.aten.reshape"(%yv, %hsv : !pdl.value, !pdl.value) -> (%thv : !pdl.type)
  %hv = pdl.result 0 of %headsv
  pdl.apply_native_constraint "single_use"(%hv : !pdl.value)
  %onev = pdl.operand
  %twov = pdl.operand
  %ttv = pdl.type
  %trv = pdl.operation "torch.aten.transpose.int"(%hv, %onev, %twov : !pdl.value, !pdl.value, !pdl.value) -> (%ttv : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%onev, %i1 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%twov, %i2 : !pdl.value, !pdl.attribute)
  %v = pdl.result 0 of %trv
  pdl.apply_native_constraint "single_use"(%v : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%hsq : !pdl.value)
  pdl.apply_native_constraint "same_constant"(%hsq, %hsk : !pdl.value, !pdl.value)
  pdl.apply_native_constraint "same_constant"(%hsq, %hsv : !pdl.value, !pdl.value)
  %mask = pdl.operand
  %dropout = pdl.operand
  %causal = pdl.operand
  %scale = pdl.operand
  %gqa = pdl.operand
  %ta = pdl.type
  %sdpa = pdl.operation "torch.aten.scaled_dot_product_attention"(%q, %k, %v, %mask, %dropout, %causal, %scale, %gqa : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%ta : !pdl.type)
  %fzero = pdl.attribute = 0.0 : f64
  pdl.apply_native_constraint "constant_equals"(%dropout, %fzero : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "is_constant"(%causal : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%scale : !pdl.value)
  pdl.apply_native_constraint "is_not_none"(%scale : !pdl.value)
  %false = pdl.attribute = false
  pdl.apply_native_constraint "constant_equals"(%gqa, %false : !pdl.value, !pdl.attribute)
  %y = pdl.result 0 of %sdpa
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %one = pdl.operand
  %twob = pdl.operand
  %tt = pdl.type
  %tr = pdl.operation "torch.aten.transpose.int"(%y, %one, %twob : !pdl.value, !pdl.value, !pdl.value) -> (%tt : !pdl.type)
  pdl.apply_native_constraint "constant_equals"(%one, %i1 : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "constant_equals"(%twob, %i2 : !pdl.value, !pdl.attribute)
  %yt = pdl.result 0 of %tr
  pdl.apply_native_constraint "single_use"(%yt : !pdl.value)
  %shape1 = pdl.operand
  %tm = pdl.type
  %merge = pdl.operation "torch.aten.reshape"(%yt, %shape1 : !pdl.value, !pdl.value) -> (%tm : !pdl.type)
  %ym = pdl.result 0 of %merge
  pdl.apply_native_constraint "has_rank"(%ym, %three : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%ym : !pdl.value)
  %os = pdl.operand
  %ozp = pdl.operand
  %omin = pdl.operand
  %omax = pdl.operand
  %odt = pdl.operand
  %tq = pdl.type
  %quant = pdl.operation "torch.quantized_decomposed.quantize_per_tensor"(%ym, %os, %ozp, %omin, %omax, %odt : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%tq : !pdl.type)
  pdl.apply_native_constraint "is_constant"(%os : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%ozp : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omin : !pdl.value)
  pdl.apply_native_constraint "is_constant"(%omax : !pdl.value)
  pdl.rewrite %quant {
    %op = pdl.attribute = "qkv_attention_q_merged"
    pdl.apply_native_rewrite "pdlkit_call"(%op, %xq, %xs, %xzp, %wq, %sq, %zq, %bq, %wk, %sk, %zk, %bk, %wv, %sv, %zv, %bv, %hsq, %mask, %causal, %scale, %os, %ozp, %omin, %omax, %quant : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
