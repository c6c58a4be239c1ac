// JsonValue: just enough JSON to read the ranks' flight records (rank<R>.json, written by the
// library's trace/trace_dump.cpp) without a dependency: objects, arrays, strings (the escapes that
// writer uses, and \uXXXX below 0x80), integers and other numbers, true, false, null.
// ParseJson is a pure function; values are plain data.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  int64_t integer = 0;  // exact for the integers the records hold (microseconds, sequences)
  std::string text;
  std::vector<JsonValue> items;
  std::map<std::string, JsonValue> members;

  /// The member `name`, or a null value when absent (or when this is not an object).
  const JsonValue& operator[](const std::string& name) const;
  int64_t as_int(int64_t otherwise = 0) const {
    return kind == Kind::kNumber ? integer : otherwise;
  }
  const std::string& as_string() const { return text; }
};

/// Parses `text`; nullopt with `error` set (what and where) when it is not JSON.
std::optional<JsonValue> ParseJson(const std::string& text, std::string* error);

/// `text` as a JSON string literal, quotes included.
std::string JsonQuote(const std::string& text);

}  // namespace ddprun
