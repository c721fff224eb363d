#!/usr/bin/env python3
"""Zero-copy access to pinned memory: kernels read and write it through its device pointer.

Run with and without LD_PRELOAD=libzrtier.so (scripts/device-check.sh does both); exits 1 on the
first mismatch or error. The pattern of vLLM's CPU offload: cudaHostGetDevicePointer of a pinned
tensor, a CUDA tensor over that address (here through __cuda_array_interface__), kernels that
read it (a product into device memory) and write it (an in-place add), and the CPU reading the
kernels' writes. Every result is compared bit for bit (int32) with the same arithmetic on the CPU.
Under a memory budget below the buffers (device-check's third run) the pages may have been
unpinned and compressed before: the device pointer pins them again, for good.
"""
import ctypes
import sys

import torch

from cudart import cudart

N = 16 << 20  # int32 elements: 64 MiB per buffer, far above ZRTIER_MIN_ALLOC


class View:
    """A CUDA array of n int32 at device address `ptr`."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<i4", "data": (ptr, False),
                                         "version": 3, "strides": None}


def main():
    torch.cuda.init()
    rt = cudart("cudaHostGetDevicePointer")
    g = torch.Generator().manual_seed(5)
    other = torch.randint(-1000, 1000, (N,), dtype=torch.int32, generator=g).pin_memory()
    host = torch.randint(-1000, 1000, (N,), dtype=torch.int32, generator=g).pin_memory()
    ref = host.clone()
    dev = ctypes.c_void_p()
    err = rt.cudaHostGetDevicePointer(ctypes.byref(dev), ctypes.c_void_p(host.data_ptr()), 0)
    if err != 0:
        print(f"cudaHostGetDevicePointer failed: error {err}")
        return 1
    view = torch.as_tensor(View(dev.value, N), device="cuda")
    ok = True
    doubled = (view * 2).cpu()  # a kernel reads the pinned pages
    if not torch.equal(doubled, ref * 2):
        print("kernel read: MISMATCH")
        ok = False
    else:
        print("kernel read: ok")
    for step in range(3):
        view.add_(step + 1)  # a kernel writes them
        torch.cuda.synchronize()
        ref += step + 1
        if not torch.equal(host, ref):
            bad = (host != ref).nonzero()
            print(f"kernel write {step}: MISMATCH at {bad.numel()} elements")
            ok = False
        else:
            print(f"kernel write {step}: ok")
        host.add_(1)  # the CPU writes between kernels
        ref += 1
    if not torch.equal((view - 0).cpu(), ref):
        print("kernel read after CPU writes: MISMATCH")
        ok = False
    # The other buffer still copies as usual.
    if not torch.equal(other.cuda().cpu(), other):
        print("copy of another pinned buffer: MISMATCH")
        ok = False
    print("zero_copy:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
