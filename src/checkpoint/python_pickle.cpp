#include "checkpoint/python_pickle.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

namespace ddp::detail {
namespace {

// A global (a class or function named by GLOBAL) on the stack: a string with this prefix.
constexpr const char* kGlobal = "\x01global:";

[[noreturn]] void bad(const std::string& what) {
  throw std::runtime_error("unsupported or malformed pickle: " + what);
}

bool is_global(const c10::IValue& value, const std::string& name) {
  return value.isString() && value.toStringRef() == kGlobal + name;
}

at::ScalarType storage_dtype(const c10::IValue& type) {
  static const std::map<std::string, at::ScalarType> types = {
      {"FloatStorage", at::kFloat},
      {"DoubleStorage", at::kDouble},
      {"HalfStorage", at::kHalf},
      {"BFloat16Storage", at::kBFloat16},
      {"LongStorage", at::kLong},
      {"IntStorage", at::kInt},
      {"ShortStorage", at::kShort},
      {"CharStorage", at::kChar},
      {"ByteStorage", at::kByte},
      {"BoolStorage", at::kBool},
      {"ComplexFloatStorage", at::kComplexFloat},
      {"ComplexDoubleStorage", at::kComplexDouble}};
  std::string prefix = std::string(kGlobal) + "torch.";
  if (type.isString() && type.toStringRef().rfind(prefix, 0) == 0) {
    auto it = types.find(type.toStringRef().substr(prefix.size()));
    if (it != types.end()) return it->second;
  }
  bad("unknown storage type");
}

std::vector<int64_t> int_tuple(const c10::IValue& value) {
  std::vector<int64_t> out;
  if (!value.isTuple()) bad("tensor size or stride is not a tuple");
  for (const auto& e : value.toTupleRef().elements()) out.push_back(e.toInt());
  return out;
}

class Interpreter {
 public:
  Interpreter(const char* data, size_t size, caffe2::serialize::PyTorchStreamReader& reader)
      : data_(data), size_(size), reader_(reader) {}

