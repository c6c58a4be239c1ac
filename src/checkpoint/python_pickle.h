// A reader for the files of Python's torch.save (zip format, pickle protocol 2) that libtorch's own
// torch::jit::pickle_load cannot read: libtorch 1.13's unpickler turns collections.OrderedDict (the
// type of every nn.Module.state_dict()) into None. This one interprets the pickle opcodes that
// torch.save writes for state dicts and checkpoints: dicts, OrderedDicts, lists, tuples, strings,
// numbers, booleans, None and tensors (dense, CPU).
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace ddp::detail {

/// The object saved in the zip-format file at `path`. Throws std::runtime_error (or c10::Error)
/// on anything it does not understand.
c10::IValue load_python_pickle(const std::string& path);

}  // namespace ddp::detail
