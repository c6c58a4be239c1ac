// Waiting for a work that completes on a device (process_group/work_state.h): NCCL's wait() only
// makes the caller's stream wait, so a failure found later by its watchdog must still be raised
// by our wait, and a work that never completes must end at the group timeout. A stand-in work
// behaves as NCCL's does, so this runs without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "ddp/errors.h"
#include "process_group/work_state.h"

namespace {

// wait() returns at once; completion (and the failure, if any) shows after `polls` looks.
class DeviceLikeWork : public c10d::Work {
 public:
  DeviceLikeWork(int polls, std::exception_ptr failure)
      : polls_left_(polls), failure_(std::move(failure)) {}
  bool wait(std::chrono::milliseconds) override { return true; }
  bool isCompleted() override { return polls_left_.fetch_sub(1) <= 1; }
  std::exception_ptr exception() const override { return polls_left_ <= 0 ? failure_ : nullptr; }

 private:
  std::atomic<int> polls_left_;
  std::exception_ptr failure_;
};

std::exception_ptr nccl_failure() {
  return std::make_exception_ptr(std::runtime_error("NCCL error: remote process exited"));
}

TEST(WorkCompletion, AFailureFoundAfterWaitReturnedIsRaisedByTheWaitNamingTheCall) {
  ddp::detail::WorkState state(c10::make_intrusive<DeviceLikeWork>(5, nccl_failure()),
                               "all_reduce");
  state.poll_limit = std::chrono::seconds(10);
  try {
    state.wait();
    FAIL() << "the failed work's wait returned";
  } catch (const ddp::DistributedError& error) {
    EXPECT_NE(std::string(error.what()).find("all_reduce"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("remote process exited"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(state.wait(), ddp::DistributedError);  // every time, not only the first
  EXPECT_FALSE(state.is_success());                   // and asking never throws
}

TEST(WorkCompletion, AWorkThatNeverCompletesOnItsDeviceEndsAtThePollLimitAsATimeout) {
  ddp::detail::WorkState state(c10::make_intrusive<DeviceLikeWork>(1 << 30, nullptr), "broadcast");
  state.poll_limit = std::chrono::milliseconds(50);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(state.wait(), ddp::TimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(WorkCompletion, ASuccessfulWorkIsSuccessOnceCompleted) {
  ddp::detail::WorkState state(c10::make_intrusive<DeviceLikeWork>(3, nullptr), "all_gather");
  state.poll_limit = std::chrono::seconds(10);
  state.wait();
  EXPECT_TRUE(state.is_success());
}

}  // namespace
