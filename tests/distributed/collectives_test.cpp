// Every collective and every ReduceOp, across world sizes and init methods.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/ddp.h"
#include "support/multiprocess.h"

using ddp::testing::run_ranks_ok;

namespace {

void init_env(int /*rank*/) {
  ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(30)));
}

// The result of a collective must be bit-identical on every rank: gather its bytes and compare.
void expect_identical_on_every_rank(const torch::Tensor& result) {
  auto bytes = result.contiguous().view(torch::kUInt8).reshape(-1);
  auto all = ddp::all_gather(bytes);
  for (size_t r = 1; r < all.size(); ++r) {
    EXPECT_TRUE(torch::equal(all[0], all[r])) << "rank " << r << " differs from rank 0";
  }
}

}  // namespace

TEST(AllReduce, SumOfRankValuesAtWorldSizesOneToFour) {
  for (int world = 1; world <= 4; ++world) {
    run_ranks_ok(world, [world](int rank) {
      init_env(rank);
      auto t = torch::full({5, 3}, rank + 1, torch::kFloat);
      ddp::all_reduce(t);
      EXPECT_TRUE(torch::allclose(t, torch::full({5, 3}, world * (world + 1) / 2.0)));
      ddp::destroy_process_group();
    });
  }
}

TEST(AllReduce, EveryOpOnIntegersMatchesTheDefinition) {
  const int world = 3;
  run_ranks_ok(world, [](int rank) {
    init_env(rank);
    // Values 1..3 (rank + 1) and bit patterns 1, 2, 4 (1 << rank).
    struct Case {
      ddp::ReduceOp op;
      int64_t expected;
      bool bits;
    };
    const Case cases[] = {
        {ddp::ReduceOp::SUM, 6, false},     {ddp::ReduceOp::AVG, 2, false},
        {ddp::ReduceOp::PRODUCT, 6, false}, {ddp::ReduceOp::MIN, 1, false},
        {ddp::ReduceOp::MAX, 3, false},     {ddp::ReduceOp::BAND, 0, true},
        {ddp::ReduceOp::BOR, 7, true},      {ddp::ReduceOp::BXOR, 7, true},
    };
    for (const auto& c : cases) {
      auto t = torch::full({4}, c.bits ? (1 << rank) : rank + 1, torch::kInt64);
      ddp::all_reduce(t, c.op);
      EXPECT_EQ(t[0].item<int64_t>(), c.expected) << ddp::to_string(c.op);
    }
    ddp::destroy_process_group();
  });
}

TEST(AllReduce, FloatOpsAndAvgAreBitIdenticalOnEveryRank) {
  run_ranks_ok(3, [](int rank) {
    init_env(rank);
    torch::manual_seed(rank);
    for (auto op : {ddp::ReduceOp::SUM, ddp::ReduceOp::AVG, ddp::ReduceOp::PRODUCT,
                    ddp::ReduceOp::MIN, ddp::ReduceOp::MAX}) {
      auto t = torch::randn({1000});
      auto expected = t.clone();
      auto all = ddp::all_gather(expected);
      auto stacked = torch::stack(all);
      torch::Tensor reference;
      switch (op) {
        case ddp::ReduceOp::SUM:
          reference = stacked.sum(0);
          break;
        case ddp::ReduceOp::AVG:
          reference = stacked.sum(0) / 3;
          break;
        case ddp::ReduceOp::PRODUCT:
          reference = stacked.prod(0);
          break;
        case ddp::ReduceOp::MIN:
          reference = std::get<0>(stacked.min(0));
          break;
        default:
          reference = std::get<0>(stacked.max(0));
          break;
      }
      ddp::all_reduce(t, op);
      EXPECT_TRUE(torch::allclose(t, reference, 1e-5, 1e-6)) << ddp::to_string(op);
      expect_identical_on_every_rank(t);
    }
    ddp::destroy_process_group();
  });
}

