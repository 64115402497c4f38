// SPDX-License-Identifier: MIT
// The model-zoo parity suite: one small model of each family (ResNet, UNet
// in channels_last, ViT, LSTM and GRU language models, mixture of experts,
// a complex-valued layer, the demo GPT in bf16 and fp16) trained 3 AdamW
// steps on the test device (OFFLOAD_TEST_DEVICE, sim by default: there with
// copy delay and poisoning on), without offloading and under sync::Blocking
// and sync::Streamed with min_offload_bytes 1 and the default: losses,
// gradients and parameters must be bitwise equal.

#include "doctest.hpp"

#include <torch/torch.h>

#include <cmath>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../models/gpt.hpp"
#include "fixture.hpp"
#include "harness.hpp"

namespace {

namespace nn = torch::nn;

// A model of the zoo: its parameters and its loss on fixed data, on the test device.
struct Zoo {
  std::shared_ptr<nn::Module> model;
  harness::Forward loss;
};

// --------------------------------------------------------------- ResNet

struct BasicBlockImpl : nn::Module {
  explicit BasicBlockImpl(int64_t c)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(c))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(c, c, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(c))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(x + bn2(conv2(torch::relu(bn1(conv1(x)))))); }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
};
TORCH_MODULE(BasicBlock);

struct ResNetImpl : nn::Module {
  ResNetImpl()
      : stem(register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1)))),
        bn(register_module("bn", nn::BatchNorm2d(8))),
        pool(register_module("pool", nn::MaxPool2d(nn::MaxPool2dOptions(2)))),
        block1(register_module("block1", BasicBlock(8))),
        block2(register_module("block2", BasicBlock(8))),
        head_pool(register_module("head_pool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)))),
        fc(register_module("fc", nn::Linear(8, 5))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = pool(torch::relu(bn(stem(x))));
    h = block2(block1(h));
    return fc(head_pool(h).flatten(1));
  }
  nn::Conv2d stem;
  nn::BatchNorm2d bn;
  nn::MaxPool2d pool;
  BasicBlock block1, block2;
  nn::AdaptiveAvgPool2d head_pool;
  nn::Linear fc;
};
TORCH_MODULE(ResNet);

// --------------------------------------------------------------- UNet

nn::Sequential conv_gn_silu(int64_t in, int64_t out, int64_t stride = 1) {
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).stride(stride)),
                        nn::GroupNorm(nn::GroupNormOptions(2, out)), nn::SiLU());
}

struct UNetImpl : nn::Module {
  UNetImpl()
      : enc(register_module("enc", conv_gn_silu(3, 8))),
        down(register_module("down", conv_gn_silu(8, 16, 2))),
        mid(register_module("mid", conv_gn_silu(16, 16))),
        up(register_module("up", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(16, 8, 2).stride(2)))),
        dec(register_module("dec", conv_gn_silu(16, 8))),
        upsample(register_module(
            "upsample",
            nn::Upsample(nn::UpsampleOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest)))),
        out(register_module("out", nn::Conv2d(nn::Conv2dOptions(8, 3, 3).padding(1)))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const auto skip = enc->forward(x);
    const auto bottom = mid->forward(down->forward(skip));
    const auto joined = torch::cat({up(bottom), skip}, 1);  // skip concatenation
    return out(upsample(dec->forward(joined)));
  }
  nn::Sequential enc, down, mid;
  nn::ConvTranspose2d up;
  nn::Sequential dec;
  nn::Upsample upsample;
  nn::Conv2d out;
};
TORCH_MODULE(UNet);

// --------------------------------------------------------------- ViT

struct VitImpl : nn::Module {
  static constexpr int64_t width = 16;
  VitImpl()
      : patch(register_module("patch", nn::Conv2d(nn::Conv2dOptions(3, width, 4).stride(4)))),
        encoder(register_module(
            "encoder", nn::TransformerEncoder(nn::TransformerEncoderOptions(
                           nn::TransformerEncoderLayerOptions(width, 2).dim_feedforward(32).dropout(0.1), 2)))),
        norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({width})))),
        head(register_module("head", nn::Linear(width, 5))) {
    cls = register_parameter("cls", torch::randn({1, 1, width}) * 0.02);
    pos = register_parameter("pos", torch::randn({17, 1, width}) * 0.02);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto batch = x.size(0);
    auto tokens = patch(x).flatten(2).permute({2, 0, 1});                   // [16, batch, width]
    tokens = torch::cat({cls.expand({1, batch, width}), tokens}, 0) + pos;  // [17, batch, width]
    const auto encoded = encoder(tokens);
    return head(norm(encoded.narrow(0, 0, 1).squeeze(0)));  // the class token, a narrow view
  }
  nn::Conv2d patch;
  nn::TransformerEncoder encoder;
  nn::LayerNorm norm;
  nn::Linear head;
  torch::Tensor cls, pos;
};
TORCH_MODULE(Vit);

// --------------------------------------------------------------- recurrent LMs

