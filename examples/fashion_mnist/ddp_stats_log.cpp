#include "ddp_stats_log.h"

#include <cstdio>
#include <stdexcept>

namespace fashion_mnist {

std::string describe_epoch_stats(int epoch, const ddp::DDPStats& stats) {
  const auto& mean = stats.average;
  char line[512];
  std::snprintf(line, sizeof(line),
                "ddp stats, epoch %d (rank %d, mean of %lld steps): forward %.2f ms, backward "
                "compute %.2f ms, exposed communication %.2f ms (of %.2f ms communicating), "
                "%.3f MB reduced per step in %lld buckets, %lld rebuild%s",
                epoch, stats.rank, static_cast<long long>(stats.steps), mean.forward_ms,
                mean.backward_compute_ms, mean.exposed_communication_ms, mean.communication_ms,
                static_cast<double>(mean.bytes_reduced) / 1e6,
                static_cast<long long>(stats.bucket_count), static_cast<long long>(stats.rebuilds),
                stats.rebuilds == 1 ? "" : "s");
  return line;
}

StatsCsv::StatsCsv(const std::string& path, bool append) {
  bool empty = true;
  if (append) {
    std::ifstream existing(path, std::ios::binary | std::ios::ate);
    empty = !existing.good() || existing.tellg() == 0;
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw std::runtime_error("--stats-csv: cannot write " + path);
  if (empty) {
    out_ << "epoch,step,forward_ms,backward_compute_ms,exposed_communication_ms,"
            "communication_ms,bytes_reduced,buckets_reduced,unused_parameters\n";
  }
}

void StatsCsv::add(int epoch, int64_t step, const ddp::DDPStepStats& stats) {
  char row[256];
  std::snprintf(row, sizeof(row), "%d,%lld,%.4f,%.4f,%.4f,%.4f,%lld,%lld,%lld\n", epoch,
                static_cast<long long>(step), stats.forward_ms, stats.backward_compute_ms,
                stats.exposed_communication_ms, stats.communication_ms,
                static_cast<long long>(stats.bytes_reduced),
                static_cast<long long>(stats.buckets_reduced),
                static_cast<long long>(stats.unused_parameters));
  out_ << row;
}

}  // namespace fashion_mnist
