#include "process_group/gpu_inventory.h"

#include <map>

#include "common/error_context.h"

namespace ddp::detail {

std::string gpu_index_of(const std::string& identity) {
  const auto at = identity.rfind('@');
  return at == std::string::npos ? "" : identity.substr(at + 1);
}

std::string why_members_lack_own_gpu(const std::vector<std::string>& gpu_by_member) {
  std::vector<int> without;
  std::map<std::string, int> first_user;  // by UUID
  for (size_t member = 0; member < gpu_by_member.size(); ++member) {
    const std::string& gpu = gpu_by_member[member];
    if (gpu.empty()) {
      without.push_back(static_cast<int>(member));
      continue;
    }
    auto [seen, fresh] = first_user.emplace(gpu.substr(0, gpu.rfind('@')), member);
    if (!fresh) {
      return "group ranks " + std::to_string(seen->second) + " and " + std::to_string(member) +
             " both use the same GPU (" + gpu_index_of(gpu_by_member[seen->second]) + " and " +
             gpu_index_of(gpu) + " in their processes)";
    }
  }
  if (!without.empty()) {
    return "group rank" + std::string(without.size() > 1 ? "s " : " ") + join_ints(without) +
           (without.size() > 1 ? " see" : " sees") + " no GPU";
  }
  return "";
}

}  // namespace ddp::detail
