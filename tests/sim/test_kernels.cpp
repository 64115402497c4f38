// SPDX-License-Identifier: MIT
//
// Tests of the sim kernels: model pieces and every trainable torch::nn module
// match the CPU bit for bit, forward and backward; views alias their base.

#include "sim_tests.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

using namespace sim_tests;

namespace {

// --------------------------------------------------------------- model pieces

// What one run of a piece produced: outputs, and leaves whose grads count.
struct PieceRun {
  std::vector<torch::Tensor> outputs;
  std::vector<torch::Tensor> leaves;
};
using Piece = std::function<PieceRun(const c10::Device&)>;

// How a piece's results on sim are compared with the CPU's.
enum class Compare {
  bitwise,  ///< the same bytes
  close,    ///< allclose (rtol 1e-5, atol 1e-6): sim takes the accelerator's algorithm, the CPU another
};

// Runs `piece` on the CPU and on sim:0 (same seeds), back-propagates a fixed
// upstream gradient through every floating output, and checks outputs and
// leaf gradients are equal (bitwise unless `compare` says otherwise) and
// that sim results stayed on sim:0. A leaf without a gradient must lack it
// on both devices.
void check_piece(const std::string& name, const Piece& piece, Compare compare = Compare::bitwise) {
  INFO("piece: " << std::string(name));
  const auto run = [&](const c10::Device& device) {
    torch::manual_seed(1234);
    auto r = piece(device);
    torch::Tensor total;
    for (const auto& out : r.outputs) {
      CHECK(out.device() == device);
      if (out.requires_grad() && out.numel() > 0) {
        const auto upstream = torch::linspace(-1.0, 1.0, out.numel()).view(out.sizes()).to(device);
        const auto term = (out * upstream).sum();
        total = total.defined() ? total + term : term;
      }
    }
    if (total.defined()) {
      total.backward();
    }
    std::vector<torch::Tensor> values;
    for (const auto& out : r.outputs) {
      values.push_back(out.detach().cpu());
    }
    for (const auto& leaf : r.leaves) {
      if (!leaf.grad().defined()) {
        values.emplace_back();
        continue;
      }
      CHECK(leaf.grad().device() == device);
      values.push_back(leaf.grad().cpu());
    }
    return values;
  };
  const auto expected = run(torch::kCPU);
  const auto actual = run(sim_device(0));
  REQUIRE(expected.size() == actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("value " << i);
    REQUIRE(expected[i].defined() == actual[i].defined());
    if (!expected[i].defined()) {
      continue;
    }
    if (compare == Compare::bitwise || !expected[i].is_floating_point()) {
      CHECK(bitwise_equal(expected[i], actual[i]));
    } else {
      CHECK(actual[i].sizes() == expected[i].sizes());
      CHECK(torch::allclose(actual[i], expected[i], 1e-5, 1e-6));
    }
  }
}

torch::Tensor leaf(torch::Tensor cpu, const c10::Device& device) {
  return cpu.to(device).detach().requires_grad_(true);
}

// A tiny GPT-like model built from every piece above.
struct TinyImpl : torch::nn::Module {
  TinyImpl()
      : emb(register_module("emb", torch::nn::Embedding(11, 8))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})))),
        fc(register_module("fc", torch::nn::Linear(8, 11))) {}

  torch::Tensor forward(const torch::Tensor& idx) {
    auto x = emb(idx);  // [B, T, 8]
    auto att = torch::bmm(x, x.transpose(1, 2)) / std::sqrt(8.0);
    att = torch::softmax(att, -1);
    x = x + torch::matmul(att, x);
    x = torch::gelu(ln(x));
    x = torch::dropout(x, 0.2, is_training());
    return fc(x);
  }

  torch::nn::Embedding emb;
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc;
};
TORCH_MODULE(Tiny);

}  // namespace

TEST_CASE("sim: model pieces match the CPU bit for bit, forward and backward") {
  check_piece("linear", [](const c10::Device& d) {
    torch::nn::Linear lin(8, 5);
    lin->to(d);
    const auto x = leaf(torch::randn({3, 8}), d);
    return PieceRun{{lin(x)}, {x, lin->weight, lin->bias}};
  });
  check_piece("embedding", [](const c10::Device& d) {
    torch::nn::Embedding emb(10, 6);
    emb->to(d);
    const auto idx = torch::tensor({{1, 2, 2}, {9, 0, 1}}, torch::kLong).to(d);
    return PieceRun{{emb(idx)}, {emb->weight}};
  });
  check_piece("layer_norm", [](const c10::Device& d) {
    torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({6}));
    ln->to(d);
    const auto x = leaf(torch::randn({4, 6}) * 3 + 1, d);
    return PieceRun{{ln(x)}, {x, ln->weight, ln->bias}};
  });
  check_piece("gelu, softmax, log_softmax", [](const c10::Device& d) {
    const auto x = leaf(torch::randn({5, 7}), d);
    return PieceRun{{torch::gelu(x), torch::softmax(x, 1), torch::log_softmax(x, 0)}, {x}};
  });
  check_piece("dropout (training)", [](const c10::Device& d) {
    const auto x = leaf(torch::randn({64}), d);
    torch::manual_seed(99);
    return PieceRun{{torch::dropout(x, 0.3, true)}, {x}};
  });
  check_piece("cross_entropy", [](const c10::Device& d) {
    const auto logits = leaf(torch::randn({6, 11}), d);
    const auto target = torch::tensor({0, 3, 10, 3, 7, 1}, torch::kLong).to(d);
    return PieceRun{{torch::nn::functional::cross_entropy(logits, target)}, {logits}};
  });
  check_piece("matmul, bmm", [](const c10::Device& d) {
    const auto a = leaf(torch::randn({2, 3, 4}), d);
    const auto b = leaf(torch::randn({2, 4, 5}), d);
    const auto m = leaf(torch::randn({4, 2}), d);
    return PieceRun{{torch::bmm(a, b), torch::matmul(a, m)}, {a, b, m}};
  });
  check_piece("views, slices, transposes, expand", [](const c10::Device& d) {
    const auto x = leaf(torch::randn({4, 6}), d);
    const auto y = x.t().slice(0, 1, 5).narrow(1, 1, 2);        // [4, 2], offset and strides
    const auto z = x.select(0, 2).unsqueeze(0).expand({3, 6});  // stride 0
    const auto w = x.view({2, 12}).permute({1, 0}).reshape({6, 4});
    const auto parts = x.chunk(2, 1);
    return PieceRun{{y * 2, z + 1, w.contiguous(), parts[1] * parts[0]}, {x}};
  });
}

