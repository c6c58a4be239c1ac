#include "checkpoint/optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <tuple>
#include <vector>

#include "common/error_context.h"
#include "compat/libtorch_compat.h"

namespace ddp::detail {
namespace {

using torch::optim::Adam;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamW;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::Optimizer;
using torch::optim::SGD;
using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

c10::impl::GenericDict string_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// A copy on the CPU, whatever the device: a checkpoint loads anywhere (see checkpoint.h).
at::Tensor saved_tensor(const at::Tensor& tensor) {
  return tensor.device().is_cpu() ? tensor.detach().clone() : tensor.detach().cpu();
}

// Reading: every malformed entry is one error that names the file and the entry.
struct Reader {
  const std::string& path;
  const std::string& operation;

  [[noreturn]] void bad(const std::string& what) const {
    fail<InvalidArgumentError>(operation, "the optimizer state in " + path + " " + what + ".");
  }

  c10::impl::GenericDict dict(const c10::IValue& value, const std::string& name) const {
    if (!value.isGenericDict()) bad("has no dict \"" + name + "\" (" + value.tagKind() + ")");
    return value.toGenericDict();
  }

  c10::IValue entry(const c10::impl::GenericDict& dict, const std::string& key,
                    const std::string& where) const {
    auto it = dict.find(key);
    if (it == dict.end()) {
      bad("lacks \"" + key + "\" in " + where +
          " (was it saved from another kind of optimizer than the one given?)");
    }
    return it->value();
  }

  double number(const c10::impl::GenericDict& dict, const std::string& key,
                const std::string& where) const {
    auto value = entry(dict, key, where);
    if (value.isDouble()) return value.toDouble();
    if (value.isInt()) return static_cast<double>(value.toInt());
    if (value.isBool()) return value.toBool() ? 1.0 : 0.0;
    if (value.isTensor() && value.toTensor().numel() == 1) return value.toTensor().item<double>();
    bad("has a non-numeric \"" + key + "\" in " + where + " (" + value.tagKind() + ")");
  }

  bool flag(const c10::impl::GenericDict& dict, const std::string& key,
            const std::string& where) const {
    auto value = entry(dict, key, where);
    if (value.isBool()) return value.toBool();
    if (value.isInt()) return value.toInt() != 0;
    bad("has a non-boolean \"" + key + "\" in " + where + " (" + value.tagKind() + ")");
  }

