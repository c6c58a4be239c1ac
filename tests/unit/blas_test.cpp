// libtorch must run on OpenBLAS: Debian's reference BLAS is about 7x slower on our models.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <string>

TEST(Blas, LibtorchLoadsOpenBlas) {
  auto a = torch::randn({64, 64});
  auto product = torch::mm(a, a);  // makes sure the BLAS is loaded and used
  ASSERT_EQ(product.size(0), 64);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool openblas = false;
  while (std::getline(maps, line)) openblas |= line.find("openblas") != std::string::npos;
  EXPECT_TRUE(openblas) << "libblas.so.3 is not OpenBLAS: install libopenblas0-pthread and run "
                           "update-alternatives --set libblas.so.3-x86_64-linux-gnu "
                           "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3";
}
