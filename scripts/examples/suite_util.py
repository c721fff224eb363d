#!/usr/bin/env python3
"""Shared helpers of the offloading suite (the programs in scripts/examples/): determinism, step timing,
peak RSS, pinned bytes, digests, `--compare`, and the table that `scripts/device-check.sh suite` prints.

Every program of the suite writes one JSON (--out) with at least these keys:
  speed, speed_unit    the program's natural unit (tokens/s, samples/s, ...) over the steady steps after
                       warm-up; step_ms: every step's milliseconds, warm-up included
  peak_rss_bytes       VmHWM of the process, plus that of its children (DataLoader workers, torchrun
                       ranks) where it has them; the parts are beside it
  pinned_bytes         the most pinned host memory one process held: the caching host allocator's peak
                       (blocks as asked of cudaHostAlloc, rounded up to powers of two), the basis of the
                       suite's ZRTIER_MEMORY (a per-process budget)
  digest, losses       sha256 over every output that must be bit-identical; the step losses (float hex)
  config               the sizes it ran with
and `PROGRAM --compare A B` exits 0 iff both digests and both loss lists are identical.

Imports torch only inside the functions that need it: `--compare` and `table` run without it.

    python3 suite_util.py table OUT_DIR      # suite.txt and suite.jsonl from OUT_DIR/suite_runs.tsv
"""
import hashlib
import json
import os
import sys
import time

# cuBLAS needs this before CUDA initialises for deterministic GEMMs; every suite program imports this
# module before torch.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def add_run_args(ap, steps, warmup, lr, seed, steps_help="timed steps after the warm-up",
                 warmup_help=None, out_help="write the result here (JSON)"):
    """The arguments every suite program takes: the run's length and seed, --small, --out, --compare."""
    ap.add_argument("--steps", type=int, default=steps, help=steps_help)
    ap.add_argument("--warmup", type=int, default=warmup, help=warmup_help)
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--seed", type=int, default=seed)
    ap.add_argument("--small", action="store_true", help="a quick smoke run (overrides the sizes)")
    ap.add_argument("--out", help=out_help)
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two --out files")


def set_deterministic(seed):
    """Seeds every generator, makes PyTorch use deterministic algorithms and turns TF32 off. Leaves
    torch.empty uninitialised (fill_uninitialized_memory off): the programs never read memory they did not
    write, and a NaN fill of every pinned buffer would be CPU work a real run does not do."""
    import torch
    torch.manual_seed(seed)  # the CPU generator and every CUDA device's
    torch.use_deterministic_algorithms(True)
    try:
        import torch.utils.deterministic as det
        det.fill_uninitialized_memory = False
    except (ImportError, AttributeError):
        pass
    # The switches train.py and infer.py use (PyTorch 2.9+ also has fp32_precision = "ieee"; it is not
    # mixed in here, as mixing the two APIs can raise).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def status_bytes(field, pid="self"):
    """A kB field of /proc/PID/status (VmHWM, VmRSS, ...) in bytes; 0 if the process or field is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes(pid="self"):
    return status_bytes("VmHWM", pid)


def zrtier_loaded():
    """Whether libzrtier is mapped into this process (a zrtier run that silently ran without it is
    worthless; LD_PRELOAD of a missing file only warns)."""
    try:
        with open("/proc/self/maps") as f:
            return any("libzrtier" in line for line in f)
    except OSError:
        return False


def zrtier_env():
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("ZRTIER_")}


def pinned_stats():
    """The caching host allocator's peaks, as a dict (empty if torch.cuda.host_memory_stats is missing).
    Its keys changed across releases: pinned blocks owned by the allocator (active + cached, the bytes
    asked of cudaHostAlloc) are "allocated_bytes" in newer releases and "reserved_bytes" in older ones,
    where "allocated_bytes" meant the blocks in use; the larger of the two is the owned peak either way."""
    import torch
    try:
        s = torch.cuda.host_memory_stats()
    except (AttributeError, RuntimeError):
        return {}
    if not s:
        return {}
    owned = max(int(s.get("reserved_bytes.peak", 0)), int(s.get("allocated_bytes.peak", 0)))
    if "active_bytes.peak" in s:
        active = int(s["active_bytes.peak"])
    else:
        active = int(s.get("allocated_bytes.peak", 0))
    return {"pinned_owned_peak_bytes": owned, "pinned_active_peak_bytes": active,
            "num_host_alloc": int(s.get("num_host_alloc", 0)), "num_host_free": int(s.get("num_host_free", 0))}


def pinned_bytes(stats, fallback):
    """pinned_bytes for the JSON: the allocator's owned peak, else the program's own sum of the sizes of
    its pinned tensors (fallback, 0 where it cannot know), and where the number came from."""
    if stats.get("pinned_owned_peak_bytes", 0) > 0:
        return stats["pinned_owned_peak_bytes"], "torch.cuda.host_memory_stats"
    return int(fallback), "sum of pinned tensor sizes" if fallback else "unavailable"


class Digest:
    """sha256 over tensors' bytes (with shape and dtype) and strings, in the order given."""

    def __init__(self):
        self.h = hashlib.sha256()

    def text(self, s):
        self.h.update(s.encode())
        self.h.update(b"\0")

    def tensor(self, t):
        import torch
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()  # blocking copy into pageable memory
        self.text(f"{tuple(t.shape)} {t.dtype}")
        if t.numel():
            self.h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())

    def hexdigest(self):
        return self.h.hexdigest()


def loss_hex(loss):
    """A loss exactly, as float hex (the loss's own float32/bf16 value widened to a Python float)."""
    return float(loss.item()).hex()


