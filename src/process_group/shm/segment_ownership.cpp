#include "process_group/shm/segment_ownership.h"

#include <cstdio>
#include <fstream>

namespace ddp::detail {
namespace {

std::string hex8(uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", value);
  return text;
}

std::string clean_job(const std::string& job) {
  std::string clean;
  for (char c : job.substr(0, 64)) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '-';
    clean += keep ? c : '_';
  }
  return clean.empty() ? "job" : clean;
}

}  // namespace

std::string shm_segment_prefix(const std::string& job, int attempt) {
  return "ddp-cpp." + clean_job(job) + "." + std::to_string(attempt) + ".";
}

std::string shm_segment_name(const std::string& job, int attempt, const std::string& group,
                             int host_index, uint32_t token, int creator_pid) {
  // Appended, not "/" + prefix: GCC 12 at -O3 in C++20 warns wrongly (-Wrestrict, its bug 105329)
  // about operator+(const char*, std::string&&).
  std::string name = "/";
  name += shm_segment_prefix(job, attempt);
  return name + "g" + group + ".h" + std::to_string(host_index) + ".r" + hex8(token) + ".p" +
         std::to_string(creator_pid);
}

int shm_segment_creator(const std::string& name) {
  const size_t dot = name.rfind(".p");
  // At most 9 digits: more than any pid_max, and no int overflow.
  if (dot == std::string::npos || dot + 2 == name.size() || name.size() - dot - 2 > 9) return -1;
  int pid = 0;
  for (size_t i = dot + 2; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid > 0 ? pid : -1;
}

bool process_is_alive(int pid) {
  if (pid <= 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  // "pid (comm) S ...": the state follows the last ')'; comm may itself contain ')'.
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X' && state != 'x';
}

}  // namespace ddp::detail