// --------------------------------------------------------------- torch::nn coverage

namespace {

namespace nn = torch::nn;
using Shapes = std::vector<std::vector<int64_t>>;

// A piece that builds a module (after check_piece's seed, so both devices get
// the same parameters), moves it to the device, and calls it on leaves of
// `shapes` (standard normal). Outputs: what `call` returns, then the
// module's buffers (BatchNorm's running statistics); leaves: the inputs and
// the parameters.
template <class Make, class Call>
Piece module_piece(Make make, Shapes shapes, Call call, bool channels_last = false) {
  return [=](const c10::Device& d) {
    auto m = make();
    m->to(d);
    std::vector<torch::Tensor> xs;
    for (const auto& shape : shapes) {
      auto x = torch::randn(shape);
      if (channels_last) {
        x = x.contiguous(x.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d);
      }
      xs.push_back(leaf(x, d));
    }
    PieceRun r{call(m, xs), xs};
    for (const auto& b : m->buffers()) {
      r.outputs.push_back(b);
    }
    for (const auto& p : m->parameters()) {
      r.leaves.push_back(p);
    }
    return r;
  };
}

template <class Make>
Piece unary(Make make, std::vector<int64_t> shape, bool channels_last = false) {
  return module_piece(
      make, {std::move(shape)},
      [](auto& m, std::vector<torch::Tensor>& x) { return std::vector<torch::Tensor>{m(x[0])}; }, channels_last);
}

// A loss module on `inputs` leaf inputs of `shape` and a target made by
// `target` (on the CPU, then moved).
template <int inputs = 1, class Make>
Piece loss_piece(Make make, std::vector<int64_t> shape, std::function<torch::Tensor()> target) {
  return [=](const c10::Device& d) {
    auto m = make();
    m->to(d);
    std::vector<torch::Tensor> xs;
    for (int i = 0; i < inputs; ++i) {
      xs.push_back(leaf(torch::randn(shape), d));
    }
    const auto t = target().to(d);
    torch::Tensor out;
    if constexpr (inputs == 2) {
      out = m(xs.at(0), xs.at(1), t);
    } else {
      out = m(xs.at(0), t);
    }
    return PieceRun{{out}, xs};
  };
}

template <class Make>
Piece triple_piece(Make make, std::vector<int64_t> shape) {
  return module_piece(make, {shape, shape, shape}, [](auto& m, std::vector<torch::Tensor>& x) {
    auto out = m(x[0], x[1], x[2]);
    if constexpr (std::is_same_v<decltype(out), torch::Tensor>) {
      return std::vector<torch::Tensor>{out};
    } else {
      return std::vector<torch::Tensor>{std::get<0>(out), std::get<1>(out)};  // attention: output, weights
    }
  });
}

// Recurrent modules: the output and the final state(s).
template <class Make>
Piece recurrent(Make make, std::vector<int64_t> shape) {
  return module_piece(make, {std::move(shape)}, [](auto& m, std::vector<torch::Tensor>& x) {
    auto [out, state] = m(x[0]);
    if constexpr (requires { std::get<0>(state); }) {
      return std::vector<torch::Tensor>{out, std::get<0>(state), std::get<1>(state)};
    } else {
      return std::vector<torch::Tensor>{out, state};
    }
  });
}

torch::Tensor rand01(std::vector<int64_t> shape) { return torch::rand(shape); }
torch::Tensor classes(std::vector<int64_t> shape, int64_t n) { return torch::randint(n, shape, torch::kLong); }
torch::Tensor signs(std::vector<int64_t> shape) { return torch::randint(2, shape, torch::kFloat) * 2 - 1; }

}  // namespace

