// The GPU chunk format's CPU encoder (byte planes, length-limited canonical Huffman per plane in
// word-aligned segments) and its reference decoder (four segments decoded at once for
// instruction-level parallelism, then the planes merged). The format: gpu_format.h.
#include "runtime/codec/gpu_codec.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "runtime/base/checksum.h"
#include "runtime/codec/gpu_format.h"
#include "runtime/codec/planes.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the format's integers are little-endian");

namespace zrtier {
namespace {

using gpufmt::Align16;
using gpufmt::kMaxCodeLen;
using gpufmt::Load32;
using gpufmt::Store32;
using gpufmt::TableEntry;

Status Corrupt(const char* why) {
  return Status::Error(EBADMSG, std::string("codec: gpu format: ") + why);
}

void Histogram(const uint8_t* p, size_t n, uint32_t* hist) {
  // Four tables, so that runs of one byte value do not serialize on one counter.
  uint32_t h[4][256] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h[0][p[i]];
    ++h[1][p[i + 1]];
    ++h[2][p[i + 2]];
    ++h[3][p[i + 3]];
  }
  for (; i < n; ++i) ++h[0][p[i]];
  for (int s = 0; s < 256; ++s) hist[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
}

// Huffman code lengths (1..kMaxCodeLen) for the symbols with a non-zero count in `hist`, 0 for
// the others (gpufmt::HuffmanLengths, after sorting them by count).
void CodeLengths(const uint32_t* hist, uint8_t* lens) {
  gpufmt::HuffmanWork w;
  int m = 0;
  for (int s = 0; s < 256; ++s)
    if (hist[s]) w.order[m++] = static_cast<uint16_t>(s);
  memset(lens, 0, 256);
  if (m == 1) {
    lens[w.order[0]] = 1;
    return;
  }
  std::sort(w.order, w.order + m,
            [&](uint16_t a, uint16_t b) { return hist[a] != hist[b] ? hist[a] < hist[b] : a < b; });
  gpufmt::HuffmanLengths(hist, m, w, lens);
}

// Appends the codes of p[0..count) to `out` (MSB-first in 32-bit words, the last word padded with
// zero bits) and returns the words written. code[s] = canonical code << 5 | length.
size_t EncodeSegment(const uint8_t* p, size_t count, const uint32_t* code, uint8_t* out) {
  uint64_t buf = 0;
  int nb = 0;  // valid bits in the low end of buf; < 32 between steps
  uint8_t* w = out;
  size_t i = 0;
  for (; i + 2 <= count; i += 2) {
    // Two codes of <= 11 bits on top of < 32 pending bits fit the 64-bit buffer.
    uint32_t a = code[p[i]], b = code[p[i + 1]];
    buf = (buf << (a & 31)) | (a >> 5);
    buf = (buf << (b & 31)) | (b >> 5);
    nb += static_cast<int>((a & 31) + (b & 31));
    if (nb >= 32) {
      nb -= 32;
      Store32(w, static_cast<uint32_t>(buf >> nb));
      w += 4;
    }
  }
  if (i < count) {
    uint32_t a = code[p[i]];
    buf = (buf << (a & 31)) | (a >> 5);
    nb += static_cast<int>(a & 31);
    if (nb >= 32) {
      nb -= 32;
      Store32(w, static_cast<uint32_t>(buf >> nb));
      w += 4;
    }
  }
  if (nb > 0) {
    Store32(w, static_cast<uint32_t>(buf << (32 - nb)));
    w += 4;
  }
  return static_cast<size_t>(w - out) / 4;
}

// Huffman-codes the n bytes of `plane` into a section at `out` (gpu_format.h) if that is smaller
// than n bytes; returns its size, or 0 to store the plane raw. Writes at most n bytes.
uint32_t EncodeHuffmanPlane(const uint8_t* plane, uint32_t n, uint8_t* out, uint8_t* max_len,
                            uint16_t* symbol_count) {
  uint32_t hist[256];
  Histogram(plane, n, hist);
  uint8_t lens[256];
  CodeLengths(hist, lens);
  uint64_t bits = 0;
  uint32_t counts[16] = {};
  int top = 1;
  for (int s = 0; s < 256; ++s) {
    bits += uint64_t{hist[s]} * lens[s];
    ++counts[lens[s]];
    top = std::max<int>(top, lens[s]);
  }
  counts[0] = 0;
  uint32_t used = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) used += counts[l];
  const uint32_t segments = gpufmt::SegmentCount(n, gpufmt::kSegmentLog2);
  const gpufmt::HuffmanLayout layout = gpufmt::HuffmanLayoutOf(used, segments);
  // Each segment pads its last word with fewer than 32 bits.
  const uint64_t bound = layout.stream + 4 * (bits / 32 + segments);
  if (bound >= n) return 0;

