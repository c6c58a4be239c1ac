// Writing JSON text by hand, for the files the library writes (flight records, timelines): no
// dependency, and no allocation beyond the output string's.
#pragma once

#include <string>

namespace ddp::detail {

/// Appends `text` as a JSON string literal, quotes included (control characters escaped).
void append_json_string(std::string& out, const char* text);
inline void append_json_string(std::string& out, const std::string& text) {
  append_json_string(out, text.c_str());
}

}  // namespace ddp::detail
