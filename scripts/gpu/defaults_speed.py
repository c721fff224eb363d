#!/usr/bin/env python3
"""Raw copy speed and allocation cost of pinned memory, with zrtier's defaults or without zrtier:
a pinned host tensor of --gib GiB is allocated (timed), filled, copied to the GPU and back --iters
times (timed, GB/s) and checked byte for byte. Under LD_PRELOAD=libzrtier.so it also prints what
zrtier did (bytes pinned in place, direct copy bytes, budget) through libzrtier's control API.

    python3 defaults_speed.py --out plain.json
    LD_PRELOAD=libzrtier.so python3 defaults_speed.py --out zrtier.json
"""
import argparse
import ctypes
import json
import time


def zrtier_stats(names):
    try:
        lib = ctypes.CDLL(None)
        f = lib.zrtier_stat
    except (OSError, AttributeError):
        return {}
    f.restype = ctypes.c_uint64
    f.argtypes = [ctypes.c_char_p]
    return {n: int(f(n.encode())) for n in names}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch
    n = int(args.gib * (1 << 30))
    torch.cuda.init()
    t0 = time.perf_counter()
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    alloc_s = time.perf_counter() - t0
    assert host.is_pinned()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    host.copy_(src)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    res = {}
    for name, fn in (("h2d", lambda: dev.copy_(host, non_blocking=True)),
                     ("d2h", lambda: host.copy_(dev, non_blocking=True))):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        torch.cuda.synchronize()
        res[name + "_gbps"] = n * args.iters / (time.perf_counter() - t0) / 1e9
    ok = bool(torch.equal(host, src)) and bool(torch.equal(dev.cpu(), src))
    out = {"gib": args.gib, "alloc_s": alloc_s, "bytes_exact": ok, **res,
           "zrtier": zrtier_stats(["held_bytes", "h2d_direct_bytes", "d2h_direct_bytes",
                                   "memory_budget_bytes", "regions", "runs_pinned", "t0_bytes"])}
    print(json.dumps(out))
    if args.out:
        json.dump(out, open(args.out, "w"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