  uint32_t code[256];
  gpufmt::AssignCanonicalCodes(lens, out + layout.symbols, code);
  memset(out, 0, layout.symbols);
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    out[2 * l] = static_cast<uint8_t>(counts[l]);
    out[2 * l + 1] = static_cast<uint8_t>(counts[l] >> 8);
  }
  memset(out + layout.symbols + used, 0, layout.offsets - layout.symbols - used);
  memset(out + layout.offsets + 4 * (segments + 1), 0,
         layout.stream - layout.offsets - 4 * (segments + 1));
  uint8_t* stream = out + layout.stream;
  const size_t seg = size_t{1} << gpufmt::kSegmentLog2;
  uint32_t words = 0;
  for (uint32_t j = 0; j < segments; ++j) {
    Store32(out + layout.offsets + 4 * j, words);
    size_t begin = j * seg, count = std::min<size_t>(seg, n - begin);
    words += static_cast<uint32_t>(EncodeSegment(plane + begin, count, code, stream + 4 * words));
  }
  Store32(out + layout.offsets + 4 * segments, words);
  *max_len = static_cast<uint8_t>(top);
  *symbol_count = static_cast<uint16_t>(used);
  return layout.stream + 4 * words;
}

// The decode table of a section's code, by filling each code's range of prefixes.
void BuildTable(const gpufmt::CodeSpec& spec, const uint8_t* symbols, TableEntry* table) {
  uint32_t e = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    const uint32_t span = 1u << (kMaxCodeLen - l);
    for (uint32_t k = 0; k < spec.count[l]; ++k, e += span) {
      const TableEntry v = static_cast<TableEntry>(symbols[spec.start[l] + k] | l << 8);
      std::fill(table + e, table + e + span, v);
    }
  }
  std::fill(table + e, table + gpufmt::kTableSize, TableEntry{0});
}

// One segment's bit reader: `bit` is the position of the next bit, counted from the stream's
// start; the segment's words are [start, end). Reading the 64 bits at `bit` takes the word holding
// it and the next one (bits run from each word's most significant bit down).
struct Reader {
  uint64_t bit;
  uint32_t start, end;
};

// The bits at r.bit, left-aligned, at least 33 of them valid. REQUIRES: both words inside the
// segment (Window) or any position (SafeWindow: words outside the segment read as zeros).
inline uint64_t Window(const Reader& r, const uint8_t* stream) {
  const size_t k = r.bit >> 5;
  const uint64_t v = uint64_t{Load32(stream + 4 * k)} << 32 | Load32(stream + 4 * k + 4);
  return v << (r.bit & 31);
}
inline uint64_t SafeWindow(const Reader& r, const uint8_t* stream) {
  const uint64_t k = r.bit >> 5;
  const uint64_t hi = k < r.end ? Load32(stream + 4 * k) : 0;
  const uint64_t lo = k + 1 < r.end ? Load32(stream + 4 * k + 4) : 0;
  return (hi << 32 | lo) << (r.bit & 31);
}

// The CPU's decode table: for each kMaxCodeLen-bit prefix, the one to three whole codes it begins
// with: symbols in bytes 0-2, their bits << 24 (4 bits), count (1-3) << 28; kNoCode for a prefix
// that is no code (count 1 and no bits, so a decode loop still ends; kBadBit marks the error).
constexpr uint32_t kBadBit = 1u << 31;
constexpr uint32_t kNoCode = kBadBit | 1u << 28;

void BuildMultiTable(const TableEntry* table, uint32_t* multi) {
  constexpr uint32_t kMask = gpufmt::kTableSize - 1;
  for (uint32_t e = 0; e < gpufmt::kTableSize; ++e) {
    uint32_t v = 0, bits = 0, count = 0;
    // Codes are added while all their bits lie inside the prefix.
    while (count < 3) {
      const uint32_t c = table[(e << bits) & kMask], len = c >> 8;
      if (len == 0 || bits + len > kMaxCodeLen) break;
      v |= (c & 0xff) << (8 * count);
      bits += len;
      ++count;
    }
    multi[e] = count == 0 ? kNoCode : v | bits << 24 | count << 28;
  }
}

