// A reader for safetensors files (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON
//   {"__metadata__": {...}, "<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]},
//   ...}
// and the tensor data, offsets relative to the byte after the header. The JSON is parsed with
// nlohmann-json (strict: UTF-8, no trailing text); every malformed input is an EINVAL Status that
// says what is wrong and where, never a crash or an exception.
//
// Thread safety: pure functions, except ListSafetensorsFiles (reads directories) and MappedFile,
// which one thread owns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zrtier/status.h"

namespace zrtier::tools {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // as written: "BF16", "F16", "F32", "I64", ...
  std::vector<uint64_t> shape;  // empty for a scalar
  uint64_t begin = 0;           // absolute file offsets of the tensor's bytes: [begin, end)
  uint64_t end = 0;
};

// Bytes per element of a safetensors dtype, or 0 when unknown (the size check is then skipped).
size_t SafetensorsDtypeSize(const std::string& dtype);

// Parses the header of a whole safetensors file held in memory (`size` bytes at `file`) and lists
// its tensors in header order. Checks: the header fits in the file, the JSON is well formed (depth
// <= 64), each tensor entry has a string dtype, an array shape of non-negative integers and two
// data_offsets with begin <= end inside the data area, and end - begin == elements * dtype size
// for known dtypes. Fails with EINVAL naming the problem.
Status ParseSafetensors(const uint8_t* file, size_t size, std::vector<SafetensorsTensor>* out);

// The files of one model given as `paths`: each path is a file, taken as it is, or a directory,
// which stands for every regular file (symbolic links followed) named *.safetensors directly in
// it, sorted by name; the result keeps the order of `paths`. Fails naming the path with ENOENT (or
// the errno of stat) for a path that does not exist, EISDIR for a directory when
// `directories == false`, and EINVAL for a path that is neither a regular file nor a directory or
// a directory without a .safetensors file.
Status ListSafetensorsFiles(const std::vector<std::string>& paths, bool directories,
                            std::vector<std::string>* files);

// A read-only mapping of a whole file (mmap), unmapped on destruction.
class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Maps `path`. Fails with the errno of open/fstat/mmap and the path in the message.
  Status Open(const std::string& path);
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace zrtier::tools
