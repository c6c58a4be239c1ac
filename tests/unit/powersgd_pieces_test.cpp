// The pieces of comm_hooks::powerSGD that need no group: numpy's random seeds, orthogonalization,
// the options it refuses and the buckets it cannot compress.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <sstream>

#include "ddp/ddp.h"
#include "reducer/numpy_random_state.h"
#include "reducer/orthogonalize.h"
#include "support/multiprocess.h"

namespace {

constexpr uint64_t kSeedRange = 1'000'000'000;  // PyTorch's rng.randint(1_000_000_000)

std::string run_python(const std::string& code) {
  const std::string command = ddp::testing::torch_python() + " -c '" + code + "'";
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return output;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe)) output += buffer;
  ::pclose(pipe);
  return output;
}

// Computed with numpy 1.24 (np.random.RandomState(seed).randint(1_000_000_000)).
TEST(NumpyRandomState, RandintMatchesNumpysKnownValues) {
  const std::vector<std::pair<uint32_t, int64_t>> known = {{0, 209652396},
                                                           {1, 717354021},
                                                           {7, 327741615},
                                                           {123456789, 141016760},
                                                           {4294967295u, 419326371}};
  for (auto [seed, value] : known) {
    EXPECT_EQ(ddp::detail::NumpyRandomState(seed).randint(kSeedRange), value) << "seed " << seed;
  }
  ddp::detail::NumpyRandomState successive(0);
  for (int64_t value : {209652396, 398764591, 924231285, 404868288}) {
    EXPECT_EQ(successive.randint(kSeedRange), value);
  }
}

TEST(NumpyRandomState, RandintMatchesThisMachinesNumpy) {
  if (ddp::testing::torch_python().empty()) GTEST_SKIP() << "no Python with numpy and torch";
  const std::vector<uint32_t> seeds = {0, 1, 2, 42, 1000, 99999, 2147483648u, 4294967295u};
  std::ostringstream code;
  code << "import numpy as np\nfor s in (";
  for (uint32_t seed : seeds) code << seed << ",";
  code << "):\n r = np.random.RandomState(s)\n print(*[r.randint(1_000_000_000) for _ in "
          "range(5)])\nr = np.random.RandomState(3)\nprint(*[r.randint(100) for _ in range(20)])";
  std::istringstream numpy(run_python(code.str()));
  for (uint32_t seed : seeds) {
    ddp::detail::NumpyRandomState ours(seed);
    for (int i = 0; i < 5; ++i) {
      int64_t expected = -1;
      ASSERT_TRUE(numpy >> expected) << "numpy printed too little";
      EXPECT_EQ(ours.randint(kSeedRange), expected) << "seed " << seed << ", draw " << i;
    }
  }
  ddp::detail::NumpyRandomState small_range(3);  // a range whose mask rejects often (127 > 99)
  for (int i = 0; i < 20; ++i) {
    int64_t expected = -1;
    ASSERT_TRUE(numpy >> expected);
    EXPECT_EQ(small_range.randint(100), expected) << "draw " << i;
  }
}

TEST(Orthogonalize, GramSchmidtOfAKnownMatrixGivesItsOrthonormalColumns) {
  // Columns (3, 4, 0) and (1, 1, 1): the first normalizes to (0.6, 0.8, 0); the second, minus
  // its projection 1.4 * (0.6, 0.8, 0), is (0.16, -0.12, 1), of norm sqrt(1.04).
  auto matrix = torch::tensor({{3.0, 1.0}, {4.0, 1.0}, {0.0, 1.0}}, torch::kDouble).unsqueeze(0);
  ddp::detail::orthogonalize(matrix, 0.0);
  const double norm = std::sqrt(1.04);
  auto expected =
      torch::tensor({{0.6, 0.16 / norm}, {0.8, -0.12 / norm}, {0.0, 1.0 / norm}}, torch::kDouble)
          .unsqueeze(0);
  EXPECT_TRUE(torch::allclose(matrix, expected, 1e-12, 1e-12)) << matrix;
}

TEST(Orthogonalize, RanksAboveTwoUseQRAndGiveOrthonormalColumnsSpanningTheSame) {
  auto matrices = torch::randn({2, 7, 4}, torch::kDouble);
  auto original = matrices.clone();
  ddp::detail::orthogonalize(matrices, 0.0);
  auto identity = torch::eye(4, torch::kDouble).expand({2, 4, 4});
  EXPECT_TRUE(torch::allclose(matrices.transpose(1, 2).bmm(matrices), identity, 1e-12, 1e-12));
  // Same span: projecting the original columns on the new ones gives them back.
  auto projected = matrices.bmm(matrices.transpose(1, 2).bmm(original));
  EXPECT_TRUE(torch::allclose(projected, original, 1e-10, 1e-10));
  EXPECT_TRUE(torch::equal(matrices, std::get<0>(torch::linalg_qr(original))));
}

TEST(Orthogonalize, AZeroColumnIsNaNWithoutEpsilonAndZeroWithIt) {
  auto matrix = torch::zeros({1, 3, 1});
  ddp::detail::orthogonalize(matrix, 0.0);
  EXPECT_TRUE(torch::isnan(matrix).all().item<bool>());  // as PyTorch's hook
  auto guarded = torch::zeros({1, 3, 1});
  ddp::detail::orthogonalize(guarded, 1e-8);
  EXPECT_TRUE(torch::equal(guarded, torch::zeros({1, 3, 1})));
}