  // An optional tensor entry, copied into a new tensor shaped, typed and placed like `param`.
  at::Tensor like_param(const c10::impl::GenericDict& dict, const std::string& key,
                        const at::Tensor& param, const std::string& where) const {
    auto it = dict.find(key);
    if (it == dict.end() || it->value().isNone()) return {};
    if (!it->value().isTensor()) bad("has a non-tensor \"" + key + "\" in " + where);
    const auto& saved = it->value().toTensor();
    if (saved.sizes() != param.sizes()) {
      bad("has \"" + key + "\" of shape " + c10::str(saved.sizes()) + " in " + where +
          " for a parameter of shape " + c10::str(param.sizes()));
    }
    return at::empty_like(param, at::MemoryFormat::Preserve).copy_(saved);
  }
};

// Adam and AdamW keep the same options and state under the same names (PyTorch's too).
template <typename Options>
void save_adam_options(c10::impl::GenericDict& saved_group, const Options& options) {
  saved_group.insert("lr", options.lr());
  saved_group.insert("betas", c10::ivalue::Tuple::create(std::get<0>(options.betas()),
                                                         std::get<1>(options.betas())));
  saved_group.insert("eps", options.eps());
  saved_group.insert("weight_decay", options.weight_decay());
  saved_group.insert("amsgrad", options.amsgrad());
  saved_group.insert("maximize", false);
}

template <typename State>
void save_adam_state(c10::impl::GenericDict& saved_state, const State& s) {
  // PyTorch keeps the step as a float singleton tensor (torch.optim.Adam requires one).
  saved_state.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
  saved_state.insert("exp_avg", saved_tensor(s.exp_avg()));
  saved_state.insert("exp_avg_sq", saved_tensor(s.exp_avg_sq()));
  if (s.max_exp_avg_sq().defined()) {
    saved_state.insert("max_exp_avg_sq", saved_tensor(s.max_exp_avg_sq()));
  }
}

template <typename Options>
std::unique_ptr<Options> read_adam_options(const Reader& read, const c10::impl::GenericDict& group,
                                           const std::string& where) {
  auto options = std::make_unique<Options>(read.number(group, "lr", where));
  auto betas = read.entry(group, "betas", where);
  std::vector<double> b;
  if (betas.isTuple()) {
    for (const auto& e : betas.toTupleRef().elements()) b.push_back(e.toScalar().toDouble());
  } else if (betas.isList()) {
    for (const auto& e : betas.toList()) b.push_back(c10::IValue(e).toScalar().toDouble());
  }
  if (b.size() != 2) read.bad("has \"betas\" that are not a pair in " + where);
  options->betas(std::make_tuple(b[0], b[1]))
      .eps(read.number(group, "eps", where))
      .weight_decay(read.number(group, "weight_decay", where))
      .amsgrad(read.flag(group, "amsgrad", where));
  return options;
}

template <typename State>
std::unique_ptr<State> read_adam_state(const Reader& read,
                                       const c10::impl::GenericDict& saved_state,
                                       const at::Tensor& param, const std::string& param_where) {
  auto s = std::make_unique<State>();
  s->step(static_cast<int64_t>(read.number(saved_state, "step", param_where)));
  s->exp_avg(read.like_param(saved_state, "exp_avg", param, param_where));
  s->exp_avg_sq(read.like_param(saved_state, "exp_avg_sq", param, param_where));
  s->max_exp_avg_sq(read.like_param(saved_state, "max_exp_avg_sq", param, param_where));
  if (!s->exp_avg().defined() || !s->exp_avg_sq().defined()) {
    read.bad("lacks \"exp_avg\" or \"exp_avg_sq\" in " + param_where);
  }
  return s;
}

}  // namespace

c10::IValue optimizer_state_dict(const Optimizer& optimizer, const std::string& operation) {
  bool is_sgd = dynamic_cast<const SGD*>(&optimizer) != nullptr;
  bool is_adamw = dynamic_cast<const AdamW*>(&optimizer) != nullptr;
  bool is_adam = dynamic_cast<const Adam*>(&optimizer) != nullptr;
  if (!is_sgd && !is_adam && !is_adamw) {
    fail<InvalidArgumentError>(
        operation,
        "saves the state of torch::optim::SGD, Adam and AdamW; this optimizer is none of them. "
        "Save its state yourself (torch::save) or pass no optimizer.");
  }
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    auto saved_group = string_dict();
    if (is_sgd) {
      const auto& options = static_cast<const SGDOptions&>(group.options());
      saved_group.insert("lr", options.lr());
      saved_group.insert("momentum", options.momentum());
      saved_group.insert("dampening", options.dampening());
      saved_group.insert("weight_decay", options.weight_decay());
      saved_group.insert("nesterov", options.nesterov());
      saved_group.insert("maximize", false);
    } else if (is_adamw) {
      save_adam_options(saved_group, static_cast<const AdamWOptions&>(group.options()));
    } else {
      save_adam_options(saved_group, static_cast<const AdamOptions&>(group.options()));
    }
    // An untyped list: an int list would be pickled through torch.jit's build_intlist, which
    // torch.load(weights_only=True) refuses.
    c10::impl::GenericList indices(c10::AnyType::get());
    for (const auto& param : group.params()) {
      if (const auto* param_state = compat::optimizer_state_of(optimizer, param)) {
        auto saved_state = string_dict();
        if (is_sgd) {
          const auto& s = static_cast<const SGDParamState&>(*param_state);
          if (s.momentum_buffer().defined()) {
            saved_state.insert("momentum_buffer", saved_tensor(s.momentum_buffer()));
          }
        } else if (is_adamw) {
          save_adam_state(saved_state, static_cast<const AdamWParamState&>(*param_state));
        } else {
          save_adam_state(saved_state, static_cast<const AdamParamState&>(*param_state));
        }
        state.insert(index, saved_state);
      }
      indices.push_back(c10::IValue(index++));
    }
    saved_group.insert("params", indices);
    groups.push_back(saved_group);
  }
  auto result = string_dict();
  result.insert("state", state);
  result.insert("param_groups", groups);
  return result;
}

