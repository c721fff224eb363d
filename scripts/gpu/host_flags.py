#!/usr/bin/env python3
"""cudaHostGetFlags on pinned memory: zrtier's regions answer as the driver does.

Run with and without LD_PRELOAD=libzrtier.so (scripts/device-check.sh does both); exits 1 on a
difference. For each way of allocating pinned memory (cudaMallocHost, cudaHostAlloc with flags 0
and cudaHostAllocPortable) it asks cudaHostGetFlags of a 64 MiB allocation (a zrtier region under
LD_PRELOAD), at its start and in its middle, and requires success with the flags asked for and
cudaHostAllocMapped (the driver maps every allocation of its own under unified addressing: the
plain run checks that rule against the driver). A 4 KiB allocation's answer is printed beside it:
the driver carves small allocations from shared blocks and answers with the block's flags.
"""
import ctypes
import sys

import torch

from cudart import cudart

MAPPED = 2  # cudaHostAllocMapped


def main():
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the runtime's context
    rt = cudart("cudaHostGetFlags")
    ok = True
    ways = [("cudaMallocHost", None), ("cudaHostAlloc(0)", 0), ("cudaHostAlloc(Portable)", 1)]
    for name, flags in ways:
        answers = []
        for size in (4096, 64 << 20):
            p = ctypes.c_void_p()
            if flags is None:
                err = rt.cudaMallocHost(ctypes.byref(p), ctypes.c_size_t(size))
            else:
                err = rt.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), ctypes.c_uint(flags))
            if err != 0:
                print(f"{name} of {size} bytes failed: error {err}")
                return 1
            for off in (0, size // 2):
                got = ctypes.c_uint(12345)
                e = rt.cudaHostGetFlags(ctypes.byref(got), ctypes.c_void_p(p.value + off))
                answers.append((size, off, e, got.value if e == 0 else None))
            rt.cudaFreeHost(p)
        print(f"{name}: " + ", ".join(f"{s} B at +{o}: error {e} flags {f}" for s, o, e, f in answers))
        want = (0, (flags or 0) | MAPPED)
        if any((e, f) != want for s, _, e, f in answers if s > 4096):
            print(f"{name}: the 64 MiB allocation's answer is not error 0 flags {want[1]}")
            ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