TEST_CASE("sim: every trainable torch::nn module matches the CPU, forward and backward") {
  const auto check = [](const std::string& name, const Piece& piece, Compare compare = Compare::bitwise) {
    SUBCASE(name.c_str()) { check_piece(name, piece, compare); }
  };

  // convolutions
  check("Conv1d", unary([] { return nn::Conv1d(nn::Conv1dOptions(3, 4, 3).stride(2).padding(1)); }, {2, 3, 9}));
  check("Conv2d groups dilation",
        unary([] { return nn::Conv2d(nn::Conv2dOptions(4, 6, 3).groups(2).dilation(2).padding(2)); }, {2, 4, 7, 7}));
  check("Conv2d padding same, channels_last",
        unary([] { return nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(torch::kSame).bias(false)); }, {2, 3, 6, 6},
              true));
  check("Conv2d depthwise", unary([] { return nn::Conv2d(nn::Conv2dOptions(4, 4, 3).groups(4)); }, {1, 4, 6, 6}));
  check("Conv3d", unary([] { return nn::Conv3d(nn::Conv3dOptions(2, 3, 2).stride(1)); }, {1, 2, 4, 4, 4}));
  check("Conv3d channels_last",
        unary([] { return nn::Conv3d(nn::Conv3dOptions(2, 3, 3).padding(1)); }, {1, 2, 4, 4, 4}, true));
  check("ConvTranspose1d",
        unary([] { return nn::ConvTranspose1d(nn::ConvTranspose1dOptions(3, 2, 3).stride(2).output_padding(1)); },
              {2, 3, 5}));
  check(
      "ConvTranspose2d groups",
      unary([] { return nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 2, 2).stride(2).groups(2)); }, {1, 4, 3, 3}));
  check("ConvTranspose2d channels_last",
        unary([] { return nn::ConvTranspose2d(nn::ConvTranspose2dOptions(3, 3, 3).padding(1).dilation(2)); },
              {2, 3, 4, 4}, true));
  check("ConvTranspose3d",
        unary([] { return nn::ConvTranspose3d(nn::ConvTranspose3dOptions(2, 2, 2).stride(2)); }, {1, 2, 2, 3, 3}));

  // pooling
  check("MaxPool1d", unary([] { return nn::MaxPool1d(nn::MaxPool1dOptions(2)); }, {2, 3, 8}));
  check("MaxPool2d", unary([] { return nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)); }, {2, 3, 7, 7}));
  check("MaxPool2d channels_last", unary([] { return nn::MaxPool2d(nn::MaxPool2dOptions(2)); }, {2, 3, 6, 6}, true));
  check("MaxPool3d", unary([] { return nn::MaxPool3d(nn::MaxPool3dOptions(2)); }, {1, 2, 4, 4, 4}));
  check("AvgPool1d", unary([] { return nn::AvgPool1d(nn::AvgPool1dOptions(3).stride(2)); }, {2, 3, 9}));
  check("AvgPool2d", unary([] { return nn::AvgPool2d(nn::AvgPool2dOptions(2).ceil_mode(true)); }, {2, 3, 5, 5}));
  check("AvgPool3d", unary([] { return nn::AvgPool3d(nn::AvgPool3dOptions(2)); }, {1, 2, 4, 4, 4}));
  check("AdaptiveAvgPool1d", unary([] { return nn::AdaptiveAvgPool1d(nn::AdaptiveAvgPool1dOptions(3)); }, {2, 3, 7}));
  check("AdaptiveAvgPool2d",
        unary([] { return nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})); }, {2, 3, 5, 5}));
  check("AdaptiveAvgPool3d",
        unary([] { return nn::AdaptiveAvgPool3d(nn::AdaptiveAvgPool3dOptions(2)); }, {1, 2, 5, 5, 5}));
  check("AdaptiveMaxPool1d", unary([] { return nn::AdaptiveMaxPool1d(nn::AdaptiveMaxPool1dOptions(3)); }, {2, 3, 7}));
  check("AdaptiveMaxPool2d",
        unary([] { return nn::AdaptiveMaxPool2d(nn::AdaptiveMaxPool2dOptions({2, 3})); }, {2, 3, 5, 7}));
  check("AdaptiveMaxPool3d",
        unary([] { return nn::AdaptiveMaxPool3d(nn::AdaptiveMaxPool3dOptions(2)); }, {1, 2, 5, 5, 5}));
  check("LPPool1d", unary([] { return nn::LPPool1d(nn::LPPool1dOptions(2, 2)); }, {2, 3, 8}));
  check("LPPool2d", unary([] { return nn::LPPool2d(nn::LPPool2dOptions(2, 2)); }, {2, 3, 6, 6}));
  check("LPPool3d", unary([] { return nn::LPPool3d(nn::LPPool3dOptions(2, 2)); }, {1, 2, 4, 4, 4}));
  check("FractionalMaxPool2d",
        unary([] { return nn::FractionalMaxPool2d(nn::FractionalMaxPool2dOptions(2).output_size(3)); }, {2, 3, 7, 7}));
  check(
      "FractionalMaxPool3d",
      unary([] { return nn::FractionalMaxPool3d(nn::FractionalMaxPool3dOptions(2).output_size(2)); }, {1, 2, 5, 5, 5}));
  check("MaxUnpool2d", module_piece([] { return nn::MaxPool2d(nn::MaxPool2dOptions(2).stride(2)); }, {{1, 2, 4, 4}},
                                    [](auto& m, std::vector<torch::Tensor>& x) {
                                      auto [y, idx] = m->forward_with_indices(x[0]);
                                      nn::MaxUnpool2d unpool(nn::MaxUnpool2dOptions(2).stride(2));
                                      unpool->to(x[0].device());
                                      return std::vector<torch::Tensor>{unpool(y, idx)};
                                    }));
  check("MaxUnpool1d",
        module_piece([] { return nn::MaxPool1d(nn::MaxPool1dOptions(2)); }, {{1, 2, 8}},
                     [](auto& m, std::vector<torch::Tensor>& x) {
                       auto [y, idx] = m->forward_with_indices(x[0]);
                       return std::vector<torch::Tensor>{nn::MaxUnpool1d(nn::MaxUnpool1dOptions(2))(y, idx)};
                     }));
  check("MaxUnpool3d",
        module_piece([] { return nn::MaxPool3d(nn::MaxPool3dOptions(2)); }, {{1, 1, 4, 4, 4}},
                     [](auto& m, std::vector<torch::Tensor>& x) {
                       auto [y, idx] = m->forward_with_indices(x[0]);
                       return std::vector<torch::Tensor>{nn::MaxUnpool3d(nn::MaxUnpool3dOptions(2))(y, idx)};
                     }));

  // normalizations (training mode: batch statistics, running statistics updated)
  check("BatchNorm1d", unary([] { return nn::BatchNorm1d(4); }, {5, 4}));
  check("BatchNorm2d", unary([] { return nn::BatchNorm2d(3); }, {4, 3, 5, 5}));
  check("BatchNorm2d channels_last", unary([] { return nn::BatchNorm2d(3); }, {4, 3, 5, 5}, true));
  check("BatchNorm3d", unary([] { return nn::BatchNorm3d(2); }, {2, 2, 3, 3, 3}));
  check("InstanceNorm1d",
        unary([] { return nn::InstanceNorm1d(nn::InstanceNorm1dOptions(3).affine(true).track_running_stats(true)); },
              {2, 3, 8}));
  check("InstanceNorm2d",
        unary([] { return nn::InstanceNorm2d(nn::InstanceNorm2dOptions(3).affine(true)); }, {2, 3, 5, 5}));
  check("InstanceNorm3d",
        unary([] { return nn::InstanceNorm3d(nn::InstanceNorm3dOptions(2).affine(true)); }, {2, 2, 3, 3, 3}));
  check("LayerNorm", unary([] { return nn::LayerNorm(nn::LayerNormOptions({5, 6})); }, {3, 5, 6}));
  check("GroupNorm", unary([] { return nn::GroupNorm(nn::GroupNormOptions(2, 4)); }, {3, 4, 5, 5}));
  // GroupNorm's backward formula keeps channels_last on the CPU only and
  // makes gradient and input contiguous on any other device: a different CPU
  // kernel path on sim (docs/support-matrix.md).
  check("GroupNorm channels_last", unary([] { return nn::GroupNorm(nn::GroupNormOptions(2, 4)); }, {3, 4, 5, 5}, true),
        Compare::close);
  check("LocalResponseNorm",
        unary([] { return nn::LocalResponseNorm(nn::LocalResponseNormOptions(3)); }, {2, 5, 4, 4}));
  check("CrossMapLRN2d", unary([] { return nn::CrossMapLRN2d(nn::CrossMapLRN2dOptions(3)); }, {2, 5, 4, 4}));

  // activations
  check("ReLU", unary([] { return nn::ReLU(); }, {4, 7}));
  check("ReLU6", unary([] { return nn::ReLU6(); }, {4, 7}));
  check("LeakyReLU", unary([] { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.1)); }, {4, 7}));
  check("PReLU", unary([] { return nn::PReLU(nn::PReLUOptions().num_parameters(3)); }, {4, 3, 5}));
  check("RReLU (training)", unary([] { return nn::RReLU(); }, {4, 7}));
  check("ELU", unary([] { return nn::ELU(); }, {4, 7}));
  check("SELU", unary([] { return nn::SELU(); }, {4, 7}));
  check("CELU", unary([] { return nn::CELU(nn::CELUOptions().alpha(0.5)); }, {4, 7}));
  check("GELU", unary([] { return nn::GELU(); }, {4, 7}));
  check("GELU tanh", unary([] { return nn::GELU(nn::GELUOptions().approximate("tanh")); }, {4, 7}));
  check("SiLU", unary([] { return nn::SiLU(); }, {4, 7}));
  check("Mish", unary([] { return nn::Mish(); }, {4, 7}));
  check("Sigmoid", unary([] { return nn::Sigmoid(); }, {4, 7}));
  check("Tanh", unary([] { return nn::Tanh(); }, {4, 7}));
  check("Softplus", unary([] { return nn::Softplus(); }, {4, 7}));
  check("Softshrink", unary([] { return nn::Softshrink(); }, {4, 7}));
  check("Hardshrink", unary([] { return nn::Hardshrink(); }, {4, 7}));
  check("Tanhshrink", unary([] { return nn::Tanhshrink(); }, {4, 7}));
  check("Hardtanh", unary([] { return nn::Hardtanh(); }, {4, 7}));
  check("LogSigmoid", unary([] { return nn::LogSigmoid(); }, {4, 7}));
  check("Softsign", unary([] { return nn::Softsign(); }, {4, 7}));
  check("Threshold", unary([] { return nn::Threshold(0.1, 20.0); }, {4, 7}));
  check("GLU", unary([] { return nn::GLU(); }, {4, 8}));
  check("Softmax", unary([] { return nn::Softmax(1); }, {4, 7}));
  check("Softmin", unary([] { return nn::Softmin(1); }, {4, 7}));
  check("LogSoftmax", unary([] { return nn::LogSoftmax(1); }, {4, 7}));
  check("Softmax2d", unary([] { return nn::Softmax2d(); }, {2, 3, 4, 4}));
  check("MultiheadAttention",
        triple_piece([] { return nn::MultiheadAttention(nn::MultiheadAttentionOptions(8, 2)); }, {5, 2, 8}));

  // linear, embedding, dropout, shape
  check("Linear", unary([] { return nn::Linear(6, 4); }, {3, 6}));
  check("Bilinear",
        module_piece([] { return nn::Bilinear(3, 4, 5); }, {{2, 3}, {2, 4}},
                     [](auto& m, std::vector<torch::Tensor>& x) { return std::vector<torch::Tensor>{m(x[0], x[1])}; }));
  check("Identity, Flatten, Unflatten", module_piece([] { return nn::Flatten(); }, {{2, 3, 4}},
                                                     [](auto& m, std::vector<torch::Tensor>& x) {
                                                       return std::vector<torch::Tensor>{nn::Unflatten(
                                                           nn::UnflattenOptions(1, {4, 3}))(m(nn::Identity()(x[0])))};
                                                     }));
  check("Embedding", [](const c10::Device& d) {
    nn::Embedding m(nn::EmbeddingOptions(10, 4).padding_idx(0).max_norm(2.0));
    m->to(d);
    return PieceRun{{m(torch::tensor({{1, 0, 3}, {9, 3, 3}}, torch::kLong).to(d))}, {m->weight}};
  });
  for (const auto mode : {"sum", "mean", "max"}) {
    check(std::string("EmbeddingBag ") + mode, [mode](const c10::Device& d) {
      nn::EmbeddingBagOptions options(10, 4);
      if (std::string(mode) == "sum") options.mode(torch::kSum);
      if (std::string(mode) == "mean") options.mode(torch::kMean);
      if (std::string(mode) == "max") options.mode(torch::kMax);
      nn::EmbeddingBag m(options);
      m->to(d);
      const auto idx = torch::tensor({1, 2, 4, 5, 4, 3, 2, 9}, torch::kLong).to(d);
      const auto offsets = torch::tensor({0, 3, 5}, torch::kLong).to(d);
      return PieceRun{{m(idx, offsets)}, {m->weight}};
    });
  }
  check("Dropout", unary([] { return nn::Dropout(0.3); }, {8, 8}));
  check("Dropout2d", unary([] { return nn::Dropout2d(0.3); }, {2, 4, 3, 3}));
  check("Dropout3d", unary([] { return nn::Dropout3d(0.3); }, {2, 4, 2, 3, 3}));
  check("AlphaDropout", unary([] { return nn::AlphaDropout(0.3); }, {8, 8}));
  check("FeatureAlphaDropout", unary([] { return nn::FeatureAlphaDropout(0.3); }, {2, 4, 3, 3}));
  check("CosineSimilarity",
        module_piece([] { return nn::CosineSimilarity(); }, {{4, 6}, {4, 6}},
                     [](auto& m, std::vector<torch::Tensor>& x) { return std::vector<torch::Tensor>{m(x[0], x[1])}; }));
  check("PairwiseDistance",
        module_piece([] { return nn::PairwiseDistance(); }, {{4, 6}, {4, 6}},
                     [](auto& m, std::vector<torch::Tensor>& x) { return std::vector<torch::Tensor>{m(x[0], x[1])}; }));

  // recurrent: sim takes the accelerator's path (fused cells, per-step
  // products), the CPU its own (oneDNN LSTM; input products of all steps at
  // once), so values agree to rounding only (docs/support-matrix.md).
  check("RNN tanh 2 layers", recurrent([] { return nn::RNN(nn::RNNOptions(4, 5).num_layers(2)); }, {3, 2, 4}),
        Compare::close);
  check(
      "RNN relu bidirectional batch_first",
      recurrent(
          [] { return nn::RNN(nn::RNNOptions(4, 5).nonlinearity(torch::kReLU).bidirectional(true).batch_first(true)); },
          {2, 3, 4}),
      Compare::close);
  check("LSTM 2 layers batch_first",
        recurrent([] { return nn::LSTM(nn::LSTMOptions(4, 5).num_layers(2).batch_first(true)); }, {2, 3, 4}),
        Compare::close);
  check("LSTM bidirectional, projections",
        recurrent([] { return nn::LSTM(nn::LSTMOptions(4, 5).bidirectional(true).proj_size(3)); }, {3, 2, 4}),
        Compare::close);
  check("GRU 2 layers batch_first",
        recurrent([] { return nn::GRU(nn::GRUOptions(4, 5).num_layers(2).batch_first(true)); }, {2, 3, 4}),
        Compare::close);
  check("GRU bidirectional", recurrent([] { return nn::GRU(nn::GRUOptions(4, 5).bidirectional(true)); }, {3, 2, 4}),
        Compare::close);
  check("RNNCell", unary([] { return nn::RNNCell(4, 5); }, {3, 4}), Compare::close);
  check("LSTMCell",
        module_piece([] { return nn::LSTMCell(4, 5); }, {{3, 4}},
                     [](auto& m, std::vector<torch::Tensor>& x) {
                       auto [h, c] = m(x[0]);
                       return std::vector<torch::Tensor>{h, c};
                     }),
        Compare::close);
  check("GRUCell", unary([] { return nn::GRUCell(4, 5); }, {3, 4}), Compare::close);

  // transformer
  check("TransformerEncoderLayer",
        unary([] { return nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(8, 2).dim_feedforward(16)); },
              {5, 2, 8}));
  check("TransformerDecoderLayer",
        module_piece(
            [] { return nn::TransformerDecoderLayer(nn::TransformerDecoderLayerOptions(8, 2).dim_feedforward(16)); },
            {{4, 2, 8}, {5, 2, 8}},
            [](auto& m, std::vector<torch::Tensor>& x) { return std::vector<torch::Tensor>{m(x[0], x[1])}; }));
  check("Transformer",
        module_piece([] { return nn::Transformer(nn::TransformerOptions(8, 2, 1, 1).dim_feedforward(16)); },
                     {{5, 2, 8}, {4, 2, 8}},
                     [](auto& m, std::vector<torch::Tensor>& x) { return std::vector<torch::Tensor>{m(x[0], x[1])}; }));

  // padding, upsampling, pixel shuffle, fold/unfold
  check("ReflectionPad1d", unary([] { return nn::ReflectionPad1d(2); }, {2, 3, 6}));
  check("ReflectionPad2d",
        unary([] { return nn::ReflectionPad2d(nn::ReflectionPad2dOptions({1, 2, 2, 1})); }, {2, 3, 5, 5}));
  check("ReflectionPad3d", unary([] { return nn::ReflectionPad3d(1); }, {1, 2, 3, 3, 3}));
  check("ReplicationPad1d", unary([] { return nn::ReplicationPad1d(2); }, {2, 3, 6}));
  check("ReplicationPad2d", unary([] { return nn::ReplicationPad2d(2); }, {2, 3, 5, 5}));
  check("ReplicationPad3d", unary([] { return nn::ReplicationPad3d(1); }, {1, 2, 3, 3, 3}));
  check("ZeroPad1d", unary([] { return nn::ZeroPad1d(2); }, {2, 3, 6}));
  check("ZeroPad2d", unary([] { return nn::ZeroPad2d(nn::ZeroPad2dOptions({1, 0, 2, 1})); }, {2, 3, 5, 5}));
  check("ZeroPad3d", unary([] { return nn::ZeroPad3d(1); }, {1, 2, 3, 3, 3}));
  check("ConstantPad1d", unary([] { return nn::ConstantPad1d(nn::ConstantPad1dOptions(2, 0.5)); }, {2, 3, 6}));
  check("ConstantPad2d", unary([] { return nn::ConstantPad2d(nn::ConstantPad2dOptions(1, -1.0)); }, {2, 3, 5, 5}));
  check("ConstantPad3d", unary([] { return nn::ConstantPad3d(nn::ConstantPad3dOptions(1, 2.0)); }, {1, 2, 3, 3, 3}));
  check("Upsample nearest",
        unary(
            [] {
              return nn::Upsample(nn::UpsampleOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest));
            },
            {2, 3, 4, 4}));
  check("Upsample nearest channels_last",
        unary(
            [] {
              return nn::Upsample(nn::UpsampleOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest));
            },
            {2, 3, 4, 4}, true));
  check("Upsample linear",
        unary(
            [] {
              return nn::Upsample(
                  nn::UpsampleOptions().size(std::vector<int64_t>{9}).mode(torch::kLinear).align_corners(true));
            },
            {2, 3, 4}));
  check("Upsample bilinear", unary(
                                 [] {
                                   return nn::Upsample(nn::UpsampleOptions()
                                                           .scale_factor(std::vector<double>{2, 2})
                                                           .mode(torch::kBilinear)
                                                           .align_corners(false));
                                 },
                                 {2, 3, 4, 4}));
  check("Upsample bicubic",
        unary(
            [] {
              return nn::Upsample(
                  nn::UpsampleOptions().size(std::vector<int64_t>{7, 7}).mode(torch::kBicubic).align_corners(false));
            },
            {1, 2, 4, 4}));
  check("Upsample trilinear", unary(
                                  [] {
                                    return nn::Upsample(nn::UpsampleOptions()
                                                            .scale_factor(std::vector<double>{2, 2, 2})
                                                            .mode(torch::kTrilinear)
                                                            .align_corners(false));
                                  },
                                  {1, 2, 3, 3, 3}));
  check("PixelShuffle", unary([] { return nn::PixelShuffle(2); }, {2, 8, 3, 3}));
  check("PixelUnshuffle", unary([] { return nn::PixelUnshuffle(2); }, {2, 2, 4, 4}));
  check("Fold", unary([] { return nn::Fold(nn::FoldOptions({4, 5}, {2, 2})); }, {2, 12, 12}));
  check("Unfold", unary([] { return nn::Unfold(nn::UnfoldOptions({2, 3}).padding(1).stride(2)); }, {2, 3, 5, 5}));

  // losses
  const auto same = [](std::vector<int64_t> s) { return [s] { return torch::randn(s); }; };
  check("L1Loss", loss_piece([] { return nn::L1Loss(); }, {4, 5}, same({4, 5})));
  check("MSELoss", loss_piece([] { return nn::MSELoss(); }, {4, 5}, same({4, 5})));
  check("HuberLoss", loss_piece([] { return nn::HuberLoss(nn::HuberLossOptions().delta(0.5)); }, {4, 5}, same({4, 5})));
  check("SmoothL1Loss", loss_piece([] { return nn::SmoothL1Loss(); }, {4, 5}, same({4, 5})));
  check("CrossEntropyLoss label smoothing",
        loss_piece([] { return nn::CrossEntropyLoss(nn::CrossEntropyLossOptions().label_smoothing(0.1)); }, {6, 5},
                   [] { return classes({6}, 5); }));
  check("CrossEntropyLoss probabilities", loss_piece([] { return nn::CrossEntropyLoss(); }, {6, 5},
                                                     [] { return torch::softmax(torch::randn({6, 5}), 1); }));
  check("NLLLoss weighted", [](const c10::Device& d) {
    nn::NLLLoss m(nn::NLLLossOptions().weight(torch::rand({5})).ignore_index(2));
    m->to(d);
    const auto x = leaf(torch::log_softmax(torch::randn({6, 5}), 1), d);
    return PieceRun{{m(x, classes({6}, 5).to(d))}, {x}};
  });
  check("BCELoss", [](const c10::Device& d) {
    nn::BCELoss m;
    const auto x = leaf(torch::randn({4, 5}), d);
    return PieceRun{{m(torch::sigmoid(x), rand01({4, 5}).to(d))}, {x}};
  });
  check(
      "BCEWithLogitsLoss",
      loss_piece([] { return nn::BCEWithLogitsLoss(nn::BCEWithLogitsLossOptions().pos_weight(torch::full({5}, 2.0))); },
                 {4, 5}, [] { return rand01({4, 5}); }));
  check("KLDivLoss", loss_piece([] { return nn::KLDivLoss(nn::KLDivLossOptions().reduction(torch::kBatchMean)); },
                                {4, 5}, [] { return torch::softmax(torch::randn({4, 5}), 1); }));
  check("PoissonNLLLoss", loss_piece([] { return nn::PoissonNLLLoss(); }, {4, 5}, [] { return rand01({4, 5}) * 3; }));
  check("SoftMarginLoss", loss_piece([] { return nn::SoftMarginLoss(); }, {4, 5}, [] { return signs({4, 5}); }));
  check("HingeEmbeddingLoss",
        loss_piece([] { return nn::HingeEmbeddingLoss(); }, {4, 5}, [] { return signs({4, 5}); }));
  check("MultiLabelSoftMarginLoss", loss_piece([] { return nn::MultiLabelSoftMarginLoss(); }, {4, 5},
                                               [] { return torch::randint(2, {4, 5}, torch::kFloat); }));
  check("MultiLabelMarginLoss",
        loss_piece([] { return nn::MultiLabelMarginLoss(); }, {3, 4},
                   [] { return torch::tensor({{3, 0, -1, 1}, {1, 2, 3, -1}, {0, -1, 0, 0}}, torch::kLong); }));
  check("MultiMarginLoss", loss_piece([] { return nn::MultiMarginLoss(); }, {6, 5}, [] { return classes({6}, 5); }));
  check("CosineEmbeddingLoss",
        loss_piece<2>([] { return nn::CosineEmbeddingLoss(); }, {4, 6}, [] { return signs({4}); }));
  check("MarginRankingLoss", loss_piece<2>([] { return nn::MarginRankingLoss(); }, {6}, [] { return signs({6}); }));
  check("TripletMarginLoss", triple_piece([] { return nn::TripletMarginLoss(); }, {4, 6}));
  check("TripletMarginWithDistanceLoss", triple_piece([] { return nn::TripletMarginWithDistanceLoss(); }, {4, 6}));
  check("AdaptiveLogSoftmaxWithLoss", [](const c10::Device& d) {
    nn::AdaptiveLogSoftmaxWithLoss m(nn::AdaptiveLogSoftmaxWithLossOptions(6, 10, {4, 8}).div_value(2.0));
    m->to(d);
    const auto x = leaf(torch::randn({5, 6}), d);
    const auto out = m(x, classes({5}, 10).to(d));
    auto leaves = m->parameters();
    leaves.push_back(x);
    return PieceRun{{out.output}, leaves};
  });
  check("CTCLoss", [](const c10::Device& d) {
    nn::CTCLoss m;
    m->to(d);
    const auto x = leaf(torch::log_softmax(torch::randn({8, 2, 5}), 2), d);
    const auto targets = torch::tensor({{1, 2, 2}, {3, 4, 1}}, torch::kLong).to(d);
    const auto input_lengths = torch::tensor({8, 7}, torch::kLong);
    const auto target_lengths = torch::tensor({3, 2}, torch::kLong);
    return PieceRun{{m(x, targets, input_lengths, target_lengths)}, {x}};
  });
}

