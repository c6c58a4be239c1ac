// Text in and out of a c10d store, whose values are bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::detail {

inline std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }
inline std::string text_of(const std::vector<uint8_t>& bytes) {
  return {bytes.begin(), bytes.end()};
}

}  // namespace ddp::detail
