#include "reference_models.h"

#include <map>
#include <stdexcept>
#include <vector>

namespace ddp_bench {
namespace {

namespace F = torch::nn::functional;

class MLP : public BenchModel {
 public:
  MLP() {
    net_ = register_module("net",
                           torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 1024),
                                                 torch::nn::ReLU(), torch::nn::Linear(1024, 1024),
                                                 torch::nn::ReLU(), torch::nn::Linear(1024, 10)));
  }
  torch::Tensor forward(torch::Tensor x) override { return net_->forward(x); }

 private:
  torch::nn::Sequential net_{nullptr};
};

class CNN : public BenchModel {
 public:
  CNN()
      : conv1_(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)))),
        conv2_(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)))),
        fc1_(register_module("fc1", torch::nn::Linear(9216, 128))),
        fc2_(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(torch::Tensor x) override {
    x = torch::relu(conv1_->forward(x));
    x = F::max_pool2d(torch::relu(conv2_->forward(x)), F::MaxPool2dFuncOptions(2));
    return fc2_->forward(torch::relu(fc1_->forward(torch::flatten(x, 1))));
  }

 private:
  torch::nn::Conv2d conv1_, conv2_;
  torch::nn::Linear fc1_, fc2_;
};

torch::nn::Conv2d conv(int64_t cin, int64_t cout, int64_t kernel, int64_t stride, int64_t padding) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(cin, cout, kernel).stride(stride).padding(padding).bias(false));
}

class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t cin, int64_t cout, int64_t stride)
      : c1_(register_module("c1", conv(cin, cout, 3, stride, 1))),
        b1_(register_module("b1", torch::nn::BatchNorm2d(cout))),
        c2_(register_module("c2", conv(cout, cout, 3, 1, 1))),
        b2_(register_module("b2", torch::nn::BatchNorm2d(cout))) {
    if (stride != 1 || cin != cout) {
      short_ = register_module("short", torch::nn::Sequential(conv(cin, cout, 1, stride, 0),
                                                              torch::nn::BatchNorm2d(cout)));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    auto o = torch::relu(b1_->forward(c1_->forward(x)));
    o = b2_->forward(c2_->forward(o));
    return torch::relu(o + (short_.is_empty() ? x : short_->forward(x)));
  }

 private:
  torch::nn::Conv2d c1_;
  torch::nn::BatchNorm2d b1_;
  torch::nn::Conv2d c2_;
  torch::nn::BatchNorm2d b2_;
  torch::nn::Sequential short_{nullptr};
};
TORCH_MODULE(BasicBlock);

class ResNet20 : public BenchModel {
 public:
  ResNet20()
      : stem_(register_module("stem", conv(3, 16, 3, 1, 1))),
        bn_(register_module("bn", torch::nn::BatchNorm2d(16))) {
    int64_t cin = 16;
    for (auto [cout, stride] : {std::pair<int64_t, int64_t>{16, 1}, {32, 2}, {64, 2}}) {
      for (int i = 0; i < 3; ++i) {
        layers_->push_back(BasicBlock(cin, cout, i == 0 ? stride : 1));
        cin = cout;
      }
    }
    register_module("layers", layers_);
    fc_ = register_module("fc", torch::nn::Linear(64, 10));
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = layers_->forward(torch::relu(bn_->forward(stem_->forward(x))));
    return fc_->forward(
        torch::flatten(F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions(1)), 1));
  }

 private:
  torch::nn::Conv2d stem_;
  torch::nn::BatchNorm2d bn_;
  torch::nn::Sequential layers_;
  torch::nn::Linear fc_{nullptr};
};

// torch::nn::TransformerEncoderLayer of libtorch 1.13 has neither norm_first nor batch_first, so
// this is PyTorch's TransformerEncoderLayer(norm_first=True, batch_first=True, dropout=0,
// activation=relu) written out, with the same submodules in the same order (self_attn, linear1,
// linear2, norm1, norm2) and the same math:
//   x = x + self_attn(norm1(x));  x = x + linear2(relu(linear1(norm2(x))))
// The attention is torch::nn::MultiheadAttention (sequence-first), called between two transposes,
// as PyTorch's batch_first MultiheadAttention does. Dropout with p = 0 is the identity: left out.
class PreNormEncoderLayerImpl : public torch::nn::Module {
 public:
  PreNormEncoderLayerImpl(int64_t d, int64_t heads, int64_t ff)
      : self_attn_(register_module(
            "self_attn",
            torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(d, heads)))),
        linear1_(register_module("linear1", torch::nn::Linear(d, ff))),
        linear2_(register_module("linear2", torch::nn::Linear(ff, d))),
        norm1_(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        norm2_(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))) {}

  // x: (batch, seq, d); mask: (seq, seq), added to the attention scores.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    auto q = norm1_->forward(x).transpose(0, 1);
    auto attn = std::get<0>(self_attn_->forward(q, q, q, /*key_padding_mask=*/{},
                                                /*need_weights=*/false, mask));
    auto h = x + attn.transpose(0, 1);
    return h + linear2_->forward(torch::relu(linear1_->forward(norm2_->forward(h))));
  }

 private:
  torch::nn::MultiheadAttention self_attn_;
  torch::nn::Linear linear1_, linear2_;
  torch::nn::LayerNorm norm1_, norm2_;
};
TORCH_MODULE(PreNormEncoderLayer);