TEST_CASE("sim: conjugate and negative bits are honoured, without recursion") {
  check_piece("c * c.conj()", [](const c10::Device& d) {
    const auto h = leaf(torch::randn({64}), d);
    const auto c = torch::view_as_complex(h.reshape({4, 8, 2}));
    return PieceRun{{torch::view_as_real(c * c.conj()), torch::view_as_real(c.conj().resolve_conj()),
                     torch::view_as_real(c.conj() * 2)},
                    {h}};
  });
  const auto dev = sim_device(0);
  const auto cpu = torch::view_as_complex(torch::randn({4, 8, 2}));
  const auto expected = cpu.conj().resolve_conj();
  CHECK(torch::equal(cpu.conj().to(dev).cpu().resolve_conj(), expected));  // a conj CPU tensor to sim
  CHECK(torch::equal(cpu.to(dev).conj().cpu().resolve_conj(), expected));  // a conj sim tensor to the CPU
  CHECK(torch::equal(cpu.to(dev).conj().clone().cpu().resolve_conj(), expected));
  const auto real = torch::randn({5});
  CHECK(torch::equal(real.to(dev)._neg_view().cpu().resolve_neg(), -real));
  CHECK(torch::equal(real._neg_view().to(dev).cpu().resolve_neg(), -real));
}

