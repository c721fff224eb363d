// Covers the safetensors reader behind `zrtier bench codec FILE`: a file the test writes itself
// parses to the right tensors, malformed files fail with EINVAL naming the problem (syntax errors
// in nlohmann-json's words, with line and column), and a model's files are listed from files and
// directories.
//
// tools/ sources are linked into the zrtier program, not into a library the tests can link, so this
// test compiles the reader itself.
#include "tools/bench/safetensors.cc"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/codec/codec.h"
#include "tools/bench/sample_data.h"

namespace zrtier::tools {
namespace {

std::vector<uint8_t> MakeFile(const std::string& header, size_t data_len, uint64_t seed = 1) {
  std::vector<uint8_t> f(8 + header.size() + data_len);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f[i] = static_cast<uint8_t>(n >> (8 * i));
  memcpy(&f[8], header.data(), header.size());
  FillSample(SampleKind::kBf16Gaussian, seed, &f[8 + header.size()], data_len);
  return f;
}

const char* kHeader =
    R"({"__metadata__": {"format": "pt", "note": "a \"quoted\" \u00e9 name"},)"
    R"( "layer.0.weight": {"dtype": "BF16", "shape": [64, 256], "data_offsets": [0, 32768]},)"
    R"( "layer.0.bias": {"dtype":"F32","shape":[256],"data_offsets":[32768,33792]},)"
    R"( "scalar": {"dtype": "F16", "shape": [], "data_offsets": [33792, 33794]},)"
    R"( "empty": {"dtype": "I64", "shape": [0, 3], "data_offsets": [33794, 33794]}})";

TEST(Safetensors, ParsesAFileItWrote) {
  std::vector<uint8_t> f = MakeFile(kHeader, 33794);
  // Round-trip through a real file and the mapping the bench uses.
  char path[] = "/tmp/zrtier_safetensors_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, f.data(), f.size()), static_cast<ssize_t>(f.size()));
  close(fd);
  MappedFile file;
  ASSERT_TRUE(file.Open(path).ok());
  unlink(path);
  ASSERT_EQ(file.size(), f.size());
  std::vector<SafetensorsTensor> t;
  Status s = ParseSafetensors(file.data(), file.size(), &t);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(t.size(), 4u);
  const uint64_t data = 8 + strlen(kHeader);
  EXPECT_EQ(t[0].name, "layer.0.weight");
  EXPECT_EQ(t[0].dtype, "BF16");
  EXPECT_EQ(t[0].shape, (std::vector<uint64_t>{64, 256}));
  EXPECT_EQ(t[0].begin, data);
  EXPECT_EQ(t[0].end, data + 32768);
  EXPECT_EQ(t[1].dtype, "F32");
  EXPECT_EQ(t[1].begin, data + 32768);
  EXPECT_TRUE(t[2].shape.empty());
  EXPECT_EQ(t[3].begin, t[3].end);
  // The bytes the bench would cut into chunks are the tensor's: bf16 compresses like bf16.
  Codec codec({});
  std::vector<uint8_t> enc(Codec::MaxEncodedSize(32768));
  size_t n = 0;
  ASSERT_TRUE(codec.Encode(file.data() + t[0].begin, 32768, enc.data(), enc.size(), &n).ok());
  EXPECT_LT(n, 32768 / 1.35);
}

