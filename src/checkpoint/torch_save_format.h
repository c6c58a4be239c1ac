// torch_save_bytes: an IValue in torch.save's zip format, loadable by Python's safe unpickler.
//
// libtorch's own torch::pickle_save tags every typed dict and list with a call of
// torch.jit._pickle.restore_type_tag, which torch.load(weights_only=True) refuses: PyTorch 2.6's
// default, so a plain torch.load of such a file fails there. This writes the same archive
// (data.pkl, data/<n> per storage, a version record) without the tags: dicts, lists, tuples,
// strings, numbers and tensors only, which every PyTorch since 1.13 loads with weights_only,
// and which torch::pickle_load reads back (as untyped containers). Thread-safe (no state).
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

namespace ddp::detail {

std::vector<char> torch_save_bytes(const c10::IValue& value);

}  // namespace ddp::detail
