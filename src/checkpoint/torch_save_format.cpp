#include "checkpoint/torch_save_format.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <string>

namespace ddp::detail {

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) { pickled.insert(pickled.end(), bytes, bytes + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();

  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + size);
    return size;
  });
  // The storages first, then the pickle that refers to them by index, as torch.save lays them out.
  size_t index = 0;
  for (const auto& tensor : pickler.tensorData()) {
    auto data = torch::jit::getWriteableTensorData(tensor);
    writer.writeRecord("data/" + std::to_string(index++), data.data(), data.sizeInBytes());
  }
  writer.writeRecord("data.pkl", pickled.data(), pickled.size());
  writer.writeEndOfFile();
  return archive;
}

}  // namespace ddp::detail
