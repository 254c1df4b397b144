// torchao's Int8WeightOnlyConfig linear, as pdlkit desugars its Int8Tensor (pre-dispatch):
// the int8 weight widened to the activation dtype, one mm, the [N, 1] scale rounded to that
// dtype and flattened. torchao rounds the mm to that dtype before the scale; the op rounds
// once, at the end (kernels/ops/int8_weight_only.py).
//   mul(mm(x, to(t(w), d)), flatten(to(ws, d), 0, -1))   ->   pdlkit_call("int8_weight_only_linear", x, w, ws, None)
pdl.pattern @torchao_int8_weight_only : benefit(5) {
  %x = pdl.operand
  %w = pdl.operand
  %ws = pdl.operand
  %tt = pdl.type
  %top = pdl.operation "torch.aten.t"(%w : !pdl.value) -> (%tt : !pdl.type)
  %wt = pdl.result 0 of %top
  %wd = pdl.operand
  %wnb = pdl.operand
  %wcp = pdl.operand
  %wmf = pdl.operand
  %wft = pdl.type
  %wfop = pdl.operation "torch.aten.to.dtype"(%wt, %wd, %wnb, %wcp, %wmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%wft : !pdl.type)
  %wf = pdl.result 0 of %wfop
  %mmt = pdl.type
  %mmop = pdl.operation "torch.aten.mm"(%x, %wf : !pdl.value, !pdl.value) -> (%mmt : !pdl.type)
  %mm = pdl.result 0 of %mmop
  %sd = pdl.operand
  %snb = pdl.operand
  %scp = pdl.operand
  %smf = pdl.operand
  %st = pdl.type
  %sop = pdl.operation "torch.aten.to.dtype"(%ws, %sd, %snb, %scp, %smf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%st : !pdl.type)
  %s = pdl.result 0 of %sop
  %start = pdl.operand
  %end = pdl.operand
  %ft = pdl.type
  %fop = pdl.operation "torch.aten.flatten.using_ints"(%s, %start, %end : !pdl.value, !pdl.value, !pdl.value) -> (%ft : !pdl.type)
  %f = pdl.result 0 of %fop
  %yt = pdl.type
  %root = pdl.operation "torch.aten.mul.Tensor"(%mm, %f : !pdl.value, !pdl.value) -> (%yt : !pdl.type)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%w, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%w, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%x, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%ws, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dtype"(%x, %s : !pdl.value, !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%start, %zero : !pdl.value, !pdl.attribute)
  %last = pdl.attribute = -1 : i64
  pdl.apply_native_constraint "constant_equals"(%end, %last : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%wt : !pdl.value)
  pdl.apply_native_constraint "single_use"(%wf : !pdl.value)
  pdl.apply_native_constraint "single_use"(%mm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
  pdl.apply_native_constraint "single_use"(%f : !pdl.value)
  pdl.rewrite %root {
    %none = pdl.attribute = unit
    %lop = pdl.attribute = "int8_weight_only_linear"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %x, %w, %ws, %none, %root : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.attribute, !pdl.operation)
  }
}

// the same with a bias (torchao adds it in place; matcher/canonical_int8.py's int8_bias_in_place
// makes that add(y, b)):   add(mul(...), b)   ->   pdlkit_call("int8_weight_only_linear", x, w, ws, b)
pdl.pattern @torchao_int8_weight_only_bias : benefit(6) {
  %x = pdl.operand
  %w = pdl.operand
  %ws = pdl.operand
  %tt = pdl.type
  %top = pdl.operation "torch.aten.t"(%w : !pdl.value) -> (%tt : !pdl.type)
  %wt = pdl.result 0 of %top
  %wd = pdl.operand
  %wnb = pdl.operand
  %wcp = pdl.operand
  %wmf = pdl.operand
  %wft = pdl.type
  %wfop = pdl.operation "torch.aten.to.dtype"(%wt, %wd, %wnb, %wcp, %wmf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%wft : !pdl.type)
  %wf = pdl.result 0 of %wfop
  %mmt = pdl.type
  %mmop = pdl.operation "torch.aten.mm"(%x, %wf : !pdl.value, !pdl.value) -> (%mmt : !pdl.type)
  %mm = pdl.result 0 of %mmop
  %sd = pdl.operand
  %snb = pdl.operand
  %scp = pdl.operand
  %smf = pdl.operand
  %st = pdl.type
  %sop = pdl.operation "torch.aten.to.dtype"(%ws, %sd, %snb, %scp, %smf : !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.value) -> (%st : !pdl.type)
  %s = pdl.result 0 of %sop
  %start = pdl.operand
  %end = pdl.operand
  %ft = pdl.type
  %fop = pdl.operation "torch.aten.flatten.using_ints"(%s, %start, %end : !pdl.value, !pdl.value, !pdl.value) -> (%ft : !pdl.type)
  %f = pdl.result 0 of %fop
  %yt = pdl.type
  %mulop = pdl.operation "torch.aten.mul.Tensor"(%mm, %f : !pdl.value, !pdl.value) -> (%yt : !pdl.type)
  %y = pdl.result 0 of %mulop
  %b = pdl.operand
  %alpha = pdl.operand
  %at = pdl.type
  %root = pdl.operation "torch.aten.add.Tensor"(%y, %b, %alpha : !pdl.value, !pdl.value, !pdl.value) -> (%at : !pdl.type)
  %i8 = pdl.attribute = "int8"
  pdl.apply_native_constraint "has_dtype"(%w, %i8 : !pdl.value, !pdl.attribute)
  %two = pdl.attribute = 2 : i64
  pdl.apply_native_constraint "has_rank"(%w, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%x, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%ws, %two : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "same_dtype"(%x, %s : !pdl.value, !pdl.value)
  %zero = pdl.attribute = 0 : i64
  pdl.apply_native_constraint "constant_equals"(%start, %zero : !pdl.value, !pdl.attribute)
  %last = pdl.attribute = -1 : i64
  pdl.apply_native_constraint "constant_equals"(%end, %last : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "single_use"(%wt : !pdl.value)
  pdl.apply_native_constraint "single_use"(%wf : !pdl.value)
  pdl.apply_native_constraint "single_use"(%mm : !pdl.value)
  pdl.apply_native_constraint "single_use"(%s : !pdl.value)
  pdl.apply_native_constraint "single_use"(%f : !pdl.value)
  pdl.apply_native_constraint "single_use"(%y : !pdl.value)
  %one = pdl.attribute = 1 : i64
  pdl.apply_native_constraint "constant_equals"(%alpha, %one : !pdl.value, !pdl.attribute)
  pdl.apply_native_constraint "has_rank"(%b, %one : !pdl.value, !pdl.attribute)
  pdl.rewrite %root {
    %lop = pdl.attribute = "int8_weight_only_linear"
    pdl.apply_native_rewrite "pdlkit_call"(%lop, %x, %w, %ws, %b, %root : !pdl.attribute, !pdl.value, !pdl.value, !pdl.value, !pdl.value, !pdl.operation)
  }
}