TEST_CASE("sim: an operator sim cannot run raises an error naming it and the device") {
  const auto x = torch::randn({8}).to(sim_device(1));
  const auto msg = error_of([&] { (void)at::_fused_dropout(x, 0.5); });
  CHECK(msg.find("aten::_fused_dropout") != std::string::npos);
  CHECK(msg.find("sim:1") != std::string::npos);
  CHECK_THROWS_AS((void)at::_fused_dropout(x, 0.5), c10::NotImplementedError);
}

TEST_CASE("sim: AdamW steps on a tiny model match the CPU bit for bit") {
  const auto train = [](const c10::Device& d) {
    torch::manual_seed(7);
    Tiny model;
    model->to(d);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    const auto idx = torch::tensor({{1, 2, 3, 4}, {5, 6, 7, 8}}, torch::kLong).to(d);
    const auto target = torch::tensor({{2, 3, 4, 5}, {6, 7, 8, 9}}, torch::kLong).to(d);
    std::vector<torch::Tensor> out;
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      const auto logits = model->forward(idx);
      const auto loss = torch::nn::functional::cross_entropy(logits.view({-1, 11}), target.view({-1}));
      loss.backward();
      opt.step();
      CHECK(loss.device() == d);
      out.push_back(loss.detach().cpu());
    }
    for (const auto& p : model->parameters()) {
      CHECK(p.device() == d);
      out.push_back(p.detach().cpu());
    }
    return out;
  };
  const auto expected = train(torch::kCPU);
  const auto actual = train(sim_device(0));
  REQUIRE(expected.size() == actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("value " << i);
    CHECK(bitwise_equal(expected[i], actual[i]));
  }
}

