// libtorch must multiply with an optimized BLAS: the reference BLAS is about 7x slower here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <string>

// Debian's libtorch multiplies with whatever libblas.so.3 the alternatives system names, and the
// reference BLAS is about 7x slower on our models than OpenBLAS (setup.sh chooses OpenBLAS).
// pip's and pytorch.org's libtorch carry MKL inside and never load libblas.so.3.
TEST(Blas, LibtorchMultipliesWithAnOptimizedBlas) {
  auto a = torch::randn({64, 64});
  auto product = torch::mm(a, a);  // makes sure the BLAS is loaded and used
  ASSERT_EQ(product.size(0), 64);
  if (at::hasMKL()) {
    EXPECT_NE(at::show_config().find("BLAS_INFO=mkl"), std::string::npos) << at::show_config();
    return;
  }
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool openblas = false;
  while (std::getline(maps, line)) openblas |= line.find("openblas") != std::string::npos;
  EXPECT_TRUE(openblas) << "libblas.so.3 is not OpenBLAS: install libopenblas0-pthread and run "
                           "update-alternatives --set libblas.so.3-x86_64-linux-gnu "
                           "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3";
}
