#include "tools/bench/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <iterator>

namespace zrtier::tools {
namespace {

constexpr int kMaxDepth = 64;
constexpr uint64_t kMaxHeader = 100ull << 20;  // the safetensors format's own limit

// JSON's one-character escapes: `\written` in a string stands for `meant`.
struct Escape {
  char written, meant;
};
constexpr Escape kEscapes[] = {{'"', '"'},  {'\\', '\\'}, {'/', '/'},  {'b', '\b'},
                               {'f', '\f'}, {'n', '\n'},  {'r', '\r'}, {'t', '\t'}};

struct Json {
  enum Type { kNull, kBool, kNumber, kString, kArray, kObject } type = kNull;
  bool boolean = false;
  bool integer = false;  // a number written without fraction or exponent, fitting uint64
  uint64_t u = 0;
  std::string str;
  std::vector<Json> items;                            // array
  std::vector<std::pair<std::string, Json>> members;  // object, in order
};

class Parser {
 public:
  Parser(const char* p, size_t n) : p_(p), end_(p + n), begin_(p) {}

  Status ParseDocument(Json* out) {
    ZRTIER_RETURN_IF_ERROR(Value(out, 0));
    SkipSpace();
    if (p_ != end_) return Error("trailing characters after the JSON value");
    return Status::Ok();
  }

 private:
  Status Error(const std::string& what) const {
    return Status::Error(EINVAL, "safetensors header: " + what + " at byte " +
                                     std::to_string(p_ - begin_) + " of the JSON");
  }
  void SkipSpace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool Literal(const char* word) {
    size_t n = strlen(word);
    if (static_cast<size_t>(end_ - p_) < n || memcmp(p_, word, n) != 0) return false;
    p_ += n;
    return true;
  }

  Status Value(Json* out, int depth) {
    if (depth > kMaxDepth) return Error("nesting deeper than 64");
    SkipSpace();
    if (p_ == end_) return Error("unexpected end");
    switch (*p_) {
      case '{':
        return Object(out, depth);
      case '[':
        return Array(out, depth);
      case '"':
        out->type = Json::kString;
        return String(&out->str);
      case 't':
      case 'f':
        out->type = Json::kBool;
        if (Literal("true")) return out->boolean = true, Status::Ok();
        if (Literal("false")) return Status::Ok();
        return Error("bad literal");
      case 'n':
        out->type = Json::kNull;
        return Literal("null") ? Status::Ok() : Error("bad literal");
      default:
        return Number(out);
    }
  }

  Status Object(Json* out, int depth) {
    out->type = Json::kObject;
    ++p_;  // '{'
    SkipSpace();
    if (p_ != end_ && *p_ == '}') return ++p_, Status::Ok();
    for (;;) {
      SkipSpace();
      if (p_ == end_ || *p_ != '"') return Error("expected a string key");
      std::string key;
      ZRTIER_RETURN_IF_ERROR(String(&key));
      SkipSpace();
      if (p_ == end_ || *p_ != ':') return Error("expected ':'");
      ++p_;
      Json value;
      ZRTIER_RETURN_IF_ERROR(Value(&value, depth + 1));
      out->members.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (p_ == end_) return Error("unterminated object");
      if (*p_ == '}') return ++p_, Status::Ok();
      if (*p_ != ',') return Error("expected ',' or '}'");
      ++p_;
    }
  }

  Status Array(Json* out, int depth) {
    out->type = Json::kArray;
    ++p_;  // '['
    SkipSpace();
    if (p_ != end_ && *p_ == ']') return ++p_, Status::Ok();
    for (;;) {
      Json value;
      ZRTIER_RETURN_IF_ERROR(Value(&value, depth + 1));
      out->items.push_back(std::move(value));
      SkipSpace();
      if (p_ == end_) return Error("unterminated array");
      if (*p_ == ']') return ++p_, Status::Ok();
      if (*p_ != ',') return Error("expected ',' or ']'");
      ++p_;
    }
  }

  // Strings: escapes are checked and kept simple (\uXXXX becomes '?'; tensor names that need it
  // are only used for display).
  Status String(std::string* out) {
    ++p_;  // '"'
    while (p_ != end_ && *p_ != '"') {
      char c = *p_++;
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (p_ == end_) break;
      char esc = *p_++;
      if (esc == 'u') {
        for (int i = 0; i < 4; ++i, ++p_)
          if (p_ == end_ || !isxdigit(static_cast<unsigned char>(*p_)))
            return Error("bad \\u escape");
        out->push_back('?');
        continue;
      }
      const auto* e = std::find_if(std::begin(kEscapes), std::end(kEscapes),
                                   [esc](const Escape& x) { return x.written == esc; });
      if (e == std::end(kEscapes)) return Error("bad escape");
      out->push_back(e->meant);
    }
    if (p_ == end_) return Error("unterminated string");
    ++p_;  // '"'
    return Status::Ok();
  }

