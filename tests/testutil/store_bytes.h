// Helpers of the store tests: entry contents, entries put and remembered with their bytes, an entry
// read back and checked against the bytes it was put with, and batches of a block tier
// (ExtentStore) put and read back. The checks return an AssertionResult whose message says which
// entry failed and how, for EXPECT_TRUE / ASSERT_TRUE at the call site.
#pragma once

#include <gtest/gtest.h>

#include <numeric>
#include <utility>
#include <vector>

#include "runtime/store/extent_store.h"
#include "runtime/store/store.h"
#include "tests/testutil/sample_bytes.h"

namespace zrtier::testing {

// An entry's contents: `n` bytes of sample kind `kind` (incompressible by default) from `seed`,
// the same bytes for the same arguments.
inline std::vector<unsigned char> EntryBytes(size_t n, uint64_t seed,
                                             SampleKind kind = SampleKind::kRandom) {
  return SampleBytes(kind, n, seed);
}

// Entries of a store and the bytes each was put with.
using Entries = std::vector<std::pair<StoreHandle, std::vector<unsigned char>>>;

// Copies entry `h` of `s` into *out.
inline Status ReadInto(ChunkStore* s, StoreHandle h, std::vector<unsigned char>* out) {
  return s->Get(h, [&](const void* p, size_t n) {
    out->assign(static_cast<const unsigned char*>(p), static_cast<const unsigned char*>(p) + n);
    return Status::Ok();
  });
}

// Success if the bytes `got` are `want`; else the lengths and the first byte that differs.
inline ::testing::AssertionResult SameBytes(const std::vector<unsigned char>& got,
                                            const std::vector<unsigned char>& want) {
  if (got == want) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return ::testing::AssertionFailure()
         << got.size() << " bytes read, " << want.size() << " put; they differ from byte " << i;
}

// Success if entry `h` of `s` reads back (Get succeeds) as exactly the bytes `want`.
inline ::testing::AssertionResult ReadsBack(ChunkStore* s, StoreHandle h,
                                            const std::vector<unsigned char>& want) {
  std::vector<unsigned char> got;
  Status st = ReadInto(s, h, &got);
  if (!st.ok())
    return ::testing::AssertionFailure() << "Get of entry " << h << ": " << st.ToString();
  return SameBytes(got, want) << " (entry " << h << ")";
}

// Puts `d` into `s` (standing for `raw_len` original bytes) and, on success, appends the entry to
// *items; a failure carries the Put's status.
inline ::testing::AssertionResult PutEntry(ChunkStore* s, std::vector<unsigned char> d,
                                           uint64_t raw_len, Entries* items) {
  StoreHandle h = 0;
  Status st = s->Put(d.data(), d.size(), raw_len, &h);
  if (!st.ok()) return ::testing::AssertionFailure() << "Put: " << st.ToString();
  items->emplace_back(h, std::move(d));
  return ::testing::AssertionSuccess();
}

// One PutReq per element of `data` (each standing for `raw_len` original bytes), for PutBatch.
inline std::vector<ExtentStore::PutReq> PutReqs(const std::vector<std::vector<unsigned char>>& data,
                                                uint64_t raw_len = 65536) {
  std::vector<ExtentStore::PutReq> puts(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    puts[i].data = data[i].data();
    puts[i].len = data[i].size();
    puts[i].raw_len = raw_len;
  }
  return puts;
}

// Puts `data` in one PutBatch (PutReqs) and returns the handles, in the order of `data`; adds a
// test failure for every request that failed (its handle is then 0).
inline std::vector<StoreHandle> PutAll(ExtentStore* s,
                                       const std::vector<std::vector<unsigned char>>& data,
                                       uint64_t raw_len = 65536) {
  std::vector<ExtentStore::PutReq> puts = PutReqs(data, raw_len);
  s->PutBatch(puts.data(), puts.size());
  std::vector<StoreHandle> hs;
  for (auto& p : puts) {
    EXPECT_TRUE(p.status.ok()) << p.status.ToString();
    hs.push_back(p.status.ok() ? p.out : 0);
  }
  return hs;
}

// One GetReq per handle of `hs`, reading entry hs[k] into (*out)[k]; *out is resized to hs.size()
// and must outlive the requests.
inline std::vector<ExtentStore::GetReq> GetReqs(const std::vector<StoreHandle>& hs,
                                                std::vector<std::vector<unsigned char>>* out) {
  out->assign(hs.size(), {});
  std::vector<ExtentStore::GetReq> gets(hs.size());
  for (size_t k = 0; k < hs.size(); ++k) {
    gets[k].h = hs[k];
    gets[k].out = &(*out)[k];
  }
  return gets;
}

// Reads the entries hs[i] for i in `order`, in that order, in one GetBatch (and nothing else of
// `s`); success if every request succeeds and entry hs[i] delivers exactly data[i]. The message
// names the first entry that failed.
inline ::testing::AssertionResult BatchReadsBack(
    ExtentStore* s, const std::vector<StoreHandle>& hs,
    const std::vector<std::vector<unsigned char>>& data, const std::vector<size_t>& order) {
  std::vector<StoreHandle> batch;
  for (size_t i : order) batch.push_back(hs[i]);
  std::vector<std::vector<unsigned char>> got;
  std::vector<ExtentStore::GetReq> gets = GetReqs(batch, &got);
  s->GetBatch(gets.data(), gets.size());
  for (size_t k = 0; k < order.size(); ++k) {
    if (!gets[k].status.ok())
      return ::testing::AssertionFailure()
             << "entry " << order[k] << ": " << gets[k].status.ToString();
    ::testing::AssertionResult same = SameBytes(got[k], data[order[k]]);
    if (!same) return same << " (entry " << order[k] << ")";
  }
  return ::testing::AssertionSuccess();
}

// BatchReadsBack of every entry, in the order of `hs`.
inline ::testing::AssertionResult BatchReadsBack(
    ExtentStore* s, const std::vector<StoreHandle>& hs,
    const std::vector<std::vector<unsigned char>>& data) {
  std::vector<size_t> order(hs.size());
  std::iota(order.begin(), order.end(), 0);
  return BatchReadsBack(s, hs, data, order);
}

}  // namespace zrtier::testing
