#!/usr/bin/env python3
"""Copy-bandwidth benchmark for scripts/bench-gpu.sh. Run under LD_PRELOAD=libzrtier.so; every
case is measured in the same process, so ratios to raw pinned memory are within one run; the
zrtier T0/T1/T2 copies are each paired with a raw pinned copy timed in the same iterations
("raw_gbps"), the baseline of their ratio.

  copy mode   : H2D and D2H GB/s of one SIZE copy: raw pinned (cudaHostRegister'd, which zrtier
                passes through), pageable, and zrtier regions with the data in T0 (pool hit),
                T1 (resident pages) and T2 (compressed); and zrtier_cycle, a D2H then an H2D of
                the same buffer, repeated (offloaded activations: save_on_cpu).
  offload mode: COUNT synchronous D2H copies of SIZE into pinned buffers, then H2D back in reverse
                order (save_on_cpu's pattern), PASSES times, under the caller's ZRTIER_MEMORY;
                each copy paired with the same copy to or from a raw pinned buffer.
  stream mode : cyclic streaming of TOTAL bytes of bf16 layers (LAYER bytes each) host->GPU, as
                offloaded inference does, from raw pinned memory and from zrtier regions; the pool
                size is set by the caller (ZRTIER_PINNED_POOL). Each zrtier pass is paired with
                a raw pinned pass over the same bytes just ahead of it ("raw_gbps";
                "paired_ratio": the steady raw passes' time over the steady zrtier passes').
                Reports the prefetch hit ratio.

Prints one JSON object per line: {"mode", "case", "dir", "bytes", "gbps", ...}.
The control calls (zrtier_evict_range, zrtier_t0_drop, zrtier_stat) are exported by libzrtier.so.
"""
import argparse
import ctypes
import json
import os
import time

import torch

dev = torch.device("cuda")


def lib():
    try:
        l = ctypes.CDLL(None)
        l.zrtier_evict_range.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        l.zrtier_t0_drop.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        l.zrtier_stat.argtypes = [ctypes.c_char_p]
        l.zrtier_stat.restype = ctypes.c_uint64
        return l
    except (OSError, AttributeError):
        return None


ZR = lib()


def stat(name):
    return ZR.zrtier_stat(name.encode()) if ZR else 0


# Where a copy call's time goes (zrtier counters, microseconds per copy).
PROFILE = (
    "copy_ns", "copy_plan_ns", "copy_issue_ns", "copy_wait_ns", "fill_ns", "decode_ns", "publish_ns",
    "copy_stall_ns")


def profile_since(before, iters):
    return {k[:-3] + "_us": round((stat(k) - before[k]) / iters / 1e3, 1) for k in PROFILE} if ZR else {}


def profile_now():
    return {k: stat(k) for k in PROFILE}


def thread_cpu():
    """CPU seconds (user + system) of each thread of this process now: {tid: (name, seconds)}.
    Names lose their trailing digits, so that a pool of workers ("zr-fill0", "zr-fill1") is one."""
    out, tck = {}, os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            name = open(f"/proc/self/task/{tid}/comm").read().strip().rstrip("0123456789")
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[tid] = (name, (int(f[11]) + int(f[12])) / tck)
    return out


class CpuMeter:
    """The process's CPU time spent inside timed calls (CLOCK_PROCESS_CPUTIME_ID: every thread,
    zrtier's workers included) and its split by thread name, summed over the calls measured."""

    def __init__(self):
        self.total, self.by_name = 0.0, {}

    def __enter__(self):
        self.t0, self.th0 = time.process_time(), thread_cpu()
        return self

    def __exit__(self, *exc):
        self.total += time.process_time() - self.t0
        for tid, (name, s) in thread_cpu().items():
            d = s - self.th0.get(tid, (name, 0.0))[1]
            if d > 0:
                self.by_name[name] = self.by_name.get(name, 0.0) + d

    def report(self, nbytes):
        """CPU ms per GiB of `nbytes` copied, and the largest shares by thread name (seconds)."""
        top = sorted(self.by_name.items(), key=lambda kv: -kv[1])[:8]
        return {"cpu_ms_per_gib": round(self.total * 1e3 / (nbytes / (1 << 30)), 1),
                "thread_cpu_s": {k: round(v, 2) for k, v in top}}


def bf16_fill(t, seed):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    n = t.numel()
    step = 1 << 26
    for i in range(0, n, step):
        m = min(step, n - i)
        t.view(-1)[i:i + m].copy_((torch.randn(m, generator=g, device=dev) * 0.02).to(torch.bfloat16))
    torch.cuda.synchronize()


def raw_pinned(n):
    t = torch.empty(n, dtype=torch.bfloat16)  # pageable
    err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * 2, 0)
    assert int(err) == 0, f"cudaHostRegister failed: {err}"
    return t