template <class Rnn, class Options>
struct RecurrentLmImpl : nn::Module {
  RecurrentLmImpl()
      : emb(register_module("emb", nn::Embedding(16, 12))),
        rnn(register_module("rnn", Rnn(Options(12, 20).num_layers(2).batch_first(true)))),
        fc(register_module("fc", nn::Linear(20, 16))) {}
  torch::Tensor forward(const torch::Tensor& idx) { return fc(std::get<0>(rnn(emb(idx)))); }
  nn::Embedding emb;
  Rnn rnn;
  nn::Linear fc;
};

// --------------------------------------------------------------- mixture of experts

// Top-1 routing over 4 experts; the router's bias keeps expert 3 (and often
// others) without tokens, so empty index sets and zero-row experts occur.
struct MoeImpl : nn::Module {
  static constexpr int64_t experts = 4;
  MoeImpl() : router(register_module("router", nn::Linear(8, experts))) {
    for (int64_t e = 0; e < experts; ++e) {
      mlps.push_back(register_module("expert" + std::to_string(e),
                                     nn::Sequential(nn::Linear(8, 16), nn::GELU(), nn::Linear(16, 8))));
    }
    torch::NoGradGuard no_grad;
    router->bias[experts - 1].fill_(-100.0);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto gates = torch::softmax(router(x), -1);
    const auto [weight, choice] = gates.max(-1);
    auto out = torch::zeros_like(x);
    for (int64_t e = 0; e < experts; ++e) {
      const auto idx = (choice == e).nonzero().squeeze(1);  // may be empty
      const auto y = mlps[e]->forward(x.index_select(0, idx)) * weight.index_select(0, idx).unsqueeze(1);
      out = out.index_add(0, idx, y);
    }
    return out;
  }
  nn::Linear router;
  std::vector<nn::Sequential> mlps;
};
TORCH_MODULE(Moe);

// --------------------------------------------------------------- complex

