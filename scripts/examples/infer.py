#!/usr/bin/env python3
"""Offloaded inference, the RamTorch / FlexGen pattern: a Llama-shaped decoder whose layer weights live
in pinned host memory (torch's pin_memory) and are streamed to the GPU every forward pass, one layer
ahead of the compute on a side stream. Generates tokens greedily and writes the logits of every step
so two runs (with and without zrtier) can be compared bit for bit.

    python3 infer.py --out /tmp/a.json                       # plain PyTorch
    LD_PRELOAD=libzrtier.so python3 infer.py --out /tmp/b.json
    python3 infer.py --compare /tmp/a.json /tmp/b.json       # exit 0 iff bit-identical

Prints one JSON line: logits sha256, tokens/s, peak host memory (peak RSS and peak system memory in
use above the level before the weights were made, with what it was made of at that moment), the
weight bytes and, under zrtier, where its steady forward passes' time went (zrtier_pass_profile).
"""
import argparse
import hashlib
import json
import os
import sys
import threading
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_util  # noqa: E402  (the suite's JSON keys: speed, pinned bytes, digest)

# zrtier's counters of the copy path, when it is loaded (LD_PRELOAD): where a forward pass's time
# goes (nanoseconds, summed over the process; fill_ns over every fill worker).
PROFILE = ("h2d_copies", "copy_ns", "copy_plan_ns", "copy_issue_ns", "copy_wait_ns", "fill_ns",
           "decode_ns", "h2d_bytes", "h2d_t0_hit_bytes", "h2d_dma_ops", "dma_calls", "h2d_deferred_pieces",
           "encode_ns", "bytes_encoded", "evictions", "t0_writebacks", "copies_ready", "prefetch_bytes",
           "prefetch_unused_bytes", "copies_ready_in_time", "h2d_pieces_waited_on")
# Gauges read at the start of generation (where the weights are when the first pass begins).
START_GAUGES = ("t0_bytes", "t0_owned_bytes", "resident_bytes", "store_raw_bytes")
# The first passes profiled one by one (learning, and the write-back of D2H-filled weights).
FIRST_PASSES = 4


def zrtier_stat_fn():
    import ctypes
    try:
        lib = ctypes.CDLL(None)
        fn = lib.zrtier_stat
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_char_p]
    fn.restype = ctypes.c_uint64
    return lambda name: fn(name.encode())


def read_kib_fields(path):
    vals = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.partition(":")
            parts = v.split()
            if len(parts) == 2 and parts[1] == "kB":
                vals[k] = int(parts[0]) * 1024
    return vals


def meminfo_used_bytes(vals=None):
    vals = vals or read_kib_fields("/proc/meminfo")
    return vals["MemTotal"] - vals["MemAvailable"]


# What the peak is made of: system-wide fields above the start, and this process's own.
# MemTotal: the VM's memory grows when it is used (hot-added memory), which moves the watermarks
# that MemAvailable subtracts.
BREAKDOWN_MEMINFO = ("AnonPages", "Shmem", "Cached", "Buffers", "Mlocked", "Unevictable", "Slab", "PageTables",
                     "MemFree", "Active(file)", "Inactive(file)", "Dirty", "Writeback", "SReclaimable",
                     "SUnreclaim", "KernelStack", "VmallocUsed", "Percpu", "AnonHugePages", "MemTotal",
                     "MemAvailable", "Mapped")
BREAKDOWN_SELF = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmLck", "VmPin", "VmPTE")


