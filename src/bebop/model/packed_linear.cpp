// oneDNN's matmul on a packed weight (mkldnn::_linear_pointwise), as an op a compiled graph calls from C++.
//
// model/packed_linear.py hands a compiled decoding step's matmuls a packed copy of each weight, which inductor's own
// lowering cannot take as a graph input; its Python custom op does, at the price of a trip through Python on every
// call (several microseconds, fifty calls a decode step). This is the same call made from C++: a boxed call of the
// mkldnn op, the same arguments, so the same result.
#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace {

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                         int64_t out_features) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(packed);
  stack.emplace_back(bias);
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(std::optional<std::string>(std::string("")));
  op.callBoxed(&stack);
  at::Tensor y = stack[0].toTensor();
  TORCH_CHECK(y.size(-1) == out_features, "packed_linear: ", y.size(-1), " outputs, expected ", out_features);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bebop_native, m) {
  m.def("packed_linear(Tensor x, Tensor packed, Tensor? bias, int out_features) -> Tensor");
}

// the packed weight is a oneDNN tensor: the call dispatches on its key, the input's too
TORCH_LIBRARY_IMPL(bebop_native, CPU, m) { m.impl("packed_linear", &packed_linear); }
TORCH_LIBRARY_IMPL(bebop_native, MkldnnCPU, m) { m.impl("packed_linear", &packed_linear); }