TEST(PowerSGDOptions, DefaultsArePyTorchs) {
  ddp::PowerSGDOptions options;
  EXPECT_EQ(options.matrix_approximation_rank(), 1);
  EXPECT_EQ(options.start_powerSGD_iter(), 1000);
  EXPECT_EQ(options.min_compression_rate(), 2.0);
  EXPECT_TRUE(options.use_error_feedback());
  EXPECT_TRUE(options.warm_start());
  EXPECT_EQ(options.orthogonalization_epsilon(), 0.0);
  EXPECT_EQ(options.random_seed(), 0);
}

void expect_refused(const ddp::PowerSGDOptions& options, const std::string& names) {
  try {
    ddp::comm_hooks::powerSGD(options);
    ADD_FAILURE() << "accepted options with a bad " << names;
  } catch (const ddp::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(PowerSGDOptions, OptionsItCannotUseAreRefusedNamingTheOption) {
  expect_refused(ddp::PowerSGDOptions().matrix_approximation_rank(0), "matrix_approximation_rank");
  expect_refused(ddp::PowerSGDOptions().start_powerSGD_iter(1), "start_powerSGD_iter");
  expect_refused(ddp::PowerSGDOptions().start_powerSGD_iter(1).use_error_feedback(false),
                 "start_powerSGD_iter");  // warm start alone needs it too
  expect_refused(ddp::PowerSGDOptions().min_compression_rate(-1), "min_compression_rate");
  expect_refused(ddp::PowerSGDOptions().orthogonalization_epsilon(-1e-8),
                 "orthogonalization_epsilon");
  expect_refused(ddp::PowerSGDOptions().random_seed(-1), "random_seed");
  expect_refused(ddp::PowerSGDOptions().random_seed(1LL << 32), "random_seed");
  // Without error feedback and warm start nothing is kept per bucket: any start is fine.
  EXPECT_NO_THROW(ddp::comm_hooks::powerSGD(
      ddp::PowerSGDOptions().start_powerSGD_iter(0).use_error_feedback(false).warm_start(false)));
}

TEST(PowerSGDHook, ABucketOfIntegersIsRefusedBeforeAnyCollective) {
  auto hook = ddp::comm_hooks::powerSGD();
  ddp::GradBucket bucket(0, 1, torch::zeros({6}, torch::kLong), {torch::zeros({2, 3})});
  try {
    hook(ddp::ProcessGroup(), bucket);  // no group exists: a collective would fail differently
    ADD_FAILURE() << "an int64 bucket was accepted";
  } catch (const ddp::InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("floating-point"), std::string::npos) << e.what();
  }
}

// 1.13 has no float16 matrix product on the CPU: refused by name at the first compressed bucket.
// Where a libtorch has one (2.x), the hook goes on to its first collective, which fails without
// a group, for that reason and not the dtype.
TEST(PowerSGDHook, AFloat16BucketIsRefusedNamingTheDtypeOnlyWhereLibtorchCannotMultiplyIt) {
  bool has_product = true;
  try {
    at::bmm(torch::ones({1, 1, 1}, torch::kHalf), torch::ones({1, 1, 1}, torch::kHalf));
  } catch (const c10::Error&) {
    has_product = false;
  }
  auto hook = ddp::comm_hooks::powerSGD(
      ddp::PowerSGDOptions().start_powerSGD_iter(0).use_error_feedback(false).warm_start(false));
  ddp::GradBucket bucket(0, 1, torch::zeros({6}, torch::kHalf), {torch::zeros({2, 3})});
  try {
    hook(ddp::ProcessGroup(), bucket);
    ADD_FAILURE() << "a float16 bucket went through without a group";
  } catch (const ddp::InvalidArgumentError& e) {
    EXPECT_FALSE(has_product) << "refused although this libtorch multiplies it: " << e.what();
    EXPECT_NE(std::string(e.what()).find("Half matrix product"), std::string::npos) << e.what();
  } catch (const ddp::DistributedError& e) {
    EXPECT_TRUE(has_product) << "not refused by dtype on a libtorch without the product: "
                             << e.what();
    EXPECT_EQ(std::string(e.what()).find("Half matrix product"), std::string::npos) << e.what();
  }
}

TEST(GradBucket, GradientsAreViewsOfTheBufferShapedLikeTheParameters) {
  auto buffer = torch::arange(10, torch::kFloat);
  ddp::GradBucket bucket(0, 1, buffer, {torch::zeros({2, 3}), torch::zeros({4})});
  auto gradients = bucket.gradients();
  ASSERT_EQ(gradients.size(), 2u);
  EXPECT_EQ(gradients[0].sizes(), torch::IntArrayRef({2, 3}));
  EXPECT_EQ(gradients[1][0].item<float>(), 6.0f);
  gradients[1].fill_(-1);
  EXPECT_EQ(buffer[9].item<float>(), -1.0f);
}

}  // namespace
