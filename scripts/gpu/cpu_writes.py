#!/usr/bin/env python3
"""CPU stores into pinned buffers between copies must reach the GPU.

Run with and without LD_PRELOAD=libzrtier.so (scripts/device-check.sh does both); exits 1 on the
first mismatch. Three patterns that reuse one pinned buffer:
  1. a D2H into the buffer, an in-place CPU update, an H2D back (an offloaded optimizer step, as
     in ZeRO-Offload: gradients come down, the CPU updates, parameters go up);
  2. CPU fill, H2D, CPU update in place, H2D again (a staging buffer rewritten per batch);
  3. pattern 1 repeated for several steps on the same buffers.
Each result is compared bit for bit with the same CPU operations on pageable memory.
"""
import sys

import torch

N = 16 << 20  # int32 elements: 64 MiB per buffer, far above ZRTIER_MIN_ALLOC


def check(name, got, want):
    if torch.equal(got.cpu(), want):
        print(f"{name}: ok")
        return True
    bad = (got.cpu() != want).nonzero()
    print(f"{name}: MISMATCH at {bad.numel()} elements, first {bad[:5].flatten().tolist()}")
    return False


def main():
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(7)
    ok = True

    # 1. D2H, CPU update in place, H2D.
    grads_gpu = torch.randint(-1000, 1000, (N,), dtype=torch.int32, generator=g).to(dev)
    params_ref = torch.randint(-1000, 1000, (N,), dtype=torch.int32, generator=g)
    params = params_ref.clone().pin_memory()
    grads = torch.empty(N, dtype=torch.int32).pin_memory()
    assert params.is_pinned() and grads.is_pinned()
    grads.copy_(grads_gpu, non_blocking=True)
    torch.cuda.synchronize()
    params.sub_(grads)
    params_ref.sub_(grads_gpu.cpu())
    ok &= check("d2h, cpu update, h2d", params.to(dev, non_blocking=True), params_ref)

    # 2. CPU fill, H2D, CPU update, H2D.
    stage = torch.empty(N, dtype=torch.int32).pin_memory()
    ref = torch.arange(N, dtype=torch.int32)
    stage.copy_(ref)
    ok &= check("cpu fill, h2d", stage.to(dev, non_blocking=True), ref)
    stage.mul_(3)
    ref.mul_(3)
    ok &= check("cpu update, h2d again", stage.to(dev, non_blocking=True), ref)
    stage[::4097] = -5  # a store to every few pages only
    ref[::4097] = -5
    ok &= check("sparse cpu stores, h2d again", stage.to(dev, non_blocking=True), ref)

    # 3. Several offloaded steps on the same buffers.
    for step in range(5):
        grads_gpu = (grads_gpu * 3 + step) % 2001 - 1000
        grads.copy_(grads_gpu, non_blocking=True)
        torch.cuda.synchronize()
        params.sub_(grads)
        params_ref.sub_(grads_gpu.cpu())
        up = params.to(dev, non_blocking=True)
        ok &= check(f"step {step}", up, params_ref)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