  Status Number(Json* out) {
    out->type = Json::kNumber;
    bool negative = p_ != end_ && *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || !isdigit(static_cast<unsigned char>(*p_)))
      return Error("unexpected character");
    bool overflow = false;
    uint64_t v = 0;
    while (p_ != end_ && isdigit(static_cast<unsigned char>(*p_))) {
      uint64_t digit = static_cast<uint64_t>(*p_++ - '0');
      if (v > (UINT64_MAX - digit) / 10) overflow = true;
      v = v * 10 + digit;
    }
    bool fraction = false;
    if (p_ != end_ && *p_ == '.') {
      fraction = true;
      ++p_;
      if (p_ == end_ || !isdigit(static_cast<unsigned char>(*p_))) return Error("bad number");
      while (p_ != end_ && isdigit(static_cast<unsigned char>(*p_))) ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      fraction = true;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !isdigit(static_cast<unsigned char>(*p_))) return Error("bad number");
      while (p_ != end_ && isdigit(static_cast<unsigned char>(*p_))) ++p_;
    }
    out->integer = !negative && !fraction && !overflow;
    out->u = v;
    return Status::Ok();
  }

  const char* p_;
  const char* end_;
  const char* begin_;
};

Status Bad(const std::string& tensor, const std::string& what) {
  return Status::Error(EINVAL, "safetensors tensor '" + tensor + "': " + what);
}

}  // namespace

size_t SafetensorsDtypeSize(const std::string& d) {
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  return 0;
}

Status ParseSafetensors(const uint8_t* file, size_t size, std::vector<SafetensorsTensor>* out) {
  out->clear();
  if (size < 8)
    return Status::Error(EINVAL, "safetensors: file shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[i];
  if (n > kMaxHeader || n > size - 8)
    return Status::Error(EINVAL, "safetensors: header length " + std::to_string(n) +
                                     " does not fit in the file (" + std::to_string(size) +
                                     " bytes); not a safetensors file?");
  Json doc;
  ZRTIER_RETURN_IF_ERROR(Parser(reinterpret_cast<const char*>(file + 8), n).ParseDocument(&doc));
  if (doc.type != Json::kObject)
    return Status::Error(EINVAL, "safetensors: header is not a JSON object");
  const uint64_t data_start = 8 + n;
  const uint64_t data_len = size - data_start;
  for (const auto& [name, entry] : doc.members) {
    if (name == "__metadata__") continue;
    if (entry.type != Json::kObject) return Bad(name, "entry is not an object");
    SafetensorsTensor t;
    t.name = name;
    const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [key, value] : entry.members) {
      if (key == "dtype") dtype = &value;
      if (key == "shape") shape = &value;
      if (key == "data_offsets") offsets = &value;
    }
    if (!dtype || dtype->type != Json::kString) return Bad(name, "missing string 'dtype'");
    if (!shape || shape->type != Json::kArray) return Bad(name, "missing array 'shape'");
    if (!offsets || offsets->type != Json::kArray || offsets->items.size() != 2)
      return Bad(name, "'data_offsets' is not [begin, end]");
    t.dtype = dtype->str;
    unsigned __int128 elements = 1;
    for (const Json& dim : shape->items) {
      if (dim.type != Json::kNumber || !dim.integer) return Bad(name, "shape has a non-integer");
      t.shape.push_back(dim.u);
      elements *= dim.u;
      if (elements > (unsigned __int128)UINT64_MAX) return Bad(name, "shape too large");
    }
    for (const Json& o : offsets->items)
      if (o.type != Json::kNumber || !o.integer) return Bad(name, "data_offsets has a non-integer");
    uint64_t b = offsets->items[0].u, e = offsets->items[1].u;
    if (b > e || e > data_len)
      return Bad(name, "data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                           "] outside the " + std::to_string(data_len) + "-byte data area");
    size_t esize = SafetensorsDtypeSize(t.dtype);
    if (esize && elements * esize != e - b)
      return Bad(name, "shape and dtype " + t.dtype + " need " +
                           std::to_string(static_cast<uint64_t>(elements * esize)) +
                           " bytes, data_offsets give " + std::to_string(e - b));
    t.begin = data_start + b;
    t.end = data_start + e;
    out->push_back(std::move(t));
  }
  return Status::Ok();
}

MappedFile::~MappedFile() {
  if (data_ && size_) munmap(const_cast<uint8_t*>(data_), size_);
}

Status MappedFile::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(errno, "cannot open " + path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return Status::Error(err, "cannot stat " + path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) {
    close(fd);
    return Status::Error(EINVAL, path + " is empty");
  }
  void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return size_ = 0, Status::Error(err, "cannot map " + path);
  data_ = static_cast<const uint8_t*>(p);
  return Status::Ok();
}

}  // namespace zrtier::tools
