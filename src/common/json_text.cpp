#include "common/json_text.h"

#include <cstdio>

namespace ddp::detail {

void append_json_string(std::string& out, const char* text) {
  out += '"';
  for (const char* c = text; *c; ++c) {
    switch (*c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(*c) < 0x20) {
          char code[8];
          std::snprintf(code, sizeof code, "\\u%04x", static_cast<unsigned char>(*c));
          out += code;
        } else {
          out += *c;
        }
    }
  }
  out += '"';
}

}  // namespace ddp::detail
