// The example's chart writer: axes that fit the data with round ticks, labels that tell the ticks
// apart, and the history's round trip through the rows kept in checkpoints.
#include "../../examples/fashion_mnist/svg_chart.h"

#include <gtest/gtest.h>

#include "../../examples/fashion_mnist/training_history.h"

namespace fashion_mnist {
namespace {

TEST(SvgChart, TicksAreRoundAndCoverTheDataTightly) {
  // An accuracy that lives between 0.893 and 0.912 gets an axis of its own, not 0..1.
  auto ticks = nice_ticks(0.893, 0.912, 5);
  ASSERT_GE(ticks.size(), 4u);
  EXPECT_NEAR(ticks.front(), 0.89, 1e-12);
  EXPECT_NEAR(ticks.back(), 0.915, 1e-12);
  EXPECT_NEAR(ticks[1] - ticks[0], 0.005, 1e-12);
  // Loss from 0.21 to 2.3: steps of 0.5 from 0.
  ticks = nice_ticks(0.21, 2.3, 5);
  EXPECT_DOUBLE_EQ(ticks.front(), 0);
  EXPECT_DOUBLE_EQ(ticks.back(), 2.5);
  EXPECT_DOUBLE_EQ(ticks[1], 0.5);
  // Epochs 0..2.
  ticks = nice_ticks(0, 2, 6);
  EXPECT_EQ(ticks, (std::vector<double>{0, 0.5, 1, 1.5, 2}));
}

TEST(SvgChart, OneValueStillGetsARangeAroundIt) {
  auto ticks = nice_ticks(0.9, 0.9, 5);
  ASSERT_GE(ticks.size(), 2u);
  EXPECT_LT(ticks.front(), 0.9);
  EXPECT_GT(ticks.back(), 0.9);
  ticks = nice_ticks(0, 0, 5);
  EXPECT_LT(ticks.front(), 0);
  EXPECT_GT(ticks.back(), 0);
}

TEST(SvgChart, LabelsCarryTheDecimalsTheStepNeeds) {
  EXPECT_EQ(tick_label(0.895, 0.005), "0.895");
  EXPECT_EQ(tick_label(0.9, 0.005), "0.900");
  EXPECT_EQ(tick_label(1.5, 0.5), "1.5");
  EXPECT_EQ(tick_label(2, 1), "2");
  EXPECT_EQ(tick_label(400, 200), "400");
}

TEST(SvgChart, AChartDrawsEveryTickLabelAndItsSeries) {
  Chart chart{"test accuracy", "epoch", "accuracy", {}, 0, 2};
  chart.series.push_back({"test", "#2ca02c", {{1, 0.893}, {2, 0.912}}, true, true});
  const std::string svg = svg_page({chart});
  for (const char* label : {">0.890<", ">0.915<", ">0.0<", ">2.0<", ">test accuracy<", ">epoch<"}) {
    EXPECT_NE(svg.find(label), std::string::npos) << label << " missing from\n" << svg;
  }
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(TrainingHistory, RowsRoundTrip) {
  TrainingHistory history;
  history.epochs = {{1, 0.5, 0.88, 1000, 30}, {2, 0.3, 0.9, 1100, 28}};
  history.losses = {{10, 0.1, 2.0}, {20, 0.2, 1.1}};
  auto back = TrainingHistory::from_rows(history.epoch_rows(), history.loss_rows());
  ASSERT_EQ(back.epochs.size(), 2u);
  EXPECT_EQ(back.epochs[1].epoch, 2);
  EXPECT_DOUBLE_EQ(back.epochs[1].test_accuracy, 0.9);
  ASSERT_EQ(back.losses.size(), 2u);
  EXPECT_EQ(back.losses[1].step, 20);
  EXPECT_DOUBLE_EQ(back.losses[1].loss, 1.1);
  EXPECT_THROW(TrainingHistory::from_rows({1, 2, 3}, {}), std::runtime_error);
}

}  // namespace
}  // namespace fashion_mnist
