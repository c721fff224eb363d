// What a block tier wrote, reached behind the store's back, for tests that corrupt it: a spill file
// (through /proc/self/fd: it has no name) or a zram device, and the checks that a corrupted entry
// fails every read loudly and never hands out wrong bytes.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/store/extent_store.h"

namespace zrtier::testing {

// The /proc/self/fd/<n> paths of the spill files this process holds open in `dir`.
std::vector<std::string> OpenSpillFiles(const std::string& dir);

// A file or block device opened read-write, with O_DIRECT where it allows it (so a store's O_DIRECT
// reads see every change at once; without it both share the page cache).
class BackingBytes {
 public:
  explicit BackingBytes(const std::string& path);
  ~BackingBytes();
  BackingBytes(const BackingBytes&) = delete;
  BackingBytes& operator=(const BackingBytes&) = delete;

  // False if `path` could not be opened; why() says why.
  bool ok() const { return fd_ >= 0; }
  const std::string& why() const { return why_; }

  // The offset of the first occurrence of `bytes` within the first `limit` bytes, or -1.
  int64_t Find(const std::vector<unsigned char>& bytes, uint64_t limit);
  // XORs `mask` into the byte at `off` (a read-modify-write of its 4 KiB block).
  bool Xor(uint64_t off, unsigned char mask);
  // Writes zeros over [off, off + len) (both multiples of 4 KiB).
  bool Zero(uint64_t off, uint64_t len);

 private:
  bool Io(bool write, uint64_t off, size_t len, unsigned char* buf);
  int fd_ = -1;
  std::string why_;
};

// Success if entry `h` of `s` (a `tier` store: "file", "zram") fails Get and GetBatch with
// EBADMSG whose message names the tier, the entry and its offset, and neither hands out a byte.
::testing::AssertionResult ReadFailsLoudly(ExtentStore* s, StoreHandle h, const char* tier);

// Puts one entry into `s` (a `tier` store) whose bytes live in `b`, then flips `flips` random bits
// (from `seed`) of it there, one at a time. Success if every flip makes every read fail
// (ReadFailsLoudly) and, with the bit flipped back, the entry reads back exactly; the message names
// the first flip missed.
::testing::AssertionResult EveryFlipCaught(ExtentStore* s, BackingBytes* b, const char* tier,
                                           int flips, uint64_t seed);

// The corruption scenario of a block tier `s` (a `tier` store) whose bytes live in `b`: three
// entries are put in one batch; one random bit (from `seed`) of the middle one is flipped, then,
// once that is undone, a 64 KiB-aligned block inside it is zeroed. Success if each time the middle
// entry fails every read loudly (ReadFailsLoudly, counted in checksum_errors), a batch of all three
// fails exactly that one, and the other two read back exactly.
::testing::AssertionResult CorruptionFailsLoudly(ExtentStore* s, BackingBytes* b, const char* tier,
                                                 uint64_t seed);

}  // namespace zrtier::testing