TEST(AllReduce, WorksOnEveryDtypeGlooSupports) {
  run_ranks_ok(2, [](int rank) {
    init_env(rank);
    for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kInt8, torch::kUInt8,
                       torch::kInt32, torch::kInt64}) {
      auto t = torch::full({7}, rank + 1, torch::TensorOptions().dtype(dtype));
      ddp::all_reduce(t);
      EXPECT_EQ(t.to(torch::kDouble)[3].item<double>(), 3.0) << c10::toString(dtype);
    }
    ddp::destroy_process_group();
  });
}

TEST(AllReduce, NonContiguousTensorIsReducedInPlace) {
  run_ranks_ok(2, [](int rank) {
    init_env(rank);
    auto base = torch::arange(12, torch::kFloat).reshape({3, 4}) * (rank + 1);
    auto transposed = base.t();  // a strided view
    ASSERT_FALSE(transposed.is_contiguous());
    ddp::all_reduce(transposed);
    EXPECT_TRUE(torch::equal(base, torch::arange(12, torch::kFloat).reshape({3, 4}) * 3));
    ddp::destroy_process_group();
  });
}

TEST(AllReduce, ComplexSumAddsRealAndImaginaryParts) {
  run_ranks_ok(2, [](int rank) {
    init_env(rank);
    auto t = torch::complex(torch::full({3}, rank + 1.0), torch::full({3}, 10.0 * (rank + 1)));
    ddp::all_reduce(t);
    EXPECT_TRUE(torch::allclose(torch::real(t), torch::full({3}, 3.0)));
    EXPECT_TRUE(torch::allclose(torch::imag(t), torch::full({3}, 30.0)));
    EXPECT_THROW(ddp::all_reduce(t, ddp::ReduceOp::MAX), ddp::DistributedError);
    ddp::destroy_process_group();
  });
}

TEST(AllReduce, AsyncWorkCompletesAndWaitIsIdempotent) {
  run_ranks_ok(2, [](int rank) {
    init_env(rank);
    auto a = torch::full({1 << 16}, rank + 1.0);
    auto b = torch::full({8}, rank + 1.0);
    ddp::Work wa = ddp::all_reduce_async(a, ddp::ReduceOp::AVG);
    ddp::Work wb = ddp::all_reduce_async(b);
    wa.wait();
    wb.wait();
    wb.wait();
    EXPECT_TRUE(wa.is_completed());
    EXPECT_TRUE(wb.is_success());
    EXPECT_EQ(a[0].item<float>(), 1.5f);
    EXPECT_EQ(b[0].item<float>(), 3.0f);
    ddp::destroy_process_group();
  });
}

TEST(AllReduce, BitwiseOpOnFloatTensorIsAClearError) {
  run_ranks_ok(1, [](int rank) {
    init_env(rank);
    auto t = torch::ones({2});
    try {
      ddp::all_reduce(t, ddp::ReduceOp::BXOR);
      ADD_FAILURE() << "expected an error";
    } catch (const ddp::DistributedError& e) {
      EXPECT_NE(std::string(e.what()).find("BXOR needs an integer tensor"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("[rank 0] ddp::all_reduce"), std::string::npos);
    }
    ddp::destroy_process_group();
  });
}

TEST(Broadcast, FromEverySourceRank) {
  run_ranks_ok(3, [](int rank) {
    init_env(rank);
    for (int src = 0; src < 3; ++src) {
      auto t = torch::full({2, 2}, rank * 10.0);
      ddp::broadcast(t, src);
      EXPECT_EQ(t[1][1].item<float>(), src * 10.0f);
      auto strided = torch::full({4, 4}, rank * 1.0).t().narrow(0, 1, 2);
      ddp::broadcast_async(strided, src).wait();
      EXPECT_EQ(strided.sum().item<float>(), src * 8.0f);
    }
    ddp::destroy_process_group();
  });
}

TEST(Reduce, OnlyTheDestinationHoldsTheResult) {
  run_ranks_ok(3, [](int rank) {
    init_env(rank);
    auto t = torch::full({3}, rank + 1.0);
    ddp::reduce(t, /*dst=*/2, ddp::ReduceOp::SUM);
    if (rank == 2) {
      EXPECT_EQ(t[0].item<float>(), 6.0f);
    }
    auto m = torch::full({3}, rank + 1.0);
    ddp::reduce(m, /*dst=*/1, ddp::ReduceOp::AVG);
    if (rank == 1) {
      EXPECT_EQ(m[0].item<float>(), 2.0f);
    }
    ddp::destroy_process_group();
  });
}

TEST(AllGather, ReturnsEveryRanksTensorInRankOrder) {
  run_ranks_ok(4, [](int rank) {
    init_env(rank);
    auto parts = ddp::all_gather(torch::full({2, 3}, rank * 1.0).t());
    ASSERT_EQ(parts.size(), 4u);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(parts[r].sizes(), torch::IntArrayRef({3, 2}));
      EXPECT_EQ(parts[r][0][0].item<float>(), r * 1.0f);
    }
    ddp::destroy_process_group();
  });
}

