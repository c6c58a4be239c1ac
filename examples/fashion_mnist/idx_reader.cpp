#include "idx_reader.h"

#include <zlib.h>

#include <fstream>
#include <stdexcept>
#include <vector>

namespace fashion_mnist {
namespace {

// Fashion-MNIST's training-set pixel statistics (of x / 255).
constexpr float kMean = 0.2860f;
constexpr float kStd = 0.3530f;

std::vector<uint8_t> read_gzip_or_plain(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");  // reads plain files too
  if (file == nullptr || !std::ifstream(path).good()) {
    if (file) gzclose(file);
    throw std::runtime_error("cannot open " + path +
                             ": install Debian's dataset-fashion-mnist package (apt-get install "
                             "dataset-fashion-mnist) or pass --data DIR with the four "
                             "*-ubyte(.gz) files");
  }
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  int n;
  while ((n = gzread(file, chunk, sizeof(chunk))) > 0) bytes.insert(bytes.end(), chunk, chunk + n);
  gzclose(file);
  if (n < 0) throw std::runtime_error(path + ": corrupt gzip data");
  return bytes;
}

uint32_t big_endian(const std::vector<uint8_t>& bytes, size_t offset) {
  return (uint32_t{bytes[offset]} << 24) | (uint32_t{bytes[offset + 1]} << 16) |
         (uint32_t{bytes[offset + 2]} << 8) | uint32_t{bytes[offset + 3]};
}

std::string find(const std::string& folder, const std::string& name) {
  std::string path = folder + "/" + name;
  if (std::ifstream(path + ".gz").good()) return path + ".gz";
  if (std::ifstream(path).good()) return path;
  return path + ".gz";  // reported as missing by the reader
}

}  // namespace

Split load_split(const std::string& folder, const std::string& split) {
  const std::string images_path = find(folder, split + "-images-idx3-ubyte");
  const std::string labels_path = find(folder, split + "-labels-idx1-ubyte");
  auto images = read_gzip_or_plain(images_path);
  auto labels = read_gzip_or_plain(labels_path);
  if (images.size() < 16 || big_endian(images, 0) != 0x803) {
    throw std::runtime_error(images_path + ": not an IDX image file (magic 0x00000803)");
  }
  if (labels.size() < 8 || big_endian(labels, 0) != 0x801) {
    throw std::runtime_error(labels_path + ": not an IDX label file (magic 0x00000801)");
  }
  const int64_t count = big_endian(images, 4);
  const int64_t rows = big_endian(images, 8);
  const int64_t cols = big_endian(images, 12);
  if (static_cast<int64_t>(big_endian(labels, 4)) != count ||
      images.size() != static_cast<size_t>(16 + count * rows * cols) ||
      labels.size() != static_cast<size_t>(8 + count)) {
    throw std::runtime_error(images_path + " and " + labels_path + " are truncated or disagree");
  }
  Split result;
  result.images = torch::from_blob(images.data() + 16, {count, 1, rows, cols}, torch::kUInt8)
                      .to(torch::kFloat)
                      .div_(255)
                      .sub_(kMean)
                      .div_(kStd);
  result.labels = torch::from_blob(labels.data() + 8, {count}, torch::kUInt8).to(torch::kLong);
  return result;
}

}  // namespace fashion_mnist