  c10::IValue run() {
    while (true) {
      uint8_t op = byte();
      switch (op) {
        case 0x80:
          byte();
          break;  // PROTO
        case 0x95:
          take(8);
          break;   // FRAME
        case '.':  // STOP
          if (stack_.size() != 1) bad("stack not of size 1 at STOP");
          return stack_.back();
        case '(':
          marks_.push_back(stack_.size());
          break;  // MARK
        case '}':
          push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
          break;
        case ']':
          push(c10::impl::GenericList(c10::AnyType::get()));
          break;
        case ')':
          push(c10::ivalue::Tuple::create(std::vector<c10::IValue>{}));
          break;
        case 't':
          push(c10::ivalue::Tuple::create(pop_mark()));
          break;
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          size_t n = op - 0x84;
          if (stack_.size() < n) bad("stack underflow");
          std::vector<c10::IValue> items(stack_.end() - n, stack_.end());
          stack_.resize(stack_.size() - n);
          push(c10::ivalue::Tuple::create(std::move(items)));
        } break;
        case 'N':
          push(c10::IValue());
          break;
        case 0x88:
          push(true);
          break;
        case 0x89:
          push(false);
          break;
        case 'J': {
          int32_t v;
          std::memcpy(&v, take(4), 4);
          push(int64_t{v});
        } break;
        case 'K':
          push(int64_t{byte()});
          break;
        case 'M': {
          uint16_t v;
          std::memcpy(&v, take(2), 2);
          push(int64_t{v});
        } break;
        case 0x8a: {  // LONG1
          size_t n = byte();
          if (n > 8) bad("integer wider than 64 bits");
          const char* p = take(n);
          uint64_t v = 0;
          for (size_t i = 0; i < n; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
          if (n > 0 && n < 8 && (uint8_t(p[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
          push(static_cast<int64_t>(v));
        } break;
        case 'G': {  // BINFLOAT, big-endian
          const char* p = take(8);
          uint64_t bits = 0;
          for (int i = 0; i < 8; ++i) bits = (bits << 8) | uint8_t(p[i]);
          double v;
          std::memcpy(&v, &bits, 8);
          push(v);
        } break;
        case 'X': {
          uint32_t n;
          std::memcpy(&n, take(4), 4);
          push(std::string(take(n), n));
        } break;
        case 0x8c: {
          size_t n = byte();
          push(std::string(take(n), n));
        } break;
        case 'a': {  // APPEND
          auto v = pop();
          top().toList().push_back(v);
        } break;
        case 'e': {  // APPENDS
          auto items = pop_mark();
          auto list = top().toList();
          for (auto& v : items) list.push_back(v);
        } break;
        case 'l': {
          c10::impl::GenericList list(c10::AnyType::get());
          for (auto& v : pop_mark()) list.push_back(v);
          push(list);
        } break;
        case 'd': {
          auto items = pop_mark();
          c10::impl::GenericDict dict(c10::AnyType::get(), c10::AnyType::get());
          for (size_t i = 0; i + 1 < items.size(); i += 2)
            dict.insert_or_assign(items[i], items[i + 1]);
          push(dict);
        } break;
        case 's': {  // SETITEM
          auto value = pop();
          auto key = pop();
          top().toGenericDict().insert_or_assign(key, value);
        } break;
        case 'u': {  // SETITEMS
          auto items = pop_mark();
          auto dict = top().toGenericDict();
          for (size_t i = 0; i + 1 < items.size(); i += 2)
            dict.insert_or_assign(items[i], items[i + 1]);
        } break;
        case 'q':
          memo_[byte()] = top();
          break;
        case 'r': {
          uint32_t k;
          std::memcpy(&k, take(4), 4);
          memo_[k] = top();
        } break;
        case 0x94: {
          uint32_t k = static_cast<uint32_t>(memo_.size());
          memo_[k] = top();
        } break;
        case 'h':
          push(get(byte()));
          break;
        case 'j': {
          uint32_t k;
          std::memcpy(&k, take(4), 4);
          push(get(k));
        } break;
        case '0':
          pop();
          break;
        case '1':
          pop_mark();
          break;
        case '2':
          push(top());
          break;
        case 'c': {  // GLOBAL
          std::string module = line();
          std::string name = line();
          push(std::string(kGlobal) + module + "." + name);
        } break;
        case 0x93: {  // STACK_GLOBAL
          auto name = pop();
          auto module = pop();
          push(std::string(kGlobal) + module.toStringRef() + "." + name.toStringRef());
        } break;
        case 'R':
        case 0x81: {  // REDUCE, NEWOBJ
          auto args = pop();
          auto callable = pop();
          push(call(callable, args));
        } break;
        case 'b': {  // BUILD
          pop();     // the state: an OrderedDict's attributes (state_dict()._metadata)
          if (!top().isGenericDict()) bad("BUILD of an object that is not a dict");
        } break;
        case 'Q':
          push(persistent(pop()));
          break;  // BINPERSID
        default:
          bad("opcode " + std::to_string(op));
      }
    }
  }

 private:
  uint8_t byte() { return static_cast<uint8_t>(*take(1)); }
  const char* take(size_t n) {
    if (n > size_ - pos_) bad("truncated");
    const char* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  std::string line() {
    std::string out;
    for (char c; (c = static_cast<char>(byte())) != '\n';) out += c;
    return out;
  }
  void push(c10::IValue v) { stack_.push_back(std::move(v)); }
  c10::IValue pop() {
    if (stack_.empty()) bad("stack underflow");
    auto v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  c10::IValue& top() {
    if (stack_.empty()) bad("stack underflow");
    return stack_.back();
  }
  std::vector<c10::IValue> pop_mark() {
    if (marks_.empty() || marks_.back() > stack_.size()) bad("no MARK");
    size_t start = marks_.back();
    marks_.pop_back();
    std::vector<c10::IValue> items(stack_.begin() + start, stack_.end());
    stack_.resize(start);
    return items;
  }
  c10::IValue get(uint32_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) bad("memo key " + std::to_string(key));
    return it->second;
  }

  c10::IValue call(const c10::IValue& callable, const c10::IValue& args) {
    if (!args.isTuple()) bad("call arguments are not a tuple");
    const std::vector<c10::IValue> a = args.toTupleRef().elements().vec();
    if (is_global(callable, "collections.OrderedDict")) {
      return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
    }
    if (is_global(callable, "torch._utils._rebuild_tensor_v2")) {
      if (a.size() < 4 || !a[0].isTensor()) bad("_rebuild_tensor_v2 arguments");
      const auto& storage = a[0].toTensor();
      return at::empty({0}, storage.options())
          .set_(storage.storage(), a[1].toInt(), int_tuple(a[2]), int_tuple(a[3]));
    }
    if (is_global(callable, "torch._utils._rebuild_parameter")) {
      if (a.empty() || !a[0].isTensor()) bad("_rebuild_parameter arguments");
      return a[0];
    }
    std::string name = callable.isString() ? callable.toStringRef() : "?";
    if (name.rfind(kGlobal, 0) == 0) name = name.substr(std::strlen(kGlobal));
    bad("Python object of type " + name);
  }

  c10::IValue persistent(const c10::IValue& id) {
    if (!id.isTuple() || id.toTupleRef().elements().size() < 5) bad("persistent id");
    const std::vector<c10::IValue> a = id.toTupleRef().elements().vec();
    if (!a[0].isString() || a[0].toStringRef() != "storage") bad("persistent id");
    const std::string key = a[2].toStringRef();
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    auto dtype = storage_dtype(a[1]);
    int64_t numel = a[4].toInt();
    auto tensor = at::empty({numel}, at::TensorOptions().dtype(dtype));
    size_t bytes = static_cast<size_t>(numel) * tensor.element_size();
    if (bytes > 0) {
      auto [data, size] = reader_.getRecord("data/" + key);
      if (size < bytes) bad("storage " + key + " is shorter than its tensor");
      std::memcpy(tensor.data_ptr(), data.get(), bytes);
    }
    storages_[key] = tensor;
    return tensor;
  }

  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  caffe2::serialize::PyTorchStreamReader& reader_;
  std::vector<c10::IValue> stack_;
  std::vector<size_t> marks_;
  std::map<uint32_t, c10::IValue> memo_;
  std::map<std::string, at::Tensor> storages_;
};

}  // namespace

c10::IValue load_python_pickle(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  auto [data, size] = reader.getRecord("data.pkl");
  return Interpreter(static_cast<const char*>(data.get()), size, reader).run();
}

}  // namespace ddp::detail