TEST(Gather, DestinationGetsAllTensorsOthersGetNone) {
  run_ranks_ok(3, [](int rank) {
    init_env(rank);
    auto parts = ddp::gather(torch::full({2}, rank * 1.0, torch::kInt32), /*dst=*/1);
    if (rank == 1) {
      ASSERT_EQ(parts.size(), 3u);
      for (int r = 0; r < 3; ++r) EXPECT_EQ(parts[r][1].item<int>(), r);
    } else {
      EXPECT_TRUE(parts.empty());
    }
    ddp::destroy_process_group();
  });
}

TEST(Scatter, EachRankReceivesItsSliceFromTheSource) {
  run_ranks_ok(3, [](int rank) {
    init_env(rank);
    std::vector<torch::Tensor> inputs;
    if (rank == 0) {
      for (int r = 0; r < 3; ++r) inputs.push_back(torch::full({2, 2}, 100.0 + r));
    }
    auto out = torch::zeros({2, 2});
    ddp::scatter(out, inputs, /*src=*/0);
    EXPECT_EQ(out[1][0].item<float>(), 100.0f + rank);
    if (rank == 0) {
      std::vector<torch::Tensor> wrong{torch::zeros({2, 2}), torch::zeros({3})};
      EXPECT_THROW(ddp::scatter(out, wrong, 0), ddp::DistributedError);
    }
    ddp::destroy_process_group();
  });
}

TEST(ReduceScatter, EachRankGetsTheReductionOfItsSlot) {
  run_ranks_ok(3, [](int rank) {
    init_env(rank);
    std::vector<torch::Tensor> inputs;
    for (int slot = 0; slot < 3; ++slot) inputs.push_back(torch::full({2}, 10.0 * slot + rank));
    auto out = torch::zeros({2});
    ddp::reduce_scatter(out, inputs);
    EXPECT_EQ(out[0].item<float>(), 3 * 10.0f * rank + 3.0f);  // sum over ranks of 10*slot + r
    ddp::reduce_scatter(out, inputs, ddp::ReduceOp::MAX);
    EXPECT_EQ(out[1].item<float>(), 10.0f * rank + 2.0f);
    ddp::reduce_scatter(out, inputs, ddp::ReduceOp::AVG);
    EXPECT_EQ(out[1].item<float>(), 10.0f * rank + 1.0f);
    ddp::destroy_process_group();
  });
}

TEST(SendRecv, RingPassesEachRanksTensorToTheNext) {
  run_ranks_ok(3, [](int rank) {
    init_env(rank);
    auto out = torch::full({4}, rank * 1.0);
    auto in = torch::zeros({4});
    int next = (rank + 1) % 3;
    int prev = (rank + 2) % 3;
    if (rank % 2 == 0) {
      ddp::send(out, next);
      ddp::recv(in, prev);
    } else {
      ddp::recv(in, prev);
      ddp::send(out, next);
    }
    EXPECT_EQ(in[0].item<float>(), prev * 1.0f);
    ddp::destroy_process_group();
  });
}

TEST(Barrier, AndMonitoredBarrierPassWhenEveryRankArrives) {
  run_ranks_ok(3, [](int rank) {
    init_env(rank);
    ddp::barrier();
    ddp::monitored_barrier(std::chrono::seconds(10));
    ddp::monitored_barrier(std::chrono::seconds(10));
    ddp::destroy_process_group();
  });
}
