#!/usr/bin/env python3
"""Copies of pinned memory captured in a CUDA graph must replay with the bytes of each replay.

Run with and without LD_PRELOAD=libzrtier.so (scripts/device-check.sh does both); exits 1 on the
first mismatch or error. torch.cuda.graph (the global capture mode, PyTorch's default) captures a
step that copies a pinned input to the GPU, computes on it and copies the result back into a
pinned output, both non_blocking; the graph is then replayed with new input bytes written by the
CPU each time, and every output is compared bit for bit with the same computation done eagerly. Under a memory
budget below the buffers (device-check's second zrtier run) the pages may be unpinned and
compressed before the capture: the captured copies pin them again.
"""
import sys

import torch

N = 16 << 20  # float32 elements: 64 MiB per buffer, far above ZRTIER_MIN_ALLOC
REPLAYS = 5


def main():
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(11)
    inp = torch.empty(N, dtype=torch.float32).pin_memory()
    out = torch.empty(N, dtype=torch.float32).pin_memory()
    assert inp.is_pinned() and out.is_pinned()
    static = torch.empty(N, dtype=torch.float32, device=dev)
    weight = torch.randn(N, generator=g).to(dev)

    def step():
        static.copy_(inp, non_blocking=True)
        y = static * weight + 1.0
        out.copy_(y, non_blocking=True)

    # Warm up on a side stream, as PyTorch asks before a capture.
    inp.copy_(torch.randn(N, generator=g))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except RuntimeError as e:
        print(f"capture failed: {e}")
        return 1
    ok = True
    for r in range(REPLAYS):
        x = torch.randn(N, generator=g)
        inp.copy_(x)  # CPU stores into the pinned input between replays
        graph.replay()
        torch.cuda.synchronize()
        want = (x.to(dev) * weight + 1.0).cpu()
        if not torch.equal(out, want):
            bad = (out != want).nonzero()
            print(f"replay {r}: MISMATCH at {bad.numel()} elements, first {bad[:5].flatten().tolist()}")
            ok = False
        else:
            print(f"replay {r}: ok")

    print("graph_capture:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