TEST_CASE("sim: views alias their base") {
  const auto d = sim_device();
  const auto base = torch::zeros({4, 6}, torch::TensorOptions().device(d));
  const auto expect = torch::zeros({4, 6});
  const auto same = [&] { return bitwise_equal(base, expect); };

  base.t().select(0, 1).add_(1);  // column 1
  expect.t().select(0, 1).add_(1);
  CHECK(same());
  base.slice(1, 2, 4).narrow(0, 1, 2).fill_(5);
  expect.slice(1, 2, 4).narrow(0, 1, 2).fill_(5);
  CHECK(same());
  base.view({24}).slice(0, 20).mul_(0).add_(3);
  expect.view({24}).slice(0, 20).mul_(0).add_(3);
  CHECK(same());
  base.permute({1, 0}).unsqueeze(0).squeeze(0)[5].sub_(2);
  expect.permute({1, 0}).unsqueeze(0).squeeze(0)[5].sub_(2);
  CHECK(same());
  base.split(2, 0)[1].add_(10);
  expect.split(2, 0)[1].add_(10);
  CHECK(same());
  base.chunk(3, 1)[2].detach().add_(100);
  expect.chunk(3, 1)[2].detach().add_(100);
  CHECK(same());
  base.diagonal().alias().add_(0.5);
  expect.diagonal().alias().add_(0.5);
  CHECK(same());
  base.as_strided({2, 2}, {6, 1}, 7).mul_(-1);
  expect.as_strided({2, 2}, {6, 1}, 7).mul_(-1);
  CHECK(same());
  base.reshape({2, 12}).unbind(0)[1].add_(1000);
  expect.reshape({2, 12}).unbind(0)[1].add_(1000);
  CHECK(same());

  // Views that only have per-backend kernels (unfold, view_as_real).
  base.view({24}).unfold(0, 4, 4).select(1, 3).add_(0.25);
  expect.view({24}).unfold(0, 4, 4).select(1, 3).add_(0.25);
  CHECK(same());
  CHECK(bitwise_equal(base.repeat({2, 1}), expect.repeat({2, 1})));
  const auto complex = torch::zeros({3}, torch::TensorOptions().dtype(torch::kComplexFloat).device(d));
  torch::view_as_real(complex).select(1, 1).fill_(2);
  CHECK(bitwise_equal(torch::imag(complex).contiguous(), torch::full({3}, 2.0f)));

  const auto e = base[0].unsqueeze(0).expand({5, 6});
  CHECK(e.stride(0) == 0);
  CHECK(e.is_alias_of(base));
  const auto s = base.slice(0, 1);
  CHECK(s.storage_offset() == 6);
  CHECK(s.is_alias_of(base));

  // set_ onto another tensor's storage, with an offset and strides.
  auto alias = torch::empty({0}, torch::TensorOptions().device(d));
  alias.set_(base.storage(), 2, {3, 2}, {6, 1});
  alias.fill_(-7);
  expect.as_strided({3, 2}, {6, 1}, 2).fill_(-7);
  CHECK(same());
  CHECK(alias.is_alias_of(base));

  // resize_ keeps the old bytes and stays on the device.
  auto grow = torch::arange(4, torch::TensorOptions().dtype(torch::kFloat).device(d));
  grow.resize_({8});
  CHECK(grow.device() == d);
  CHECK(bitwise_equal(grow.slice(0, 0, 4), torch::arange(4, torch::kFloat)));
  CHECK(grow[2].item<float>() == 2.0f);
}

