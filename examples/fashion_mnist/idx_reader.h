// Reads the IDX files of the Fashion-MNIST (and MNIST) distribution, gzip-compressed or not, as
// Debian's dataset-fashion-mnist package ships them in /usr/share/datasets/fashion-mnist.
#pragma once

#include <torch/torch.h>

#include <string>

namespace fashion_mnist {

struct Split {
  torch::Tensor images;  // [N, 1, 28, 28] float, normalised with the training set's mean and std
  torch::Tensor labels;  // [N] int64
};

/// `split` is "train" or "t10k". Throws std::runtime_error naming the path (and the Debian package
/// that provides it) when a file is missing or malformed.
Split load_split(const std::string& folder, const std::string& split);

}  // namespace fashion_mnist
