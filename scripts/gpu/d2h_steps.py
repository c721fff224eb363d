#!/usr/bin/env python3
"""D2H step by step, for the protection-change costs (docs/decisions.md, "Protection changes
batched per piece"). Run under
LD_PRELOAD=libzrtier.so (or without, for raw pinned-allocator numbers):

  ZRTIER_PINNED_POOL=3G ZRTIER_RESIDENT_LIMIT=8G LD_PRELOAD=... python3 scripts/gpu/d2h_steps.py 1024

One pinned buffer of SIZE_MIB: six D2H into it fresh (the first installs every chunk, write-
protected), two H2D, six D2H again (the first lands on chunks the H2D has just read), then six
cycles of a D2H followed by an H2D (offloaded activations). Prints GB/s per step and the publish
workers' time (zrtier's publish_ns counter); checks the bytes after the H2Ds.
"""
import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_copy import cycle_times  # noqa: E402

l = ctypes.CDLL(None)
try:
    l.zrtier_stat.argtypes = [ctypes.c_char_p]
    l.zrtier_stat.restype = ctypes.c_uint64

    def stat(k):
        return l.zrtier_stat(k.encode())
except AttributeError:
    def stat(k):
        return 0

size = int(sys.argv[1] if len(sys.argv) > 1 else 1024) << 20
n = size // 2
gpu = torch.randn(n, device="cuda", dtype=torch.float32).to(torch.bfloat16)
z = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)


def d2h(tag, k=6):
    for i in range(k):
        p0 = stat("publish_ns")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        z.copy_(gpu, non_blocking=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        pub = stat("publish_ns") - p0
        print(f"{tag} d2h#{i} {size / dt / 1e9:.1f} GB/s publish {pub / 1e6:.1f} ms "
              f"({pub / 1e3 / (size / 65536):.1f} us/chunk)", flush=True)


d2h("fresh")
g2 = torch.empty_like(gpu)
for _ in range(2):
    g2.copy_(z, non_blocking=True)
torch.cuda.synchronize()
assert torch.equal(g2, gpu), "H2D bytes differ"
d2h("after-h2d")
for i in range(6):
    td, th = cycle_times(z, gpu, g2)
    print(f"cycle#{i} d2h {size / td / 1e9:.1f} GB/s h2d {size / th / 1e9:.1f} GB/s "
          f"chunks_cleaned {stat('chunks_cleaned')}", flush=True)
    assert torch.equal(g2, gpu), "H2D bytes differ"
