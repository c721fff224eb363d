#include "tools/bench/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include <nlohmann/json.hpp>

namespace zrtier::tools {
namespace {

constexpr int kMaxDepth = 64;
constexpr uint64_t kMaxHeader = 100ull << 20;  // the safetensors format's own limit

// The header in file order (ordered_json keeps the order of the keys).
using Json = nlohmann::ordered_json;

// Parses the header's JSON into *doc, refusing nesting deeper than kMaxDepth.
Status ParseHeader(const char* p, size_t n, Json* doc) {
  const auto limit_depth = [](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxDepth) throw std::runtime_error("nesting deeper than 64");
    return true;
  };
  try {
    *doc = Json::parse(p, p + n, limit_depth);
  } catch (const std::exception& e) {
    return Status::Error(EINVAL, std::string("safetensors header: ") + e.what());
  }
  return Status::Ok();
}

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
  ZRTIER_RETURN_IF_ERROR(ParseHeader(reinterpret_cast<const char*>(file + 8), n, &doc));
  if (!doc.is_object()) return Status::Error(EINVAL, "safetensors: header is not a JSON object");
  const uint64_t data_start = 8 + n;
  const uint64_t data_len = size - data_start;
  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object()) return Bad(name, "entry is not an object");
    SafetensorsTensor t;
    t.name = name;
    const auto dtype = entry.find("dtype"), shape = entry.find("shape"),
               offsets = entry.find("data_offsets");
    if (dtype == entry.end() || !dtype->is_string()) return Bad(name, "missing string 'dtype'");
    if (shape == entry.end() || !shape->is_array()) return Bad(name, "missing array 'shape'");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2)
      return Bad(name, "'data_offsets' is not [begin, end]");
    t.dtype = dtype->get<std::string>();
    unsigned __int128 elements = 1;
    for (const Json& dim : *shape) {
      if (!dim.is_number_unsigned()) return Bad(name, "shape has a non-integer");
      t.shape.push_back(dim.get<uint64_t>());
      elements *= t.shape.back();
      if (elements > (unsigned __int128)UINT64_MAX) return Bad(name, "shape too large");
    }
    for (const Json& o : *offsets)
      if (!o.is_number_unsigned()) return Bad(name, "data_offsets has a non-integer");
    uint64_t b = (*offsets)[0].get<uint64_t>(), e = (*offsets)[1].get<uint64_t>();
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

Status ListSafetensorsFiles(const std::vector<std::string>& paths, bool directories,
                            std::vector<std::string>* files) {
  namespace fs = std::filesystem;
  files->clear();
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (st.type() == fs::file_type::not_found) return Status::Error(ENOENT, path);
    if (ec) return Status::Error(ec.value(), "cannot stat " + path);
    if (fs::is_regular_file(st)) {
      files->push_back(path);
      continue;
    }
    if (!fs::is_directory(st))
      return Status::Error(EINVAL, path + " is neither a file nor a directory");
    if (!directories) return Status::Error(EISDIR, path);
    std::vector<std::string> found;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code ec2;
      if (it->path().extension() == ".safetensors" && fs::is_regular_file(it->path(), ec2))
        found.push_back(it->path().string());
    }
    if (ec) return Status::Error(ec.value(), "cannot list " + path);
    if (found.empty()) return Status::Error(EINVAL, path + ": no .safetensors file in it");
    std::sort(found.begin(), found.end());
    files->insert(files->end(), found.begin(), found.end());
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
