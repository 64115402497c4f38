// SPDX-License-Identifier: MIT
//
// The fused recurrent cells of the sim. For a tensor that is not on the CPU,
// LibTorch's LSTM and GRU cells (aten/src/ATen/native/RNN.cpp) compute the
// two gate products with matmul and hand them to one fused operator that
// only accelerators implement; its backward is another such operator. These
// are those four operators, written as elementwise ATen operations on sim
// tensors (each runs the CPU kernel through the fallback), so LSTM and GRU
// train on sim the way they do on an accelerator and save the same tensors
// for backward (gates, cell state, workspace).
//
// The formulas are the cells' definitions (the LSTM and GRU equations of
// the torch.nn.LSTM / torch.nn.GRU documentation) and their derivatives;
// the workspace layouts are those the operators' backward schemas imply:
//   LSTM workspace [batch, 4 * hidden]: activated gates i, f, g, o.
//   GRU  workspace [batch, 5 * hidden]: r, z, n, hx, and the hidden part of
//                                       the new gate (hn, with its bias).

#include "runtime.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <optional>
#include <string_view>
#include <tuple>

namespace offload::sim::detail {
namespace {

bool present(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// Checks the shapes of a fused cell's arguments: gates [batch, gates *
// hidden], state [batch, hidden], biases [gates * hidden].
void check_cell(std::string_view op, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                const at::Tensor& state, const std::optional<at::Tensor>& input_bias,
                const std::optional<at::Tensor>& hidden_bias, int64_t gates) {
  TORCH_CHECK(state.dim() == 2, op, ": the state must be [batch, hidden], got ", state.sizes());
  const auto batch = state.size(0);
  const auto width = gates * state.size(1);
  TORCH_CHECK(input_gates.dim() == 2 && input_gates.size(0) == batch && input_gates.size(1) == width &&
                  hidden_gates.sizes() == input_gates.sizes(),
              op, ": input_gates and hidden_gates must be [", batch, ", ", width, "], got ", input_gates.sizes(),
              " and ", hidden_gates.sizes());
  TORCH_CHECK(present(input_bias) == present(hidden_bias), op, ": give both biases or neither");
  if (present(input_bias)) {
    TORCH_CHECK(input_bias->dim() == 1 && input_bias->size(0) == width && hidden_bias->sizes() == input_bias->sizes(),
                op, ": the biases must be [", width, "], got ", input_bias->sizes(), " and ", hidden_bias->sizes());
  }
}

at::Tensor with_bias(const at::Tensor& gates, const std::optional<at::Tensor>& bias) {
  return present(bias) ? gates + *bias : gates;
}

// d sigmoid(x) / dx from y = sigmoid(x), and d tanh(x) / dx from y = tanh(x).
at::Tensor dsigmoid(const at::Tensor& y) { return y * (1 - y); }
at::Tensor dtanh(const at::Tensor& y) { return 1 - y * y; }

// hy, cy, workspace. c' = f * c + i * g, h' = o * tanh(c').
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                         const at::Tensor& cx,
                                                         const std::optional<at::Tensor>& input_bias,
                                                         const std::optional<at::Tensor>& hidden_bias) {
  check_cell("aten::_thnn_fused_lstm_cell", input_gates, hidden_gates, cx, input_bias, hidden_bias, 4);
  const auto gates = with_bias(input_gates, input_bias) + with_bias(hidden_gates, hidden_bias);
  const auto chunks = gates.chunk(4, 1);
  const auto i = chunks[0].sigmoid();
  const auto f = chunks[1].sigmoid();
  const auto g = chunks[2].tanh();
  const auto o = chunks[3].sigmoid();
  auto cy = f * cx + i * g;
  auto hy = o * cy.tanh();
  return {std::move(hy), std::move(cy), at::cat({i, f, g, o}, 1)};
}

// grad of the gates (both products), grad of cx, grad of each bias.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                  const std::optional<at::Tensor>& grad_cy,
                                                                  const at::Tensor& cx, const at::Tensor& cy,
                                                                  const at::Tensor& workspace, bool has_bias) {
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(1) == 4 * cy.size(-1),
              "aten::_thnn_fused_lstm_cell_backward_impl: workspace must be [batch, 4 * hidden], got ",
              workspace.sizes());
  const auto w = workspace.chunk(4, 1);
  const auto &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  const auto tanh_cy = cy.tanh();
  auto grad_c = present(grad_cy) ? grad_cy->clone() : at::zeros_like(cy);
  auto grad_o = at::zeros_like(o);
  if (present(grad_hy)) {
    grad_o = *grad_hy * tanh_cy * dsigmoid(o);
    grad_c = grad_c + *grad_hy * o * dtanh(tanh_cy);
  }
  auto grad_gates = at::cat({grad_c * g * dsigmoid(i), grad_c * cx * dsigmoid(f), grad_c * i * dtanh(g), grad_o}, 1);
  auto grad_cx = grad_c * f;
  auto grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {std::move(grad_gates), std::move(grad_cx), std::move(grad_bias)};
}

// hy, workspace. r = s(ir + hr), z = s(iz + hz), n = tanh(in + r * hn),
// h' = (h - n) * z + n.
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                            const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                            const std::optional<at::Tensor>& hidden_bias) {
  check_cell("aten::_thnn_fused_gru_cell", input_gates, hidden_gates, hx, input_bias, hidden_bias, 3);
  const auto in = with_bias(input_gates, input_bias).chunk(3, 1);
  const auto hid = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  const auto r = (in[0] + hid[0]).sigmoid();
  const auto z = (in[1] + hid[1]).sigmoid();
  const auto n = (in[2] + r * hid[2]).tanh();
  auto hy = (hx - n) * z + n;
  return {std::move(hy), at::cat({r, z, n, hx, hid[2]}, 1)};
}

// grads of input_gates, hidden_gates, hx, input_bias, hidden_bias.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(const at::Tensor& grad_hy,
                                                                                         const at::Tensor& workspace,
                                                                                         bool has_bias) {
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(1) == 5 * grad_hy.size(-1),
              "aten::_thnn_fused_gru_cell_backward: workspace must be [batch, 5 * hidden], got ", workspace.sizes());
  const auto w = workspace.chunk(5, 1);
  const auto &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  const auto grad_z = grad_hy * (hx - n) * dsigmoid(z);
  const auto grad_n = grad_hy * (1 - z) * dtanh(n);
  const auto grad_r = grad_n * hn * dsigmoid(r);
  auto grad_input = at::cat({grad_r, grad_z, grad_n}, 1);
  auto grad_hidden = at::cat({grad_r, grad_z, grad_n * r}, 1);
  auto grad_hx = grad_hy * z;
  at::Tensor grad_input_bias, grad_hidden_bias;
  if (has_bias) {
    grad_input_bias = grad_input.sum(0);
    grad_hidden_bias = grad_hidden.sum(0);
  }
  return {std::move(grad_input), std::move(grad_hidden), std::move(grad_hx), std::move(grad_input_bias),
          std::move(grad_hidden_bias)};
}

}  // namespace

void register_cell_kernels(torch::Library& aten) {
  aten.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell));
  aten.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward));
  aten.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell));
  aten.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward));
}

}  // namespace offload::sim::detail