class StepTimer:
    """Milliseconds of every step, synchronising the GPU at each boundary; `rate(units_per_step)` is
    units per second over the steps after `warmup`."""

    def __init__(self, warmup, sync=True):
        self.warmup = warmup
        self.sync = sync
        self.ms = []
        self.t = None

    def _now(self):
        if self.sync:
            import torch
            torch.cuda.synchronize()
        return time.perf_counter()

    def start(self):
        self.t = self._now()

    def step(self):
        now = self._now()
        self.ms.append((now - self.t) * 1e3)
        self.t = now

    def steady_ms(self):
        steady = self.ms[self.warmup:] or self.ms
        return sum(steady) / len(steady) if steady else float("nan")

    def rate(self, units_per_step):
        return units_per_step * 1e3 / self.steady_ms()

    def fields(self, units_per_step, unit):
        return {"speed": self.rate(units_per_step), "speed_unit": unit, "warmup_steps": self.warmup,
                "steady_step_ms": round(self.steady_ms(), 3), "step_ms": [round(m, 3) for m in self.ms]}


def common_fields():
    return {"zrtier": zrtier_loaded(), "zrtier_env": zrtier_env(), "pid": os.getpid()}


def write_result(result, out):
    """Prints the result as one JSON line and writes it to `out` (if given)."""
    print(json.dumps(result))
    if out:
        with open(out, "w") as f:
            json.dump(result, f)


def compare(paths):
    """`--compare A B`: prints JSON, returns 0 iff the digests and the step losses are identical."""
    a, b = (json.load(open(p)) for p in paths)
    la, lb = a.get("losses", []), b.get("losses", [])
    first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), None)
    if first is None and len(la) != len(lb):
        first = min(len(la), len(lb))
    same_digest = a.get("digest") is not None and a.get("digest") == b.get("digest")
    same = same_digest and first is None
    print(json.dumps({"bit_identical": same, "digest_identical": same_digest, "losses_identical": first is None,
                      "first_differing_step": first, "steps": len(la), "a": a.get("digest"), "b": b.get("digest")}))
    return 0 if same else 1


# The suite table ------------------------------------------------------------------------------------

def _gib(n):
    return f"{n / 2**30:.2f} GiB"


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def table(out_dir):
    """Reads OUT_DIR/suite_runs.tsv (program, config, rc, identical, wall_s, zrtier_memory per run, as
    device-check.sh writes it) and each run's JSON; writes OUT_DIR/suite.txt (printed too) and
    OUT_DIR/suite.jsonl (one row per run, ratios and absolute values)."""
    runs = []
    with open(os.path.join(out_dir, "suite_runs.tsv")) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 6:
                runs.append(dict(zip(("program", "config", "rc", "identical", "wall_s", "zrtier_memory"), parts)))
    plains = {}
    rows = []
    for r in runs:
        res = _load(os.path.join(out_dir, f"suite_{r['program']}_{r['config']}.json")) or {}
        if r["config"] == "plain":
            plains[r["program"]] = res
        base = plains.get(r["program"], {})
        speed, rss = res.get("speed"), res.get("peak_rss_bytes")
        row = {"program": r["program"], "config": r["config"], "identical": r["identical"], "rc": int(r["rc"]) if r["rc"].lstrip("-").isdigit() else None,
               "wall_s": float(r["wall_s"]),
               "zrtier_memory": int(r["zrtier_memory"]) if r["zrtier_memory"].isdigit() else None,
               "speed": speed, "speed_unit": res.get("speed_unit"), "peak_rss_bytes": rss,
               "pinned_bytes": res.get("pinned_bytes"), "pinned_bytes_total": res.get("pinned_bytes_total"),
               "zrtier_loaded": res.get("zrtier_loaded", res.get("zrtier")),
               "speed_x": speed / base["speed"] if speed and base.get("speed") else None,
               "rss_x": rss / base["peak_rss_bytes"] if rss and base.get("peak_rss_bytes") else None}
        if res.get("peak_rss_main_bytes") and base.get("peak_rss_main_bytes"):  # without worker processes
            row["peak_rss_main_bytes"] = res["peak_rss_main_bytes"]
            row["rss_main_x"] = res["peak_rss_main_bytes"] / base["peak_rss_main_bytes"]
        if r["config"] != "plain" and res and not row["zrtier_loaded"]:
            row["note"] = "libzrtier was not loaded"
        rows.append(row)

    lines = [f"{'program':<20} {'config':<10} {'identical':<16} {'speed x plain':>13} {'peak RSS x plain':>16}"]
    for row in rows:
        if row["config"] == "plain":
            continue
        fmt = lambda v: f"{v:.3f}" if v is not None else "-"
        ident = row["identical"] + (" (no zrtier!)" if row.get("note") else "")
        lines.append(f"{row['program']:<20} {row['config']:<10} {ident:<16} {fmt(row['speed_x']):>13} "
                     f"{fmt(row['rss_x']):>16}")
    lines.append("")
    lines.append("plain runs (the baseline of every ratio; ZRTIER_MEMORY is a share of pinned, per process):")
    for row in rows:
        if row["config"] != "plain":
            continue
        if row["rc"] != 0 or row["speed"] is None:
            lines.append(f"  {row['program']}: failed (exit {row['rc']}, identical {row['identical']})")
            continue
        total = row.get("pinned_bytes_total")
        pinned = _gib(row["pinned_bytes"] or 0) + (f" per process, {_gib(total)} in all" if total else "")
        lines.append(f"  {row['program']}: {row['speed']:.1f} {row['speed_unit']}, peak RSS "
                     f"{_gib(row['peak_rss_bytes'] or 0)}, pinned {pinned}, {row['wall_s']:.0f} s")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "suite.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(out_dir, "suite.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "table":
        sys.exit(table(sys.argv[2]))
    print(__doc__)
    sys.exit(2)