// Decodes kWays segments from `first` on, each of `count` symbols (the last segment of a plane may
// be shorter: it goes alone), segment first + w into out + w * seg. Makes `bad` non-zero on a
// prefix that is no code or a segment that reads past its words.
// Decodes symbols [i, count) of a segment into out, one at a time with the single table, reading
// words outside the segment as zeros; makes `bad` non-zero on a prefix that is no code or a read
// past the segment's words.
void DecodeRest(const TableEntry* table, const uint8_t* stream, Reader& r, uint8_t* out, uint32_t i,
                uint32_t count, uint32_t& bad) {
  if (i >= count) {
    bad |= r.bit > uint64_t{r.end} * 32;
    return;
  }
  // `v` holds `nb` valid bits at its top (the bits from r.bit on), refilled a word at a time.
  uint64_t v = SafeWindow(r, stream);
  int nb = 64 - static_cast<int>(r.bit & 31);
  uint64_t k = (r.bit >> 5) + 2;  // the next word to load
  uint64_t used = 0;
  for (; i < count; ++i) {
    if (nb < 32) {
      const uint64_t w = k < r.end ? Load32(stream + 4 * k) : 0;
      v |= w << (32 - nb);
      nb += 32;
      ++k;
    }
    const TableEntry e = table[v >> (64 - kMaxCodeLen)];
    const uint32_t len = e >> 8;
    bad |= len == 0;
    out[i] = static_cast<uint8_t>(e);
    v <<= len;
    nb -= static_cast<int>(len);
    used += len;
  }
  r.bit += used;
  bad |= r.bit > uint64_t{r.end} * 32;
}

template <int kWays>
void DecodeWays(const TableEntry* table, const uint32_t* multi, const uint8_t* stream,
                const uint8_t* offsets, uint32_t first, uint32_t seg, uint32_t count, uint8_t* out,
                uint32_t& bad) {
  Reader r[kWays];
  uint8_t* o[kWays];
  uint32_t i[kWays];
  for (int w = 0; w < kWays; ++w) {
    r[w].start = Load32(offsets + 4 * (first + w));
    r[w].end = Load32(offsets + 4 * (first + w + 1));
    r[w].bit = uint64_t{r[w].start} * 32;
    o[w] = out + static_cast<size_t>(w) * seg;
    i[w] = 0;
  }
  // A step: one window (>= 33 valid bits) feeds three lookups of <= 11 bits, <= 9 symbols, each
  // lookup's 4-byte store at most 3 bytes past them. Steps run in batches that every segment has
  // room for (12 more output bytes, both window words inside it), with no other branch.
  for (;;) {
    uint64_t steps = UINT64_MAX;
    for (int w = 0; w < kWays; ++w) {
      const uint64_t by_out = i[w] + 12 <= count ? (count - i[w] - 12) / 9 + 1 : 0;
      const uint64_t limit = r[w].end >= 1 ? uint64_t{r[w].end - 1} * 32 : 0;
      const uint64_t by_in = r[w].bit < limit ? (limit - r[w].bit - 1) / 33 + 1 : 0;
      steps = std::min(steps, std::min(by_out, by_in));
    }
    if (steps == 0) break;
    for (uint64_t k = 0; k < steps; ++k) {
      for (int w = 0; w < kWays; ++w) {
        uint64_t v = Window(r[w], stream);
        uint32_t flags = 0, bits = 0;
        for (int l = 0; l < 3; ++l) {
          const uint32_t e = multi[(v << bits) >> (64 - kMaxCodeLen)];
          memcpy(o[w] + i[w], &e, 4);
          i[w] += (e >> 28) & 3;
          bits += (e >> 24) & 15;
          flags |= e;
        }
        r[w].bit += bits;
        bad |= flags & kBadBit;
      }
    }
  }
  for (int w = 0; w < kWays; ++w) DecodeRest(table, stream, r[w], o[w], i[w], count, bad);
}

// A coded plane's decode tables.
struct Tables {
  TableEntry single[gpufmt::kTableSize];
  uint32_t multi[gpufmt::kTableSize];
};