// x -> Linear -> complex [batch, 8]; multiplied by a complex weight and by
// its own conjugate; back to real.
struct ComplexLayerImpl : nn::Module {
  ComplexLayerImpl() : fc(register_module("fc", nn::Linear(6, 16))) {
    w = register_parameter("w", torch::randn({8, 2}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto c = torch::view_as_complex(fc(x).reshape({-1, 8, 2}));
    const auto wc = torch::view_as_complex(w);
    const auto y = c * wc.conj() + c * c.conj() * 0.1;
    return torch::view_as_real(y).flatten(1);
  }
  nn::Linear fc;
  torch::Tensor w;
};
TORCH_MODULE(ComplexLayer);

// Builds model `name` from seed 0 on the CPU, moves it (and fixed data) to
// the test device.
Zoo build(const std::string& name) {
  torch::manual_seed(0);
  const auto device = fixture::device0();
  const auto data = [device](std::vector<int64_t> shape) { return torch::randn(shape).to(device); };
  const auto tokens = [device](int64_t vocab, std::vector<int64_t> shape) {
    return torch::randint(vocab, shape, torch::kLong).to(device);
  };
  const auto classify = [](auto m, torch::Tensor x, torch::Tensor y) {
    return harness::Forward([m, x, y]() mutable { return torch::cross_entropy_loss(m->forward(x), y); });
  };
  if (name == "resnet") {
    ResNet m;
    m->to(device);
    return {m.ptr(), classify(m, data({4, 3, 12, 12}), tokens(5, {4}))};
  }
  if (name == "unet channels_last") {
    UNet m;
    m->to(device);
    const auto x = torch::randn({2, 3, 8, 8}).contiguous(at::MemoryFormat::ChannelsLast).to(device);
    const auto target = data({2, 3, 16, 16});
    REQUIRE(x.is_contiguous(at::MemoryFormat::ChannelsLast));
    return {m.ptr(), [m, x, target]() mutable { return torch::mse_loss(m->forward(x), target); }};
  }
  if (name == "vit") {
    Vit m;
    m->to(device);
    return {m.ptr(), classify(m, data({2, 3, 16, 16}), tokens(5, {2}))};
  }
  if (name == "lstm lm" || name == "gru lm") {
    const auto idx = tokens(16, {3, 9});
    const auto x = idx.narrow(1, 0, 8);
    const auto y = idx.narrow(1, 1, 8).reshape({-1});
    const auto lm = [&](auto m) {
      m->to(device);
      return Zoo{m, [m, x, y] { return torch::cross_entropy_loss(m->forward(x).reshape({-1, 16}), y); }};
    };
    if (name == "lstm lm") return lm(std::make_shared<RecurrentLmImpl<nn::LSTM, nn::LSTMOptions>>());
    return lm(std::make_shared<RecurrentLmImpl<nn::GRU, nn::GRUOptions>>());
  }
  if (name == "moe") {
    Moe m;
    m->to(device);
    const auto x = data({16, 8});
    const auto target = data({16, 8});
    return {m.ptr(), [m, x, target]() mutable { return torch::mse_loss(m->forward(x), target); }};
  }
  if (name == "complex") {
    ComplexLayer m;
    m->to(device);
    const auto x = data({4, 6});
    return {m.ptr(), [m, x]() mutable { return m->forward(x).pow(2).mean(); }};
  }
  const auto dtype = name == "gpt bf16" ? torch::kBFloat16 : torch::kHalf;
  REQUIRE((name == "gpt bf16" || name == "gpt fp16"));
  auto m = gpt::Model(gpt::Config{.vocab = 16, .layers = 2, .width = 32, .heads = 4, .seq = 8});
  m->to(device, dtype);
  const auto idx = tokens(16, {2, 9});
  const auto x = idx.narrow(1, 0, 8);
  const auto y = idx.narrow(1, 1, 8);
  return {m.ptr(), [m, x, y]() mutable { return m->loss(x, y); }};
}

harness::RunResult train(const std::string& name, int steps, const harness::Wrap& wrap = {},
                         const harness::OnParams& on_params = {}, const std::function<void(int)>& after_step = {}) {
  auto zoo = build(name);
  return harness::train_params(zoo.model->parameters(), zoo.loss, steps, wrap, on_params, after_step);
}

#define ZOO_TYPES FIXTURE_TYPES(PinnedHost, offload::sync::Blocking), FIXTURE_TYPES(PinnedHost, offload::sync::Streamed)

}  // namespace

FIXTURE_CASE_TEMPLATE("zoo: each model family trains bitwise equal with and without offloading", M, ZOO_TYPES) {
  const fixture::Substrate substrate(/*latency_us=*/100);
  for (const std::string name :
       {"resnet", "unet channels_last", "vit", "lstm lm", "gru lm", "moe", "complex", "gpt bf16", "gpt fp16"}) {
    CAPTURE(name);
    const auto plain = train(name, 3);
    for (std::size_t step = 0; step < plain.losses.size(); ++step) {
      CAPTURE(step);
      REQUIRE(std::isfinite(plain.losses[step]));  // parity of NaNs would prove little
    }
    for (const std::int64_t min_bytes : {std::int64_t{1}, offload::Options{}.min_offload_bytes}) {
      CAPTURE(min_bytes);
      M manager(offload::Options{.min_offload_bytes = min_bytes});
      const auto offloaded =
          train(name, 3, harness::with_scope(manager), [&](const std::vector<at::Tensor>& p) { manager.exclude(p); });
      std::string why;
      CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
      if (min_bytes == 1) {
        CHECK(manager.stats().storages_offloaded > 0);
      }
    }
  }
}

FIXTURE_CASE_TEMPLATE("zoo: mixture of experts with empty experts, 50 steps, memory does not grow", M, ZOO_TYPES) {
  const fixture::Substrate substrate(/*latency_us=*/20);
  const int steps = 50;
  const auto plain = train("moe", steps);
  M manager(offload::Options{.min_offload_bytes = 1});
  const auto device = fixture::device0();
  // Host bytes are sim's count of its host allocator: on sim only.
  const bool count_host = fixture::target() == fixture::Target::sim;
  std::vector<std::int64_t> device_bytes, host_bytes;
  const auto offloaded = train(
      "moe", steps, harness::with_scope(manager), [&](const std::vector<at::Tensor>& p) { manager.exclude(p); },
      [&](int) {
        device_bytes.push_back(harness::settled_device_bytes(device));
        if (count_host) host_bytes.push_back(offload::sim::host_memory().current_bytes);
      });
  std::string why;
  CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
  CHECK(manager.stats().storages_offloaded > 0);
  // AdamW's state exists from the first step on: bytes after step 1 are the
  // level every later step must return to.
  for (int step = 1; step < steps; ++step) {
    CAPTURE(step);
    CHECK(device_bytes[step] <= device_bytes[0]);
    if (count_host) CHECK(host_bytes[step] <= host_bytes[0]);
  }
}

FIXTURE_CASE_TEMPLATE("zoo: with a device-memory target each model family trains bitwise equal", M, ZOO_TYPES) {
  const fixture::Substrate substrate(/*latency_us=*/100);
  const auto device = fixture::device0();
  std::int64_t kept = 0;
  for (const std::string name :
       {"resnet", "unet channels_last", "vit", "lstm lm", "gru lm", "moe", "complex", "gpt bf16", "gpt fp16"}) {
    CAPTURE(name);
    harness::synchronize(device);
    harness::reset_peak(device);
    const auto base = harness::device_bytes(device);
    const auto plain = train(name, 4);
    const auto peak = harness::peak_bytes(device);
    // Half way between what the run holds before training and its peak:
    // some saved tensors must leave, others may stay.
    M manager(offload::Options{.min_offload_bytes = 1, .device_target_bytes = base + (peak - base) * 3 / 4});
    const auto offloaded =
        train(name, 4, harness::with_scope(manager), [&](const std::vector<at::Tensor>& p) { manager.exclude(p); });
    std::string why;
    CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
    const auto stats = manager.stats();
    CHECK(stats.storages_offloaded > 0);
    CHECK(stats.target_steps_planned == 3);
    kept += stats.passed_target;
  }
  CHECK(kept > 0);  // the plans kept something on the device
}