class TinyGPT : public BenchModel {
 public:
  TinyGPT(int64_t vocab = 2048, int64_t d = 256, int64_t layers = 4, int64_t heads = 4,
          int64_t ff = 1024, int64_t seq = 64)
      : tok_(register_module("tok", torch::nn::Embedding(vocab, d))),
        pos_(register_module("pos", torch::nn::Embedding(seq, d))) {
    for (int64_t i = 0; i < layers; ++i) blocks_->push_back(PreNormEncoderLayer(d, heads, ff));
    register_module("blocks", blocks_);
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    head_ = register_module("head", torch::nn::Linear(d, vocab));
    mask_ = register_buffer(
        "mask", torch::triu(torch::full({seq, seq}, -std::numeric_limits<float>::infinity()), 1));
  }

  torch::Tensor forward(torch::Tensor idx) override {
    const int64_t t = idx.size(1);
    auto mask = mask_.slice(0, 0, t).slice(1, 0, t);
    if (!units_.empty()) return sharded_forward(idx, mask);
    auto h = tok_->forward(idx) + pos_->forward(torch::arange(t));
    for (const auto& block : *blocks_) h = block->as<PreNormEncoderLayer>()->forward(h, mask);
    return head_->forward(norm_->forward(h));
  }

  // FSDP's usual wrapping: each block a unit, and the embeddings, the final norm and the head
  // units of their own; the names stay those of the unsharded model.
  void fully_shard(const ddp::FullyShardOptions& options) override {
    auto unit = [&](const std::string& name, torch::nn::AnyModule module) {
      ddp::FullyShardedUnit wrapped(std::move(module), options);
      replace_module(name, wrapped.ptr());
      units_.insert_or_assign(name, wrapped);
    };
    unit("tok", torch::nn::AnyModule(tok_));
    unit("pos", torch::nn::AnyModule(pos_));
    torch::nn::ModuleList sharded_blocks;
    for (size_t i = 0; i < blocks_->size(); ++i) {
      ddp::FullyShardedUnit wrapped(torch::nn::AnyModule(blocks_->ptr<PreNormEncoderLayerImpl>(i)),
                                    options);
      sharded_blocks->push_back(wrapped);
      block_units_.push_back(wrapped);
    }
    replace_module("blocks", sharded_blocks.ptr());
    unit("norm", torch::nn::AnyModule(norm_));
    unit("head", torch::nn::AnyModule(head_));
  }

 private:
  torch::nn::Embedding tok_, pos_;
  torch::nn::ModuleList blocks_;
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::Tensor mask_;
  std::map<std::string, ddp::FullyShardedUnit> units_;  // once sharded
  std::vector<ddp::FullyShardedUnit> block_units_;

  torch::Tensor sharded_forward(const torch::Tensor& idx, const torch::Tensor& mask) {
    auto h = units_.at("tok")->forward(idx) + units_.at("pos")->forward(torch::arange(idx.size(1)));
    for (auto& block : block_units_) h = block->call(h, mask);
    return units_.at("head")->forward(units_.at("norm")->forward(h));
  }
};

}  // namespace

void BenchModel::fully_shard(const ddp::FullyShardOptions&) {
  throw std::invalid_argument("this benchmark model has no fully_shard units");
}

BuiltModel build(const std::string& name) {
  if (name == "mlp") return {std::make_shared<MLP>(), 64};
  if (name == "cnn") return {std::make_shared<CNN>(), 64};
  if (name == "resnet") return {std::make_shared<ResNet20>(), 32};
  if (name == "transformer") return {std::make_shared<TinyGPT>(), 8};
  throw std::invalid_argument("unknown model '" + name + "': use mlp, cnn, resnet or transformer");
}

std::pair<torch::Tensor, torch::Tensor> make_batch(const std::string& name, int64_t batch,
                                                   at::Generator& generator) {
  auto labels = [&] { return torch::randint(0, 10, {batch}, generator, torch::kLong); };
  if (name == "mlp" || name == "cnn") {
    auto x = torch::randn({batch, 1, 28, 28}, generator);
    return {x, labels()};
  }
  if (name == "resnet") {
    auto x = torch::randn({batch, 3, 32, 32}, generator);
    return {x, labels()};
  }
  auto idx = torch::randint(0, 2048, {batch, 65}, generator, torch::kLong);
  return {idx.slice(1, 0, 64), idx.slice(1, 1, 65)};
}

std::shared_ptr<BenchModel> zero_transformer() {
  return std::make_shared<TinyGPT>(8192, 768, 12, 12, 3072, 64);
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace ddp_bench