TEST_CASE("sim: operators that only read their arguments read strided, offset and listed sim tensors in place") {
  const auto dev = sim_device(0);
  torch::manual_seed(3);
  const auto a = torch::randn({6, 8});
  const auto b = torch::randn({8, 5});
  const auto idx = torch::tensor({4, 0, 2}, torch::kLong);
  const auto sa = a.to(dev);
  const auto sb = b.to(dev);
  // Each pair: the operator on CPU tensors, and on the same values on sim.
  const auto cases =
      std::vector<std::pair<std::string, std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>>>{
          {"mm of a transposed view", [](const auto& x, const auto& y) { return torch::mm(y.t(), x.t()); }},
          {"offset slice", [](const auto& x, const auto&) { return torch::gelu(x.slice(0, 2, 5).slice(1, 3)); }},
          {"strided sum", [](const auto& x, const auto&) { return x.slice(1, 0, 8, 3).sum(0); }},
          {"cat of a list", [](const auto& x, const auto& y) { return torch::cat({x.t(), y, y.slice(1, 1, 4)}, 1); }},
          {"stack of views", [](const auto& x, const auto&) { return torch::stack({x[1], x[3], x.select(0, 5)}); }},
          {"softmax of a negative view", [](const auto& x, const auto&) { return torch::softmax(x._neg_view(), -1); }},
          {"where", [](const auto& x, const auto&) { return torch::where(x > 0, x, x * 0.5); }},
  };
  for (const auto& [name, op] : cases) {
    INFO(name);
    const auto expected = op(a, b);
    const auto actual = op(sa, sb);
    CHECK(actual.device() == dev);
    CHECK(bitwise_equal(expected, actual.cpu()));
  }
  // A number made a tensor (a wrapped number) keeps promoting as a number:
  // int64 with it gives the default float dtype, not its float64.
  const auto ints = torch::arange(6, torch::kLong);
  const auto number = [](const c10::Device& d) {
    auto w = torch::scalar_tensor(0.5, torch::kDouble).to(d);
    w.unsafeGetTensorImpl()->set_wrapped_number(true);
    return w;
  };
  const auto mixed = torch::where(ints > 2, ints, number(torch::kCPU));
  const auto sim_mixed = torch::where(ints.to(dev) > 2, ints.to(dev), number(dev));
  CHECK(mixed.dtype() == torch::kFloat);
  CHECK(sim_mixed.dtype() == mixed.dtype());
  CHECK(bitwise_equal(mixed, sim_mixed.cpu()));
  // Optional-tensor lists (index with a None) and a CPU index next to sim.
  const torch::List<std::optional<torch::Tensor>> indices({std::nullopt, idx});
  CHECK(bitwise_equal(at::index(a, indices), at::index(sa, indices).cpu()));
  CHECK(bitwise_equal(at::index(a, {idx}), at::index(sa, {idx.to(dev)}).cpu()));
  // An argument whose only reference is the operator's stack (the math-bit
  // fallbacks put the resolved copy of a negative or conjugate view there)
  // stays alive until the kernel has read it, also when freed memory is
  // poisoned at once.
  {
    const sim::ScopedKnobs knobs;
    sim::set_poison_freed(true);
    const auto c = torch::view_as_complex(a.reshape({-1, 4, 2}));
    const auto sc = torch::view_as_complex(sa.reshape({-1, 4, 2}));
    for (int k = 0; k < 4; ++k) {
      CHECK(bitwise_equal(torch::softmax(a._neg_view(), -1), torch::softmax(sa._neg_view(), -1).cpu()));
      CHECK(bitwise_equal(torch::view_as_real(c * c.conj()), torch::view_as_real(sc * sc.conj()).cpu()));
    }
  }
  // The inputs are untouched and results are new tensors, not aliases.
  CHECK(bitwise_equal(a, sa.cpu()));
  CHECK(bitwise_equal(b, sb.cpu()));
  const auto r = torch::relu(sa);
  CHECK(r.data_ptr() != sa.data_ptr());
  r.fill_(0);
  CHECK(bitwise_equal(a, sa.cpu()));
}