def unregister(t):
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def once(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def median(ts):
    ts = sorted(ts)
    return ts[len(ts) // 2]


def timed(fn, iters, before=None, paired=None, meter=None):
    """Median seconds of fn over iters calls (before() runs untimed ahead of each). With paired,
    also the median of paired() timed in the same iterations, just ahead of fn: the baseline sees
    the same state of the machine (clocks, link, other tenants) as the copy it is compared with,
    where a baseline measured once before all cases moved the T0 ratios of one library by up to
    0.07 between runs (docs/decisions.md, "Paired baselines and ten stream passes")."""
    zs, ps = [], []
    for _ in range(iters):
        if paired:
            ps.append(once(paired))
        if before:
            before()
        if meter:
            torch.cuda.synchronize()
            with meter:
                zs.append(once(fn))
        else:
            zs.append(once(fn))
    return median(zs), (median(ps) if paired else None)


def cycle_times(host, gpu, gpu2):
    """A D2H of `gpu` into `host`, then an H2D of `host` into `gpu2`: the seconds of each."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host.copy_(gpu, non_blocking=True)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    gpu2.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return t1 - t0, time.perf_counter() - t1


def emit(**kw):
    print(json.dumps(kw), flush=True)


def copy_mode(size, iters):
    n = size // 2
    gpu = torch.empty(n, dtype=torch.bfloat16, device=dev)
    bf16_fill(gpu, 1)
    ref = gpu.clone()

    def paired_kw(t_raw):
        # The raw pinned copy timed in the same iterations (zrtier cases): the table's "x raw".
        return {"raw_gbps": size / t_raw / 1e9} if t_raw else {}

    def bench(case, host, before=None, check=True, paired=False):
        host.copy_(gpu)  # D2H fill (also exercises the D2H path)
        torch.cuda.synchronize()
        d0, p0 = stat("h2d_dma_ops"), profile_now()
        t, t_raw = timed(lambda: gpu2.copy_(host, non_blocking=True), iters, before,
                         (lambda: gpu2.copy_(r, non_blocking=True)) if paired else None)
        dmas = (stat("h2d_dma_ops") - d0) / iters
        if check:
            assert torch.equal(gpu2, ref), f"{case}: H2D bytes differ"
        emit(mode="copy", case=case, dir="h2d", bytes=size, gbps=size / t / 1e9, dmas_per_copy=dmas,
             **paired_kw(t_raw), **profile_since(p0, iters))
        d0, p0 = stat("d2h_dma_ops"), profile_now()
        t, t_raw = timed(lambda: host.copy_(gpu, non_blocking=True), iters, None,
                         (lambda: r.copy_(gpu, non_blocking=True)) if paired else None)
        prof = profile_since(p0, iters)
        dmas = (stat("d2h_dma_ops") - d0) / iters
        torch.cuda.synchronize()
        gpu2.zero_()
        gpu2.copy_(host)
        if check:
            assert torch.equal(gpu2, ref), f"{case}: D2H bytes differ"
        emit(mode="copy", case=case, dir="d2h", bytes=size, gbps=size / t / 1e9, dmas_per_copy=dmas,
             **paired_kw(t_raw), **prof)

    gpu2 = torch.empty_like(gpu)
    r = raw_pinned(n)  # kept registered: the zrtier cases time a raw copy beside each of theirs
    bench("raw_pinned", r)
    bench("pageable", torch.empty(n, dtype=torch.bfloat16))
    if ZR is None:
        unregister(r)
        return
    z = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    assert z.is_pinned()
    ptr, nbytes = z.data_ptr(), size
    bench("zrtier_t0", z, paired=True)
    bench("zrtier_t1", z, before=lambda: ZR.zrtier_t0_drop(ptr, nbytes), paired=True)
    z.copy_(gpu)
    torch.cuda.synchronize()

    def to_t2():
        ZR.zrtier_t0_drop(ptr, nbytes)
        rc = ZR.zrtier_evict_range(ptr, nbytes)
        assert rc == 0, f"zrtier_evict_range failed: {rc}"

    d0, p0, meter = stat("h2d_dma_ops"), profile_now(), CpuMeter()
    t, t_raw = timed(lambda: gpu2.copy_(z, non_blocking=True), iters, to_t2,
                     lambda: gpu2.copy_(r, non_blocking=True), meter)
    dmas = (stat("h2d_dma_ops") - d0) / iters
    assert torch.equal(gpu2, ref), "zrtier_t2: H2D bytes differ"
    # CPU time of the timed copies alone (not the evictions between them that store the data).
    emit(mode="copy", case="zrtier_t2", dir="h2d", bytes=size, gbps=size / t / 1e9, dmas_per_copy=dmas,
         **paired_kw(t_raw), **profile_since(p0, iters), **meter.report(size * iters))

    # The save_on_cpu cycle: each iteration a D2H into the buffer, then an H2D back from it, so
    # every D2H lands on chunks an H2D has just read and every H2D reads chunks a D2H has just
    # written (medians of the iterations, each direction on its own).
    p0, td, th = profile_now(), [], []
    for _ in range(iters):
        d, h = cycle_times(z, gpu, gpu2)
        td.append(d)
        th.append(h)
        assert torch.equal(gpu2, ref), "zrtier_cycle: bytes differ"
    prof = profile_since(p0, iters)
    for d, ts in (("d2h", td), ("h2d", th)):
        ts.sort()
        emit(mode="copy", case="zrtier_cycle", dir=d, bytes=size, gbps=size / ts[len(ts) // 2] / 1e9,
             **prof)
    unregister(r)


def offload_mode(count, size, passes):
    """Offloaded activations under a memory budget set by the caller (ZRTIER_MEMORY below the
    data): each pass copies COUNT device tensors of SIZE bf16 bytes into as many pinned buffers
    (synchronous D2H, as save_on_cpu saves them), then back in reverse order (H2D); every copy is
    paired with the same copy to or from one raw pinned buffer just ahead of it. Per pass: the
    median copy's GB/s each way and its ratio to the paired raw copies; the bytes are checked on
    the last pass."""
    n = size // 2
    src = []
    for i in range(count):
        t = torch.empty(n, dtype=torch.bfloat16, device=dev)
        bf16_fill(t, 100 + i)
        src.append(t)
    host = [torch.empty(n, dtype=torch.bfloat16, pin_memory=True) for _ in range(count)]
    back = torch.empty(n, dtype=torch.bfloat16, device=dev)
    r = raw_pinned(n)
    for p in range(passes):
        d, dr, h, hr = [], [], [], []
        before = {k: stat(k) for k in ("d2h_gpu_encoded_bytes", "bytes_encoded")}
        for i in range(count):
            dr.append(once(lambda: r.copy_(src[i])))
            d.append(once(lambda: host[i].copy_(src[i])))
        ok = True
        for i in reversed(range(count)):
            hr.append(once(lambda: back.copy_(r, non_blocking=True)))
            h.append(once(lambda: back.copy_(host[i], non_blocking=True)))
            if p == passes - 1:
                ok = ok and torch.equal(back, src[i])
        assert ok, "offload: bytes differ"
        moved = {k + "_per_pass": stat(k) - v for k, v in before.items()}
        for dirn, zs, rs in (("d2h", d, dr), ("h2d", h, hr)):
            emit(mode="offload", case="zrtier" if ZR else "plain", dir=dirn, bytes=size, count=count,
                 pass_no=p, gbps=size / median(zs) / 1e9, raw_gbps=size / median(rs) / 1e9,
                 ratio=median(rs) / median(zs), **moved)
    unregister(r)


def stream_mode(total, layer, passes):
    nl = total // layer
    n = layer // 2
    gpu_src = torch.empty(n, dtype=torch.bfloat16, device=dev)
    bufs = [torch.empty(n, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    checks = []

    def one_pass(layers, hits=None):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i, h in enumerate(layers):
            before = stat("h2d_t0_hit_bytes") if hits is not None else 0
            bufs[i % 2].copy_(h, non_blocking=True)
            if hits is not None:  # counted when the copy is planned, before it returns
                hits.append(stat("h2d_t0_hit_bytes") - before)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def run(case, layers, paired=None):
        for i, h in enumerate(layers):
            bf16_fill(gpu_src, 100 + i)
            h.copy_(gpu_src)
            if i < 2:
                checks.append(gpu_src.clone())
        torch.cuda.synchronize()
        h2d0, ready0 = stat("h2d_copies"), stat("copies_ready")
        in_time0, waited0 = stat("copies_ready_in_time"), stat("h2d_pieces_waited_on")
        times, writebacks, raw_times, meter = [], [], [], CpuMeter()
        # The first passes teach the predictor and settle placement: the first read pass is the
        # predictor's profile, placement by predicted reuse keeps its subset from the second on,
        # and the spread (ZRTIER_SPREAD) moves that subset to a share of every layer over the
        # next ones, writing back (in the background) the D2H-filled chunks it samples out
        # (pass_gbps and pass_writebacks show it). Steady state: the second half of the passes.
        learn = max(1, passes // 2)
        for p in range(passes):
            if p == learn:  # the steady passes: where the bytes came from, where time went
                steady0 = {k: stat(k) for k in ("h2d_bytes", "h2d_t0_hit_bytes", "bytes_decoded",
                                                "h2d_dma_ops", "h2d_copies", "copies_ready",
                                                "copies_ready_in_time", "h2d_pieces_waited_on")}
                prof0 = profile_now()
            last = p == passes - 1 and ZR is not None and case != "raw_pinned"
            hits = []
            if paired:  # a raw pinned pass just ahead of each pass: the baseline sees the same drift
                raw_times.append(one_pass(paired))
            wb0 = stat("t0_writebacks")
            if p >= learn:
                with meter:
                    times.append(one_pass(layers, hits if last else None))
            else:
                times.append(one_pass(layers, hits if last else None))
            writebacks.append(stat("t0_writebacks") - wb0)
            # bytes check on the last layer streamed
        bufs[0].copy_(layers[0])
        assert torch.equal(bufs[0], checks[0]), f"{case}: layer 0 bytes differ"
        steady = sorted(times[learn:])[len(times[learn:]) // 2]
        # With paired passes: the steady passes' raw pinned time over their own (the same bytes
        # moved both ways; a median of per-pass ratios swung by 0.1 when raw passes dipped).
        pair = {}
        if raw_times:
            raw_steady = sorted(raw_times[learn:])[len(raw_times[learn:]) // 2]
            pair = dict(raw_gbps=total / raw_steady / 1e9,
                        paired_ratio=sum(raw_times[learn:]) / sum(times[learn:]),
                        raw_pass_gbps=[round(total / t / 1e9, 2) for t in raw_times])
        copies = stat("h2d_copies") - h2d0
        ready = stat("copies_ready") - ready0
        in_time = stat("copies_ready_in_time") - in_time0
        steady_copies = stat("h2d_copies") - steady0["h2d_copies"]
        steady_share = lambda k: round((stat(k) - steady0[k]) / steady_copies, 3) if steady_copies else None
        # Fractions of the steady passes' bytes found in T0 and decoded from T2 (the rest: T1).
        moved = stat("h2d_bytes") - steady0["h2d_bytes"]
        frac = {f"{k}_fraction": round((stat(k) - steady0[k]) / moved, 3) if moved else None
                for k in ("h2d_t0_hit_bytes", "bytes_decoded")}
        emit(mode="stream", case=case, dir="h2d", bytes=total, layer_bytes=layer, passes=passes,
             gbps=total / steady / 1e9, first_pass_gbps=total / times[0] / 1e9,
             pass_gbps=[round(total / t / 1e9, 2) for t in times],
             # Owned T0 slots written back per pass (D2H-filled chunks the spread samples out).
             pass_writebacks=writebacks,
             # Per layer of the last pass, tenths of its bytes found in T0 (9 = 85 % or more):
             # whether the hits are spread over the pass or bunched.
             last_pass_t0_tenths="".join(str(min(9, round(10 * b / layer))) for b in hits),
             spread_permille=stat("t0_spread_permille"),  # the share of groups T0 keeps
             prefetch_hit_ratio=(ready / copies) if copies else None,
             # Copies whose chunks were all in T0 before the GPU's DMAs needed them (at the call,
             # or filled before the stream got to them), and deferred pieces the GPU waited for.
             ready_in_time_ratio=(in_time / copies) if copies else None,
             pieces_waited_on=stat("h2d_pieces_waited_on") - waited0,
             # The same over the steady passes only.
             steady_hit_ratio=steady_share("copies_ready"),
             steady_in_time_ratio=steady_share("copies_ready_in_time"),
             steady_pieces_waited_on=stat("h2d_pieces_waited_on") - steady0["h2d_pieces_waited_on"],
             # DMAs per layer copy in the steady passes (runs of consecutive T0 slots).
             dmas_per_copy=round((stat("h2d_dma_ops") - steady0["h2d_dma_ops"]) / (nl * (passes - learn)), 1),
             pool_bytes=int(os.environ.get("BENCH_POOL_BYTES", "0")), **frac, **pair,
             **profile_since(prof0, nl * (passes - learn)),
             # CPU time of the steady passes (per GiB they moved) and who spent it.
             **meter.report(total * (passes - learn)))
        checks.clear()

    raw = [raw_pinned(n) for _ in range(nl)]
    run("raw_pinned", raw)
    if ZR is not None:
        # zrtier's passes, each paired with a raw pinned pass over the same bytes just ahead of it.
        z = [torch.empty(n, dtype=torch.bfloat16, pin_memory=True) for _ in range(nl)]
        run("zrtier", z, paired=raw)
    for t in raw:
        unregister(t)


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["copy", "stream", "offload"])
    ap.add_argument("--count", type=int, default=64)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--total", default="16G")
    ap.add_argument("--layer", default="256M")
    ap.add_argument("--passes", type=int, default=10)
    a = ap.parse_args()
    torch.cuda.init()
    if a.mode == "copy":
        copy_mode(parse_size(a.size), a.iters)
    elif a.mode == "offload":
        offload_mode(a.count, parse_size(a.size), a.passes)
    else:
        stream_mode(parse_size(a.total), parse_size(a.layer), a.passes)


if __name__ == "__main__":
    main()
