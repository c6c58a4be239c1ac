#include "progress.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace fashion_mnist {

Progress::Progress(int epoch, int epochs, int steps, int global_batch, bool enabled)
    : epoch_(epoch),
      epochs_(epochs),
      steps_(steps),
      global_batch_(global_batch),
      enabled_(enabled),
      terminal_(::isatty(STDOUT_FILENO) != 0),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(int step, double loss) {
  if (!enabled_) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = seconds > 0 ? step * global_batch_ / seconds : 0;
  const double eta = step > 0 ? seconds / step * (steps_ - step) : 0;
  if (terminal_) {
    constexpr int kWidth = 30;
    const int filled = kWidth * step / steps_;
    std::string bar(filled, '#');
    bar += std::string(kWidth - filled, '.');
    std::printf("\repoch %d/%d [%s] %d/%d loss %.4f %.0f samples/s ETA %.0fs ", epoch_, epochs_,
                bar.c_str(), step, steps_, loss, rate, eta);
    std::fflush(stdout);
  } else if (step == steps_ || step - last_printed_ >= std::max(1, steps_ / 10)) {
    std::printf("epoch %d/%d step %d/%d loss %.4f %.0f samples/s ETA %.0fs\n", epoch_, epochs_,
                step, steps_, loss, rate, eta);
    last_printed_ = step;
  }
}

void Progress::finish() {
  if (enabled_ && terminal_) std::printf("\n");
}

}  // namespace fashion_mnist