void load_optimizer_state_dict(Optimizer& optimizer, const c10::IValue& saved,
                               const std::string& path, const std::string& operation) {
  bool is_sgd = dynamic_cast<SGD*>(&optimizer) != nullptr;
  bool is_adamw = dynamic_cast<AdamW*>(&optimizer) != nullptr;
  bool is_adam = dynamic_cast<Adam*>(&optimizer) != nullptr;
  if (!is_sgd && !is_adam && !is_adamw) {
    fail<InvalidArgumentError>(
        operation,
        "loads the state of torch::optim::SGD, Adam and AdamW; this optimizer is none of them.");
  }
  Reader read{path, operation};
  auto top = read.dict(saved, "optimizer");
  auto state = read.dict(read.entry(top, "state", "\"optimizer\""), "optimizer.state");
  auto groups_value = read.entry(top, "param_groups", "\"optimizer\"");
  if (!groups_value.isList()) read.bad("has a non-list \"param_groups\"");
  auto groups = groups_value.toList();
  auto& param_groups = optimizer.param_groups();
  if (groups.size() != param_groups.size()) {
    read.bad("has " + std::to_string(groups.size()) + " parameter group(s); the optimizer has " +
             std::to_string(param_groups.size()));
  }
  // Parse and check everything first, then apply, so that a bad file changes nothing.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> new_options;
  std::vector<std::pair<at::Tensor, std::unique_ptr<torch::optim::OptimizerParamState>>> new_state;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::string where = "param_groups[" + std::to_string(g) + "]";
    auto group = read.dict(groups.get(g), where);
    auto params_value = read.entry(group, "params", where);
    if (!params_value.isList()) read.bad("has a non-list \"params\" in " + where);
    auto indices = params_value.toList();
    const auto& params = param_groups[g].params();
    if (indices.size() != params.size()) {
      read.bad("has " + std::to_string(indices.size()) + " parameter(s) in " + where +
               "; the optimizer's group has " + std::to_string(params.size()));
    }
    if (is_sgd) {
      auto options = std::make_unique<SGDOptions>(read.number(group, "lr", where));
      options->momentum(read.number(group, "momentum", where))
          .dampening(read.number(group, "dampening", where))
          .weight_decay(read.number(group, "weight_decay", where))
          .nesterov(read.flag(group, "nesterov", where));
      new_options.push_back(std::move(options));
    } else if (is_adamw) {
      new_options.push_back(read_adam_options<AdamWOptions>(read, group, where));
    } else {
      new_options.push_back(read_adam_options<AdamOptions>(read, group, where));
    }
    for (size_t j = 0; j < indices.size(); ++j) {
      c10::IValue index = indices.get(j);
      auto it = state.find(index);
      if (it == state.end()) continue;  // no state yet (never stepped)
      std::string param_where = "state[" + std::to_string(index.toInt()) + "]";
      auto saved_state = read.dict(it->value(), param_where);
      const auto& param = params[j];
      if (is_sgd) {
        auto s = std::make_unique<SGDParamState>();
        s->momentum_buffer(read.like_param(saved_state, "momentum_buffer", param, param_where));
        new_state.emplace_back(param, std::move(s));
      } else if (is_adamw) {
        new_state.emplace_back(
            param, read_adam_state<AdamWParamState>(read, saved_state, param, param_where));
      } else {
        new_state.emplace_back(
            param, read_adam_state<AdamParamState>(read, saved_state, param, param_where));
      }
    }
  }
  for (size_t g = 0; g < param_groups.size(); ++g) {
    param_groups[g].set_options(std::move(new_options[g]));
  }
  optimizer.state().clear();
  for (auto& [param, value] : new_state)
    compat::set_optimizer_state(optimizer, param, std::move(value));
}

}  // namespace ddp::detail
