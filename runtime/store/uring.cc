// The io_uring wrapper (see uring.h).
#include "runtime/store/uring.h"

#include <cstring>

#include "runtime/base/log.h"

namespace zrtier {

Uring::~Uring() {
  if (ok_) io_uring_queue_exit(&ring_);
}

Status Uring::Init(unsigned entries, Os* os) {
  std::lock_guard<std::mutex> lock(mu_);
  os_ = os;
  entries_ = entries;
  long r = os_->IoUringQueueInit(entries, &ring_, 0);
  if (r < 0)
    return Status::Error(static_cast<int>(-r),
                         std::string("io_uring_queue_init: ") + strerror(static_cast<int>(-r)));
  ok_ = true;
  return Status::Ok();
}

bool Uring::RegisterBuffers(const struct iovec* iov, unsigned n) {
  std::lock_guard<std::mutex> lock(mu_);
  iovs_.assign(iov, iov + n);
  fixed_ = ok_ && io_uring_register_buffers(&ring_, iov, n) == 0;
  return fixed_;
}

bool Uring::Rebuild() {
  // Ops that a failed submission left in the submission queue must never reach the kernel later,
  // so the ring is thrown away. The buffers outlive the ring (they belong to the caller).
  if (ok_) io_uring_queue_exit(&ring_);
  ok_ = false;
  memset(&ring_, 0, sizeof(ring_));
  if (os_->IoUringQueueInit(entries_, &ring_, 0) < 0) return false;
  ok_ = true;
  if (fixed_) fixed_ = io_uring_register_buffers(&ring_, iovs_.data(), iovs_.size()) == 0;
  return true;
}

void Uring::Run(Op* ops, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  RunLocked(ops, n);
  // Short transfers (POSIX allows them; the kernel may cut an O_DIRECT transfer short): the rest
  // is submitted again, a few rounds. No progress, or still short after that, is -EIO.
  for (int round = 0; round < kShortRounds; ++round) {
    std::vector<Op> rest;
    std::vector<size_t> from;
    for (size_t i = 0; i < n; ++i) {
      const Op& op = ops[i];
      if (op.res <= 0 || static_cast<uint64_t>(op.res) >= op.len) continue;
      Op r = op;
      r.buf = static_cast<char*>(op.buf) + op.res;
      r.off = op.off + static_cast<uint64_t>(op.res);
      r.len = op.len - static_cast<uint32_t>(op.res);
      rest.push_back(r);
      from.push_back(i);
    }
    if (rest.empty()) break;
    RunLocked(rest.data(), rest.size());
    for (size_t k = 0; k < rest.size(); ++k)
      ops[from[k]].res = rest[k].res < 0 ? rest[k].res : ops[from[k]].res + rest[k].res;
  }
  for (size_t i = 0; i < n; ++i)
    if (ops[i].res >= 0 && static_cast<uint64_t>(ops[i].res) < ops[i].len) ops[i].res = -EIO;
}

void Uring::RunLocked(Op* ops, size_t n) {
  for (size_t start = 0; start < n; start += entries_) {
    size_t count = std::min<size_t>(entries_, n - start);
    if (!ok_ && !Rebuild()) {
      for (size_t i = start; i < start + count; ++i) ops[i].res = -EIO;
      continue;
    }
    for (size_t i = start; i < start + count; ++i) {
      Op& op = ops[i];
      op.res = 0;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // never null: count <= entries, queue empty
      bool fixed = fixed_ && op.buf_index >= 0;
      if (op.write) {
        if (fixed)
          io_uring_prep_write_fixed(sqe, op.fd, op.buf, op.len, op.off, op.buf_index);
        else
          io_uring_prep_write(sqe, op.fd, op.buf, op.len, op.off);
      } else {
        if (fixed)
          io_uring_prep_read_fixed(sqe, op.fd, op.buf, op.len, op.off, op.buf_index);
        else
          io_uring_prep_read(sqe, op.fd, op.buf, op.len, op.off);
      }
      io_uring_sqe_set_data64(sqe, i);
    }
    long r = os_->IoUringSubmitAndWait(&ring_, static_cast<unsigned>(count));
    if (r < 0) {
      for (size_t i = start; i < start + count; ++i) ops[i].res = r;
      Rebuild();
      continue;
    }
    for (size_t done = 0; done < count; ++done) {
      io_uring_cqe* cqe = nullptr;
      int w;
      do {
        w = io_uring_wait_cqe(&ring_, &cqe);
      } while (w == -EINTR || w == -EAGAIN);
      if (w < 0 || !cqe) {  // cannot happen with a healthy ring; fail the rest
        for (size_t i = start; i < start + count; ++i)
          if (ops[i].res == 0) ops[i].res = -EIO;
        Rebuild();
        break;
      }
      uint64_t i = io_uring_cqe_get_data64(cqe);
      long res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (i < start || i >= start + count) continue;
      ops[i].res = res;
    }
  }
}

}  // namespace zrtier
