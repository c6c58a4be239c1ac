#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace fashion_mnist {
namespace {

bool on_terminal() {
  const char* ddprun = std::getenv("DDPRUN_STDOUT_TTY");
  if (ddprun != nullptr) return std::strcmp(ddprun, "1") == 0;
  return ::isatty(STDOUT_FILENO) != 0;
}

// 75 s -> "1m15s", 9 s -> "9s".
std::string duration(double seconds) {
  const int whole = static_cast<int>(seconds + 0.5);
  char text[32];
  if (whole >= 60) {
    std::snprintf(text, sizeof(text), "%dm%02ds", whole / 60, whole % 60);
  } else {
    std::snprintf(text, sizeof(text), "%ds", whole);
  }
  return text;
}

}  // namespace

Progress::Progress(int epoch, int epochs, int steps, int global_batch, bool enabled)
    : epoch_(epoch),
      epochs_(epochs),
      steps_(steps),
      global_batch_(global_batch),
      enabled_(enabled),
      terminal_(enabled && on_terminal()),
      start_(Clock::now()) {}

void Progress::update(int step, double loss) {
  if (!enabled_) return;
  const auto now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double rate = seconds > 0 ? step * global_batch_ / seconds : 0;
  // The first steps are slower (allocations, DDP's first buckets): an ETA from them would jump.
  const std::string eta =
      step >= std::min(steps_, 5) ? "ETA " + duration(seconds / step * (steps_ - step)) : "ETA ...";
  if (terminal_) {
    // A redraw per step would be hundreds a second on a fast model; 10 a second is smooth.
    if (step != steps_ && step > 1 && now - last_drawn_ < std::chrono::milliseconds(100)) return;
    last_drawn_ = now;
    constexpr int kWidth = 20;
    const int filled = kWidth * step / steps_;
    const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    std::printf("\repoch %d/%d [%s] %d/%d loss %.4f %.0f img/s %s", epoch_, epochs_, bar.c_str(),
                step, steps_, loss, rate,
                step == steps_ ? ("in " + duration(seconds)).c_str() : eta.c_str());
    std::fflush(stdout);
  } else if (step == 1 || step == steps_ || step - last_printed_ >= std::max(1, steps_ / 10)) {
    std::printf("epoch %d/%d step %d/%d loss %.4f %.0f img/s %s\n", epoch_, epochs_, step, steps_,
                loss, rate, step == steps_ ? ("in " + duration(seconds)).c_str() : eta.c_str());
    last_printed_ = step;
  }
}

void Progress::finish() {
  if (enabled_ && terminal_) std::printf("\n");
}

}  // namespace fashion_mnist