// Decodes segments [first, last) of a coded plane of n symbols into out (segment first at out[0]).
// False if a segment uses a prefix that is no code or reads past its words.
bool DecodeSegments(const Tables& t, const uint8_t* stream, const uint8_t* offsets,
                    int segment_log2, uint32_t n, uint32_t first, uint32_t last, uint8_t* out) {
  const uint32_t seg = 1u << segment_log2;
  const uint32_t full = std::min(last, n >> segment_log2);  // segments of exactly `seg` symbols
  uint32_t bad = 0;
  uint32_t j = first;
  // Four segments at a time: four independent dependency chains (eight measure no faster).
  for (; j + 4 <= full; j += 4)
    DecodeWays<4>(t.single, t.multi, stream, offsets, j, seg, seg, out + size_t{j - first} * seg,
                  bad);
  for (; j < last; ++j)
    DecodeWays<1>(t.single, t.multi, stream, offsets, j, seg, std::min(seg, n - j * seg),
                  out + size_t{j - first} * seg, bad);
  return bad == 0;
}

// Decodes segments [first, last) of a coded plane as DecodeSegments does, with DecodeRest alone:
// for a range of a few segments (a page), where building the multi-symbol table (kTableSize
// entries of up to three lookups each) costs more than the decode itself.
bool DecodeSegmentsSingle(const TableEntry* table, const uint8_t* stream, const uint8_t* offsets,
                          int segment_log2, uint32_t n, uint32_t first, uint32_t last,
                          uint8_t* out) {
  const uint32_t seg = 1u << segment_log2;
  uint32_t bad = 0;
  for (uint32_t j = first; j < last; ++j) {
    Reader r;
    r.start = Load32(offsets + 4 * j);
    r.end = Load32(offsets + 4 * (j + 1));
    r.bit = uint64_t{r.start} * 32;
    DecodeRest(table, stream, r, out + size_t{j - first} * seg, 0, std::min(seg, n - j * seg), bad);
  }
  return bad == 0;
}

// A range of at most this many segments decodes with DecodeSegmentsSingle (one page of bf16 is
// eight segments of 256 elements).
constexpr uint32_t kSingleTableSegments = 32;

}  // namespace

size_t GpuMaxEncodedSize(size_t len) {
  return static_cast<size_t>(gpufmt::MaxEncodedSize(len));
}

Status EncodeGpu(const EncodePlan& plan, const uint8_t* src, size_t len, bool crc, uint8_t* dst,
                 size_t cap, size_t* out_len) {
  if (len == 0 || len > UINT32_MAX - 4096)
    return Status::Error(EINVAL, "codec: gpu format: chunks of 1 byte to 4 GiB - 4 KiB");
  if (cap < GpuMaxEncodedSize(len)) return Status::Error(EINVAL, "codec: output buffer too small");
  const int width = TransformWidth(plan.transform);
  const uint32_t n = static_cast<uint32_t>(len / width);
  const uint32_t tail = static_cast<uint32_t>(len - size_t{n} * width);
  const uint8_t* planes[kMaxPlanes];
  if (plan.transform == Transform::kNone) {
    planes[0] = src;
  } else {
    uint8_t* scratch = PlaneScratch(size_t{n} * width);
    if (!scratch) return Status::Error(ENOMEM, "codec: no memory for plane scratch");
    uint8_t* out[kMaxPlanes];
    for (int p = 0; p < width; ++p) planes[p] = out[p] = scratch + static_cast<size_t>(p) * n;
    SplitPlanes(plan.transform, src, n, out);
  }
  memset(dst, 0, gpufmt::kHeaderSize);
  dst[gpufmt::kOffVersion] = gpufmt::kVersion;
  dst[gpufmt::kOffTransform] = static_cast<uint8_t>(plan.transform);
  dst[gpufmt::kOffFlags] = crc ? gpufmt::kFlagCrc : 0;
  dst[gpufmt::kOffPlanes] = static_cast<uint8_t>(width);
  Store32(dst + gpufmt::kOffLen, static_cast<uint32_t>(len));
  if (crc) Store32(dst + gpufmt::kOffCrc, Crc32c(src, len));
  dst[gpufmt::kOffSegmentLog2] = gpufmt::kSegmentLog2;
  memcpy(dst + gpufmt::kOffTail, src + size_t{n} * width, tail);
  uint32_t pos = gpufmt::kHeaderSize;
  for (int p = 0; p < width; ++p) {
    const uint32_t off = Align16(pos);
    memset(dst + pos, 0, off - pos);
    uint8_t mode = gpufmt::kModeRaw, max_len = 0;
    uint16_t symbols = 0;
    uint32_t size = 0;
    if (plan.compress[p] && n > 0)
      size = EncodeHuffmanPlane(planes[p], n, dst + off, &max_len, &symbols);
    if (size > 0) {
      mode = gpufmt::kModeHuffman;
    } else {
      size = n;
      memcpy(dst + off, planes[p], n);
    }
    uint8_t* desc = dst + gpufmt::kOffPlaneDesc + gpufmt::kPlaneDescSize * p;
    Store32(desc, off);
    Store32(desc + 4, size);
    desc[8] = mode;
    desc[9] = max_len;
    desc[10] = static_cast<uint8_t>(symbols);
    desc[11] = static_cast<uint8_t>(symbols >> 8);
    pos = off + size;
  }
  *out_len = pos;
  return Status::Ok();
}

