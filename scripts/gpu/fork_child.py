#!/usr/bin/env python3
"""A forked child reads the pinned memory its parent filled by D2H copies.

Run with and without LD_PRELOAD=libzrtier.so (scripts/device-check.sh does both, also with small
limits so that the data sits in T0 slots, the compressed store or a spill file); exits 1 on the
first mismatch. What DataLoader workers and multiprocessing's fork start method do:
  1. D2H copies into pinned tensors, os.fork(); the parent then overwrites its tensors (D2H and CPU
     stores) before the child reads; the child (CPU only, no CUDA) returns a SHA-256 of each
     tensor through a pipe, compared with the parent's digest of its new bytes;
  2. the child writes into the tensors;
  3. a multiprocessing Pool with the fork start method hashes slices of a pinned tensor.
With --expect shared (the plain run): plain CUDA pinned memory is a shared mapping, so the child
reads the parent's later bytes and its writes reach the parent. zrtier (--expect first-touch, the
default): the child fetches each chunk from the parent at its first touch, so it reads the
parent's later bytes too, while its writes stay its own (runtime/engine/fork.h).
"""
import argparse
import hashlib
import multiprocessing
import os
import sys

import torch

N = 16 << 20  # int32 elements: 64 MiB per tensor, far above ZRTIER_MIN_ALLOC
COUNT = 4
_shared = None  # the Pool workers' tensor (inherited through fork)


def digest(t):
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def slice_digest(i):
    n = _shared.numel() // 8
    return digest(_shared[i * n:(i + 1) * n])


def main():
    global _shared
    ap = argparse.ArgumentParser()
    ap.add_argument("--expect", choices=("shared", "first-touch"), default="first-touch",
                    help="what the child should see: the parent's later bytes with writes shared "
                         "(plain pinned memory, a shared mapping), or the parent's later bytes "
                         "with writes of its own (zrtier)")
    shared = ap.parse_args().expect == "shared"
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(11)
    pinned = []
    for _ in range(COUNT):
        src = torch.randint(-2**31, 2**31 - 1, (N,), dtype=torch.int32, device=dev, generator=g)
        t = torch.empty(N, dtype=torch.int32).pin_memory()
        assert t.is_pinned()
        t.copy_(src, non_blocking=True)
        pinned.append(t)
    torch.cuda.synchronize()
    want = [digest(t) for t in pinned]
    ok = True

    # 1 and 2: the child reads after the parent has overwritten everything, then writes.
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        torch.set_num_threads(1)  # as DataLoader workers do: the parent's intra-op pool is not here
        os.close(go_w)
        os.close(res_r)
        os.read(go_r, 1)
        out = " ".join(digest(t) for t in pinned)
        for t in pinned:
            t.fill_(7)  # the child's own writes
        os.write(res_w, out.encode())
        os._exit(0)
    os.close(go_r)
    os.close(res_w)
    parent_now = []
    for t in pinned:
        t.copy_(torch.full((N,), 3, dtype=torch.int32, device=dev), non_blocking=True)
    torch.cuda.synchronize()
    for t in pinned:
        t[::4097] = -9
        parent_now.append(digest(t))
    os.write(go_w, b"x")
    got = b""
    while True:
        b = os.read(res_r, 1 << 16)
        if not b:
            break
        got += b
    _, status = os.waitpid(pid, 0)
    got = got.decode().split()
    if status != 0 or got != parent_now:
        print(f"fork child: MISMATCH (status {status}); child {got[:1]} want {parent_now[:1]}")
        ok = False
    else:
        print("fork child: read the parent's later bytes: ok")
    sevens = digest(torch.full((N,), 7, dtype=torch.int32))
    parent_after = [digest(t) for t in pinned]
    if parent_after != ([sevens] * COUNT if shared else parent_now):
        print("fork child: MISMATCH: the child's writes " + ("did not reach" if shared else "reached") + " the parent")
        ok = False
    else:
        print("fork child: the child's writes " + ("reached the parent (shared)" if shared else "stayed its own") + ": ok")

    # 3: multiprocessing with the fork start method.
    _shared = pinned[0]
    want_slices = [slice_digest(i) for i in range(8)]
    with multiprocessing.get_context("fork").Pool(2, initializer=torch.set_num_threads,
                                                  initargs=(1,)) as pool:
        got_slices = pool.map(slice_digest, range(8))
    if got_slices != want_slices:
        print("multiprocessing fork pool: MISMATCH")
        ok = False
    else:
        print("multiprocessing fork pool: ok")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