def peak_rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class MemorySampler:
    """Samples system memory in use every 20 ms; reports the peak above the starting level."""

    def __init__(self):
        self.base_fields = read_kib_fields("/proc/meminfo")
        self.base = meminfo_used_bytes(self.base_fields)
        self.peak = self.base
        self.phase = "start"
        self.t0 = time.perf_counter()
        self.at_peak = {}
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def sample(self):
        fields = read_kib_fields("/proc/meminfo")
        used = meminfo_used_bytes(fields)
        if used > self.peak:
            self.peak = used
            mine = read_kib_fields("/proc/self/status")
            self.at_peak = {"phase": self.phase, "seconds": round(time.perf_counter() - self.t0, 2),
                            **{f"sys_{k}_above_start": fields.get(k, 0) - self.base_fields.get(k, 0)
                               for k in BREAKDOWN_MEMINFO},
                            **{f"self_{k}": mine.get(k, 0) for k in BREAKDOWN_SELF}}

    def run(self):
        while not self.stop:
            self.sample()
            time.sleep(0.02)

    def finish(self):
        self.stop = True
        self.t.join()
        self.sample()
        return self.peak - self.base


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", help="write logits hash and stats here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two --out files")
    args = ap.parse_args()

    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        same = a["logits_sha256"] == b["logits_sha256"] and a["tokens"] == b["tokens"]
        print(json.dumps({"bit_identical": same, "a": a["logits_sha256"], "b": b["logits_sha256"]}))
        return 0 if same else 1

    import torch
    import torch.nn.functional as F

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.empty(1, device=dev)  # CUDA context before the memory baseline
    sampler = MemorySampler()
    sampler.phase = "weights"

    H, I, L, NH = args.hidden, args.intermediate, args.layers, args.heads
    HD = H // NH
    shapes = {"wq": (H, H), "wk": (H, H), "wv": (H, H), "wo": (H, H),
              "w1": (I, H), "w3": (I, H), "w2": (H, I)}
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    # Host (pinned) weights, written by D2H copies from GPU-generated values.
    host_layers = []
    weight_bytes = 0
    for _ in range(L):
        layer = {}
        for name, shape in shapes.items():
            w = (torch.randn(shape, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(torch.bfloat16)
            h = torch.empty(shape, dtype=torch.bfloat16, pin_memory=True)
            h.copy_(w, non_blocking=True)
            layer[name] = h
            weight_bytes += h.numel() * h.element_size()
        host_layers.append(layer)
    torch.cuda.synchronize()
    sampler.phase = "generate"
    assert all(t.is_pinned() for layer in host_layers for t in layer.values()), "weights not pinned"
    embed = (torch.randn((args.vocab, H), generator=gen, device=dev) * 0.02).to(torch.bfloat16)
    norm_w = torch.ones(H, device=dev, dtype=torch.bfloat16)

    # Two GPU buffers: layer i computes from one while layer i+1 streams into the other.
    gpu_bufs = [{n: torch.empty(s, dtype=torch.bfloat16, device=dev) for n, s in shapes.items()} for _ in range(2)]
    copy_stream = torch.cuda.Stream()
    ready = [torch.cuda.Event() for _ in range(2)]
    free = [torch.cuda.Event() for _ in range(2)]

    def fetch(i):
        slot = i % 2
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_event(free[slot])
            for n in shapes:
                gpu_bufs[slot][n].copy_(host_layers[i][n], non_blocking=True)
            ready[slot].record(copy_stream)

    def rms(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * norm_w

    def forward(tokens, kv, pos):
        x = embed[tokens]  # [T, H]
        T = x.shape[0]
        for s in range(2):
            free[s].record()
        fetch(0)
        for i in range(L):
            slot = i % 2
            torch.cuda.current_stream().wait_event(ready[slot])
            if i + 1 < L:
                fetch(i + 1)  # waits for free[(i+1)%2], recorded after layer i-1
            w = gpu_bufs[slot]
            h = rms(x)
            q = (h @ w["wq"].T).view(T, NH, HD).transpose(0, 1)
            k = (h @ w["wk"].T).view(T, NH, HD).transpose(0, 1)
            v = (h @ w["wv"].T).view(T, NH, HD).transpose(0, 1)
            if kv[i] is not None:
                k = torch.cat([kv[i][0], k], dim=1)
                v = torch.cat([kv[i][1], v], dim=1)
            kv[i] = (k, v)
            a = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                               is_causal=(pos == 0))
            x = x + a.squeeze(0).transpose(0, 1).reshape(T, H) @ w["wo"].T
            h = rms(x)
            x = x + (F.silu(h @ w["w1"].T) * (h @ w["w3"].T)) @ w["w2"].T
            free[slot].record()
        return (rms(x[-1:]) @ embed.T).float()  # [1, vocab]

    tokgen = torch.Generator(device=dev)
    tokgen.manual_seed(args.seed + 1)
    prompt = torch.randint(0, args.vocab, (args.prompt,), generator=tokgen, device=dev)
    digest = hashlib.sha256()
    kv = [None] * L
    tokens = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    pass_ends = []  # each forward pass ends where its logits reach the CPU
    zstat = zrtier_stat_fn()
    # zrtier's PROFILE counters at the start and at each pass end (under zrtier).
    counters = [{k: zstat(k) for k in PROFILE}] if zstat else []
    start_gauges = {k: zstat(k) for k in START_GAUGES} if zstat else {}
    logits = forward(prompt, kv, 0)
    pos = args.prompt
    for _ in range(args.new_tokens):
        digest.update(logits.cpu().numpy().tobytes())
        pass_ends.append(time.perf_counter())
        if zstat:
            counters.append({k: zstat(k) for k in PROFILE})
        nxt = int(torch.argmax(logits[0]))
        tokens.append(nxt)
        logits = forward(torch.tensor([nxt], device=dev), kv, pos)
        pos += 1
    digest.update(logits.cpu().numpy().tobytes())
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    pass_ends.append(time.perf_counter())
    if zstat:
        counters.append({k: zstat(k) for k in PROFILE})
    peak_used = sampler.finish()

    result = {
        "logits_sha256": digest.hexdigest(),
        "tokens": tokens,
        "forward_passes": args.new_tokens + 1,
        "tokens_per_s": (args.new_tokens + 1) / elapsed,
        # Seconds per forward pass (the first includes the prompt): where the time went.
        "pass_seconds": [round(b - a, 4) for a, b in zip([t0] + pass_ends, pass_ends)],
        "weight_bytes": weight_bytes,
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_host_used_above_start_bytes": peak_used,
        "at_peak": sampler.at_peak,
        "zrtier": bool(os.environ.get("LD_PRELOAD", "").find("libzrtier") >= 0),
    }
    # The suite's keys (scripts/examples/suite_util.py): the digest is the logits' sha256; the speed is
    # forward passes per second after the first two (the prompt's and one warm-up pass).
    steady = result["pass_seconds"][2:] or result["pass_seconds"]
    stats = suite_util.pinned_stats()
    pinned, source = suite_util.pinned_bytes(stats, weight_bytes)
    result.update({"program": "infer", "digest": result["logits_sha256"], "losses": [],
                   "speed": len(steady) / sum(steady) if sum(steady) > 0 else result["tokens_per_s"],
                   "speed_unit": "tokens/s", "warmup_steps": 2,
                   "step_ms": [round(x * 1e3, 3) for x in result["pass_seconds"]],
                   "pinned_bytes": pinned, "pinned_bytes_source": source, **stats,
                   "config": {"layers": L, "hidden": H, "intermediate": I, "heads": NH, "vocab": args.vocab,
                              "prompt": args.prompt, "new_tokens": args.new_tokens, "seed": args.seed},
                   "zrtier_loaded": suite_util.zrtier_loaded(), "zrtier_env": suite_util.zrtier_env()})
    if len(counters) >= 4:
        # counters[i] is taken at the start of pass i (counters[-1]: after the last pass), and
        # pass_ends[i] is when pass i ended.
        def profile(first, last):
            """Per forward pass over passes first..last-1: copy calls, milliseconds in them
            (planning, issuing, waiting on fills), fill, decode and encode milliseconds summed
            over the threads, the share of the bytes found in T0, the DMAs and the CUDA calls that
            queued them, evictions and owned T0 slots written back, and the pass itself."""
            a, b, n = counters[first], counters[last], last - first
            d = {key: (b[key] - a[key]) / n for key in PROFILE}
            began = t0 if first == 0 else pass_ends[first - 1]
            return {
                "passes": n,
                "pass_ms": round((pass_ends[last - 1] - began) / n * 1e3, 1),
                "h2d_copies": round(d["h2d_copies"], 1),
                **{key[:-3] + "_ms": round(d[key] / 1e6, 2) for key in PROFILE if key.endswith("_ns")},
                "t0_hit_fraction": round(d["h2d_t0_hit_bytes"] / d["h2d_bytes"], 3) if d["h2d_bytes"] else 0,
                # Copies whose chunks were all in T0 when called (the prefetch hit ratio).
                "ready_fraction": round(d["copies_ready"] / d["h2d_copies"], 3) if d["h2d_copies"] else 0,
                # Copies whose chunks were all in T0 before the GPU's DMAs needed them (at the
                # call, or filled before the stream got to them), and pieces the GPU waited for.
                "in_time_fraction": round(d["copies_ready_in_time"] / d["h2d_copies"], 3) if d["h2d_copies"] else 0,
                "pieces_waited_on": round(d["h2d_pieces_waited_on"], 1),
                "prefetched_mib": round(d["prefetch_bytes"] / 2**20, 1),
                "prefetch_unused_mib": round(d["prefetch_unused_bytes"] / 2**20, 1),
                "h2d_dmas": round(d["h2d_dma_ops"]),
                "dma_calls": round(d["dma_calls"]),
                "deferred_pieces": round(d["h2d_deferred_pieces"]),
                "encoded_mib": round(d["bytes_encoded"] / 2**20, 1),
                "evictions": round(d["evictions"]),
                "t0_writebacks": round(d["t0_writebacks"]),
            }

        passes = len(counters) - 1
        result["zrtier_pass_profile"] = profile(passes // 2, passes)  # the steady second half
        result["zrtier_first_passes"] = [profile(i, i + 1) for i in range(min(FIRST_PASSES, passes))]
        result["zrtier_at_start_mib"] = {k: round(v / 2**20) for k, v in start_gauges.items()}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
