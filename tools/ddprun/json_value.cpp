#include "json_value.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace ddprun {
namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) {}

  JsonValue document() {
    JsonValue value = parse_value();
    skip_space();
    if (at_ < text_.size()) fail("text after the value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(what + " at offset " + std::to_string(at_));
  }

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t')) {
      ++at_;
    }
  }

  char peek() {
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end");
    return text_[at_];
  }

  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }

  bool take_word(const char* word) {
    const std::string w(word);
    if (text_.compare(at_, w.size(), w) != 0) return false;
    at_ += w.size();
    return true;
  }

  JsonValue parse_value() {
    const char c = peek();
    JsonValue value;
    if (c == '{') {
      value.kind = JsonValue::Kind::kObject;
      ++at_;
      if (peek() == '}') {
        ++at_;
        return value;
      }
      for (;;) {
        if (peek() != '"') fail("expected a member name");
        std::string name = parse_string();
        expect(':');
        value.members[name] = parse_value();
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect('}');
        return value;
      }
    }
    if (c == '[') {
      value.kind = JsonValue::Kind::kArray;
      ++at_;
      if (peek() == ']') {
        ++at_;
        return value;
      }
      for (;;) {
        value.items.push_back(parse_value());
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect(']');
        return value;
      }
    }
    if (c == '"') {
      value.kind = JsonValue::Kind::kString;
      value.text = parse_string();
      return value;
    }
    if (take_word("true") || take_word("false")) {
      value.kind = JsonValue::Kind::kBool;
      value.boolean = text_[at_ - 1] == 'e' && text_[at_ - 2] == 'u';
      return value;
    }
    if (take_word("null")) return value;
    const char* start = text_.c_str() + at_;
    char* end = nullptr;
    value.number = std::strtod(start, &end);
    if (end == start) fail("expected a value");
    value.integer = std::strtoll(start, nullptr, 10);
    value.kind = JsonValue::Kind::kNumber;
    at_ += static_cast<size_t>(end - start);
    return value;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("unfinished escape");
      c = text_[at_++];
      switch (c) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (at_ + 4 > text_.size()) fail("unfinished \\u escape");
          const long code = std::strtol(text_.substr(at_, 4).c_str(), nullptr, 16);
          at_ += 4;
          out += code < 0x80 ? static_cast<char>(code) : '?';
          break;
        }
        default:
          out += c;  // \" \\ \/
      }
    }
    if (at_ >= text_.size()) fail("unfinished string");
    ++at_;
    return out;
  }

  const std::string& text_;
  size_t at_ = 0;
};

}  // namespace

const JsonValue& JsonValue::operator[](const std::string& name) const {
  static const JsonValue null_value;
  auto found = members.find(name);
  return found == members.end() ? null_value : found->second;
}

std::optional<JsonValue> ParseJson(const std::string& text, std::string* error) {
  try {
    return Parser(text).document();
  } catch (const std::exception& failure) {
    if (error) *error = failure.what();
    return std::nullopt;
  }
}

std::string JsonQuote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", static_cast<unsigned char>(c));
      out += code;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace ddprun