TEST(Safetensors, MalformedFilesFailClearly) {
  struct Case {
    std::string header;
    size_t data;
    const char* expect;  // a piece of the message
  } cases[] = {
      {R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]})", 8,
       "unexpected end of input"},
      {R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 9]}})", 8, "outside"},
      {R"({"a": {"dtype": "BF16", "shape": [5], "data_offsets": [0, 8]}})", 8, "need 10 bytes"},
      {R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [8, 0]}})", 8, "outside"},
      {R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0]}})", 8, "data_offsets"},
      {R"({"a": {"dtype": 3, "shape": [4], "data_offsets": [0, 8]}})", 8, "dtype"},
      {R"({"a": {"dtype": "BF16", "shape": [-4], "data_offsets": [0, 8]}})", 8, "non-integer"},
      {R"({"a": {"dtype": "BF16", "shape": [1.5], "data_offsets": [0, 8]}})", 8, "non-integer"},
      {R"({"a": 5})", 8, "not an object"},
      {R"([1, 2])", 8, "not a JSON object"},
      {R"({"a": {"dtype": "BF16"} "b": 1})", 8, "expected '}'"},
      {R"({"a": tru})", 8, "invalid literal"},
      {R"({"a": "x\q"})", 8, "forbidden character after backslash"},
      {R"({"a": {}} x)", 8, "expected end of input"},
      {std::string(100, '[') + std::string(100, ']'), 8, "deeper"},
      {"{\"a\": \"\xff\"}", 8, "invalid string"},  // not UTF-8
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> f = MakeFile(c.header, c.data);
    std::vector<SafetensorsTensor> t;
    Status s = ParseSafetensors(f.data(), f.size(), &t);
    EXPECT_EQ(s.code(), EINVAL) << c.header;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.header << " -> " << s.ToString();
  }
  // Header length past the end of the file, and a file too short to hold one.
  std::vector<uint8_t> f = MakeFile("{}", 0);
  f[0] = 200;
  std::vector<SafetensorsTensor> t;
  EXPECT_NE(ParseSafetensors(f.data(), f.size(), &t).message().find("does not fit"),
            std::string::npos);
  EXPECT_EQ(ParseSafetensors(f.data(), 5, &t).code(), EINVAL);
  // Every truncation of a good header is an error, never a crash.
  std::string good = kHeader;
  for (size_t cut = 0; cut < good.size(); ++cut) {
    std::vector<uint8_t> g = MakeFile(good.substr(0, cut), 0);
    EXPECT_EQ(ParseSafetensors(g.data(), g.size(), &t).code(), EINVAL) << cut;
  }
}

TEST(Safetensors, ListsAModelsFiles) {
  char tmp[] = "/tmp/zrtier_safetensors_dir_XXXXXX";
  ASSERT_NE(mkdtemp(tmp), nullptr);
  const std::string d = tmp;
  auto touch = [](const std::string& p) { fclose(fopen(p.c_str(), "w")); };
  ASSERT_EQ(mkdir((d + "/m").c_str(), 0700), 0);
  touch(d + "/m/b.safetensors");
  touch(d + "/outside");
  ASSERT_EQ(symlink((d + "/outside").c_str(), (d + "/m/a.safetensors").c_str()), 0);
  touch(d + "/m/c.safetensors.index.json");
  ASSERT_EQ(mkdir((d + "/m/sub.safetensors").c_str(), 0700), 0);
  ASSERT_EQ(mkdir((d + "/empty").c_str(), 0700), 0);

  // A directory: its *.safetensors regular files (a link followed), sorted; files as given.
  std::vector<std::string> files;
  ASSERT_TRUE(ListSafetensorsFiles({d + "/outside", d + "/m"}, true, &files).ok());
  EXPECT_EQ(files, (std::vector<std::string>{d + "/outside", d + "/m/a.safetensors",
                                             d + "/m/b.safetensors"}));
  Status s = ListSafetensorsFiles({d + "/m", d + "/missing"}, true, &files);
  EXPECT_EQ(s.code(), ENOENT);
  EXPECT_NE(s.message().find(d + "/missing"), std::string::npos) << s.ToString();
  s = ListSafetensorsFiles({d + "/empty"}, true, &files);
  EXPECT_EQ(s.code(), EINVAL);
  EXPECT_NE(s.message().find("no .safetensors file"), std::string::npos) << s.ToString();
  EXPECT_EQ(ListSafetensorsFiles({d + "/m"}, false, &files).code(), EISDIR);
  EXPECT_EQ(ListSafetensorsFiles({"/dev/null"}, true, &files).code(), EINVAL);

  for (const char* p :
       {"/m/b.safetensors", "/m/a.safetensors", "/m/c.safetensors.index.json", "/outside"})
    unlink((d + p).c_str());
  rmdir((d + "/m/sub.safetensors").c_str());
  rmdir((d + "/m").c_str());
  rmdir((d + "/empty").c_str());
  rmdir(tmp);
}

}  // namespace
}  // namespace zrtier::tools