Status DecodeGpu(const uint8_t* e, size_t enc_len, uint8_t* dst, size_t len, bool streaming) {
  return DecodeGpuRange(e, enc_len, len, 0, len, dst, streaming);
}

Status DecodeGpuRange(const uint8_t* e, size_t enc_len, size_t len, size_t off, size_t count,
                      uint8_t* dst, bool streaming) {
  if (off > len || count > len - off)
    return Status::Error(EINVAL, "codec: range outside the chunk");
  if (enc_len < gpufmt::kHeaderSize) return Corrupt("encoding shorter than its header");
  if (e[gpufmt::kOffVersion] != gpufmt::kVersion) return Corrupt("not the gpu format");
  if (e[gpufmt::kOffTransform] >= kTransformCount) return Corrupt("unknown plane transform");
  if (e[gpufmt::kOffFlags] & ~gpufmt::kFlagCrc) return Corrupt("unknown header flags");
  const Transform transform = static_cast<Transform>(e[gpufmt::kOffTransform]);
  const int width = TransformWidth(transform);
  if (e[gpufmt::kOffPlanes] != width) return Corrupt("plane count does not match the transform");
  if (Load32(e + gpufmt::kOffLen) != len) return Corrupt("encoded length is not the chunk's");
  const int segment_log2 = e[gpufmt::kOffSegmentLog2];
  if (segment_log2 < gpufmt::kMinSegmentLog2 || segment_log2 > gpufmt::kMaxSegmentLog2)
    return Corrupt("segment size out of range");
  const uint32_t n = static_cast<uint32_t>(len / width);
  const uint32_t segments = gpufmt::SegmentCount(n, segment_log2);

  // Every descriptor, section and segment offset is checked before any plane is decoded.
  struct Plane {
    const uint8_t* section;
    uint8_t mode, max_len;
    uint16_t symbols;
    gpufmt::CodeSpec spec;
    gpufmt::HuffmanLayout layout;
  } planes[kMaxPlanes] = {};
  uint64_t pos = gpufmt::kHeaderSize;
  for (int p = 0; p < width; ++p) {
    const uint8_t* desc = e + gpufmt::kOffPlaneDesc + gpufmt::kPlaneDescSize * p;
    const uint32_t off = Load32(desc), size = Load32(desc + 4);
    Plane& pl = planes[p];
    pl.mode = desc[8];
    pl.max_len = desc[9];
    pl.symbols = static_cast<uint16_t>(desc[10] | desc[11] << 8);
    if (off != ((pos + gpufmt::kAlign - 1) & ~uint64_t{gpufmt::kAlign - 1}))
      return Corrupt("section not where the previous one ends");
    if (uint64_t{off} + size > enc_len) return Corrupt("section runs past the encoding");
    pl.section = e + off;
    if (pl.mode == gpufmt::kModeRaw) {
      if (size != n || pl.max_len != 0 || pl.symbols != 0) return Corrupt("raw plane malformed");
    } else if (pl.mode == gpufmt::kModeHuffman) {
      if (n == 0) return Corrupt("coded plane of no symbols");
      pl.layout = gpufmt::HuffmanLayoutOf(pl.symbols, segments);
      if (size < pl.layout.stream) return Corrupt("coded plane shorter than its tables");
      if (!gpufmt::ReadCodeSpec(pl.section, pl.max_len, pl.symbols, &pl.spec))
        return Corrupt("invalid Huffman code");
      const uint8_t* offsets = pl.section + pl.layout.offsets;
      if (Load32(offsets) != 0) return Corrupt("first segment does not start the stream");
      for (uint32_t j = 0; j < segments; ++j)
        if (Load32(offsets + 4 * j) > Load32(offsets + 4 * (j + 1)))
          return Corrupt("segment offsets decrease");
      if (uint64_t{Load32(offsets + 4 * segments)} * 4 != size - pl.layout.stream)
        return Corrupt("segment offsets do not end at the section's end");
    } else {
      return Corrupt("unknown plane mode");
    }
    pos = uint64_t{off} + size;
  }
  if (pos != enc_len) return Corrupt("sections do not end at the encoding's end");

  // A range decodes only the segments that hold its elements, and cannot check the checksum
  // (which covers the whole chunk).
  const bool whole = off == 0 && count == len;
  if (!whole && ((e[gpufmt::kOffFlags] & gpufmt::kFlagCrc) || off % width || count % width))
    return Status::Error(EINVAL,
                         "codec: gpu format: a range of a checksummed chunk or off elements");
  const uint32_t first_elem = static_cast<uint32_t>(std::min<size_t>(off / width, n));
  const uint32_t end_elem = static_cast<uint32_t>(std::min<size_t>((off + count) / width, n));

  // Planes are decoded a group of segments at a time into scratch that stays in the L1 cache,
  // and merged into dst from there; a coded plane of kNone decodes straight into dst (whole).
  const bool direct = whole && transform == Transform::kNone;
  constexpr uint32_t kGroup = 4;  // segments
  const uint32_t seg = 1u << segment_log2;
  uint8_t* scratch = nullptr;
  thread_local std::unique_ptr<Tables[]> t_tables;  // 48 KiB: not on the stack
  Tables* tables = nullptr;
  const uint32_t seg_first = first_elem >> segment_log2;
  const uint32_t seg_end = static_cast<uint32_t>((uint64_t{end_elem} + seg - 1) >> segment_log2);
  const bool single = seg_end - seg_first <= kSingleTableSegments && !whole;
  for (int p = 0; p < width; ++p) {
    if (planes[p].mode != gpufmt::kModeHuffman) continue;
    if (!tables) {
      if (!t_tables) t_tables.reset(new (std::nothrow) Tables[kMaxPlanes]);
      tables = t_tables.get();
      if (!tables || (!direct && !(scratch = PlaneScratch(size_t{kGroup} * seg * width))))
        return Status::Error(ENOMEM, "codec: no memory for decode tables or plane scratch");
    }
    BuildTable(planes[p].spec, planes[p].section + planes[p].layout.symbols, tables[p].single);
    if (!single) BuildMultiTable(tables[p].single, tables[p].multi);
  }
  for (uint32_t j = seg_first; j < seg_end; j += kGroup) {
    const uint32_t last = std::min(seg_end, j + kGroup);
    const uint32_t begin = j * seg, elems = std::min(n, last * seg) - begin;
    // The elements of this group that the range holds: [from, to).
    const uint32_t from = std::max(begin, first_elem), to = std::min(begin + elems, end_elem);
    const uint8_t* sources[kMaxPlanes];
    for (int p = 0; p < width; ++p) {
      const Plane& pl = planes[p];
      if (pl.mode == gpufmt::kModeRaw) {
        sources[p] = pl.section + from;
        continue;
      }
      uint8_t* out = direct ? dst + begin : scratch + static_cast<size_t>(p) * kGroup * seg;
      const uint8_t* stream = pl.section + pl.layout.stream;
      const uint8_t* offsets = pl.section + pl.layout.offsets;
      if (!(single ? DecodeSegmentsSingle(tables[p].single, stream, offsets, segment_log2, n, j,
                                          last, out)
                   : DecodeSegments(tables[p], stream, offsets, segment_log2, n, j, last, out)))
        return Corrupt("a segment does not decode within its words");
      sources[p] = out + (from - begin);
    }
    if (!direct || planes[0].mode == gpufmt::kModeRaw)
      MergePlanes(transform, sources, to - from, dst + (size_t{from} * width - off), streaming);
  }
  // The tail bytes (after the last whole element) that the range holds.
  const size_t tail_from = std::max(off, size_t{n} * width), tail_to = off + count;
  if (tail_to > tail_from)
    memcpy(dst + (tail_from - off), e + gpufmt::kOffTail + (tail_from - size_t{n} * width),
           tail_to - tail_from);
  if (whole && (e[gpufmt::kOffFlags] & gpufmt::kFlagCrc) &&
      Crc32c(dst, len) != Load32(e + gpufmt::kOffCrc))
    return Corrupt("checksum mismatch: the decoded chunk differs from the one encoded");
  return Status::Ok();
}

}  // namespace zrtier
