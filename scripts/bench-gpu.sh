#!/usr/bin/env bash
# GPU benchmarks (needs a GPU, PyTorch and a built libzrtier.so). Prints tables; JSON lines go to
# $BENCH_JSON (default bench-gpu.jsonl). Every zrtier figure is a ratio to raw pinned memory
# measured in the same process (copies from T0, T1 and T2: to raw pinned copies timed in the same
# iterations, interleaved with theirs).
#   scripts/bench-gpu.sh [copy] [stream] [infer] [scan] [gpu-decode] [offload]
#     (default: the first four; gpu-decode: the GPU decode of issue #39 against the CPU path)
#   LIB=build/preload/libzrtier.so STREAM_TOTAL=16G STREAM_DATA="t2 t1" STREAM_PASSES=10 \
#     scripts/bench-gpu.sh stream
# Streaming and infer run with the bytes that miss the pool compressed (t2) and resident (t1).
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=${LIB:-$PWD/build/preload/libzrtier.so}
OUTF=${BENCH_JSON:-bench-gpu.jsonl}
PY=${PYTHON:-python3}
STREAM_TOTAL=${STREAM_TOTAL:-16G}
STREAM_LAYER=${STREAM_LAYER:-256M}
[[ -f "$LIB" ]] || { echo "bench-gpu: $LIB not found (build first: scripts/setup.sh)" >&2; exit 1; }
stages=("$@"); ((${#stages[@]})) || stages=(copy stream infer scan)
: >"$OUTF"
export PYTHONUNBUFFERED=1

to_bytes() { numfmt --from=iec "$1"; }

for stage in "${stages[@]}"; do
  case $stage in
    copy)
      # No pinning in place: with it the buffer's pages are registered and every row would be a
      # direct copy (the T2 row ran at raw pinned speed with nothing decoded).
      for size in 64M 1G; do
        iters=30; [[ $size == 1G ]] && iters=5
        ZRTIER_PIN_IN_PLACE=0 ZRTIER_PINNED_POOL=3G ZRTIER_RESIDENT_LIMIT=8G LD_PRELOAD=$LIB \
          $PY scripts/gpu/bench_copy.py copy --size $size --iters $iters | tee -a "$OUTF"
      done ;;
    offload)
      # save_on_cpu's pattern under a memory budget below the data: 64 copies of 48 MiB (3 GiB)
      # out to pinned buffers and back with ZRTIER_MEMORY at 75 % of it, so that the copies out
      # store most chunks compressed (encoded on the GPU by default) and the copies back decode
      # them; OFFLOAD_ENV adds options (e.g. ZRTIER_GPU_ENCODE=0).
      env ${OFFLOAD_ENV:-} ZRTIER_MEMORY=${OFFLOAD_MEMORY:-2415919104} LD_PRELOAD=$LIB \
        $PY scripts/gpu/bench_copy.py offload --count 64 --size 48M --passes ${OFFLOAD_PASSES:-3} | tee -a "$OUTF" ;;
    stream)
      # Where the bytes that miss the pool live: compressed (resident limit 1G: T2, decode-bound) or
      # resident (no resident limit: T1, memcpy-bound). STREAM_DATA=t2 or t1 runs one of them.
      total=$(to_bytes "$STREAM_TOTAL")
      for data in ${STREAM_DATA:-t2 t1}; do
        resident=1G; [[ $data == t1 ]] && resident=0
        for pct in 100 50 10; do
          [[ $data == t1 && $pct == 100 ]] && continue  # the same run as t2: everything hits T0
          pool=$((total * pct / 100 + (64 << 20)))
          ZRTIER_PREFETCH_AHEAD=${PREFETCH:-0} ZRTIER_PINNED_POOL=$pool BENCH_POOL_BYTES=$pool ZRTIER_RESIDENT_LIMIT=$resident \
            LD_PRELOAD=$LIB $PY scripts/gpu/bench_copy.py stream --total "$STREAM_TOTAL" \
            --layer "$STREAM_LAYER" --passes ${STREAM_PASSES:-10} | sed "s/\"case\": \"zrtier\"/\"case\": \"zrtier_pool${pct}_$data\"/" \
            | tee -a "$OUTF"
        done
      done ;;
    infer)
      $PY scripts/examples/infer.py --out /tmp/zr_infer_plain.json | sed 's/^/{"mode": "infer", "case": "plain", "r": /; s/$/}/' | tee -a "$OUTF"
      wb=$($PY -c 'import json; print(json.load(open("/tmp/zr_infer_plain.json"))["weight_bytes"])')
      # Pool at 50 % of the weights; the rest compressed (t2: resident limit 1G) or resident (t1).
      for data in t2 t1; do
        resident=1G; [[ $data == t1 ]] && resident=0
        ZRTIER_PINNED_POOL=$((wb / 2)) ZRTIER_RESIDENT_LIMIT=$resident LD_PRELOAD=$LIB \
          $PY scripts/examples/infer.py --out /tmp/zr_infer_pool50_$data.json \
          | sed "s/^/{\"mode\": \"infer\", \"case\": \"zrtier_pool50_$data\", \"r\": /; s/\$/}/" | tee -a "$OUTF"
        $PY scripts/examples/infer.py --compare /tmp/zr_infer_plain.json /tmp/zr_infer_pool50_$data.json
      done ;;
    scan)
      # CPU scans over compressed memory (no GPU needed; the GPU machine's cores), with the kernel's
      # zram-swap baseline where the machine allows it (kernel_gbps).
      ZR=${ZR:-$(dirname "$LIB")/../tools/zrtier}
      "$ZR" bench scan --bytes "${SCAN_BYTES:-4G}" --threads "${SCAN_THREADS:-1,2,all}" --json \
        | sed 's/^/{"mode": "scan", "r": /; s/$/}/' | tee -a "$OUTF" ;;
    gpu-decode)
      # H2D copies of compressed chunks decoded by the GPU (ZRTIER_CODEC=gpu ZRTIER_GPU_DECODE=1)
      # against the CPU path (the default codec, decoded by the fill workers), in alternating
      # processes, GPU_REPS times: T2 copies of 64 MiB and 1 GiB (ratio to raw pinned copies timed in
      # the same iterations), cyclic streaming of 8 GiB at pool 10 % (paired raw passes), infer.py
      # with pool 10 % of its weights and resident 1G (ratio to a plain run; logits compared).
      # Each row also has the process's CPU seconds (start-up and the untimed encodes included) and,
      # for copies and streaming, cpu_ms_per_gib: CPU time of every thread during the timed copies
      # alone, per GiB copied (bench_copy.py).
      $PY scripts/examples/infer.py --out /tmp/zr_gd_plain.json >/tmp/zr_gd_plain.log 2>&1
      wb=$($PY -c 'import json; print(json.load(open("/tmp/zr_gd_plain.json"))["weight_bytes"])')
      spool=$(( (8 << 30) / 10 + (64 << 20) ))
      for rep in $(seq "${GPU_REPS:-3}"); do
        for path in cpu gpu; do
          genv=(ZRTIER_CODEC=auto ZRTIER_GPU_DECODE=0)
          [[ $path == gpu ]] && genv=(ZRTIER_CODEC=gpu ZRTIER_GPU_DECODE=1)
          for what in copy64M copy1G stream infer; do
            out=/tmp/zr_gd_$what.out tf=/tmp/zr_gd_time
            TIMEFORMAT='%U %S'
            case $what in
              copy*) size=${what#copy}; iters=20; [[ $size == 1G ]] && iters=5
                { time env "${genv[@]}" ZRTIER_PIN_IN_PLACE=0 ZRTIER_PINNED_POOL=3G ZRTIER_RESIDENT_LIMIT=8G \
                    LD_PRELOAD=$LIB $PY scripts/gpu/bench_copy.py copy --size "$size" --iters $iters >$out 2>&1; } 2>$tf ;;
              stream)
                { time env "${genv[@]}" ZRTIER_PINNED_POOL=$spool BENCH_POOL_BYTES=$spool ZRTIER_RESIDENT_LIMIT=1G \
                    LD_PRELOAD=$LIB $PY scripts/gpu/bench_copy.py stream --total 8G --layer 256M --passes 6 >$out 2>&1; } 2>$tf ;;
              infer)
                { time env "${genv[@]}" ZRTIER_PINNED_POOL=$((wb / 10)) ZRTIER_RESIDENT_LIMIT=1G LD_PRELOAD=$LIB \
                    $PY scripts/examples/infer.py --out /tmp/zr_gd_infer.json >$out 2>&1; } 2>$tf ;;
            esac
            $PY - "$what" "$path" "$rep" "$out" "$tf" <<'PYEOF' | tee -a "$OUTF"
import json, sys
what, path, rep, out, tf = sys.argv[1:6]
row = {"mode": "gpu-decode", "what": what, "path": path, "rep": int(rep)}
try:
    row["cpu_s"] = round(sum(float(x) for x in open(tf).read().split()[-2:]), 1)
    if what == "infer":
        p, z = json.load(open("/tmp/zr_gd_plain.json")), json.load(open("/tmp/zr_gd_infer.json"))
        row.update(value=round(z["tokens_per_s"], 2), base=round(p["tokens_per_s"], 2),
                   identical=p["logits_sha256"] == z["logits_sha256"])
    else:
        for l in open(out):
            if not l.startswith("{"):
                continue
            r = json.loads(l)
            if what.startswith("copy") and r.get("case") == "zrtier_t2" and r.get("dir") == "h2d":
                row.update(value=round(r["gbps"], 2), base=round(r["raw_gbps"], 2),
                           cpu_ms_per_gib=r.get("cpu_ms_per_gib"))
            if what == "stream" and r.get("case") == "zrtier":
                row.update(value=round(r["gbps"], 2), base=round(r["gbps"] / r["paired_ratio"], 2),
                           cpu_ms_per_gib=r.get("cpu_ms_per_gib"))
except Exception as e:  # a failed run is a row without a value
    row["error"] = repr(e)
print(json.dumps(row))
PYEOF
          done
        done
      done
      rm -f /tmp/zr_gd_* ;;
    *) echo "bench-gpu: unknown stage $stage (copy, stream, infer, scan, gpu-decode)" >&2; exit 2 ;;
  esac
done

$PY - "$OUTF" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
copy = [r for r in rows if r.get("mode") == "copy"]
if copy:
    print("\nH2D / D2H copies (GB/s; ratio to raw pinned in the same process, T0/T1/T2 to raw copies interleaved with theirs)")
    print(f"{'size':>6} {'dir':>4} {'case':<12} {'GB/s':>7} {'x raw':>6} {'x pageable':>10}")
    for size in sorted({r["bytes"] for r in copy}):
        for d in ("h2d", "d2h"):
            sel = {r["case"]: r for r in copy if r["bytes"] == size and r["dir"] == d}
            raw, pg = sel["raw_pinned"]["gbps"], sel["pageable"]["gbps"]
            for case, r in sel.items():
                # Paired rows: the raw pinned copies timed in the same iterations (bench_copy.py).
                g, base = r["gbps"], r.get("raw_gbps", raw)
                print(f"{size >> 20:>5}M {d:>4} {case:<12} {g:7.2f} {g / base:6.2f} {g / pg:10.2f}"
                      + (f"   (paired raw {base:.2f})" if "raw_gbps" in r else ""))
stream = [r for r in rows if r.get("mode") == "stream"]
if stream:
    print("\nCyclic streaming of bf16 layers (GB/s: median of the second half of the passes, after as many learning ones; ratio to raw pinned passes interleaved with theirs: their time over zrtier's, steady passes)")
    raw = None
    for r in stream:
        if r["case"] == "raw_pinned":
            raw = r["gbps"]
            continue
        hr, it = r.get("prefetch_hit_ratio"), r.get("ready_in_time_ratio")
        # Paired rows (bench_copy.py): a raw pinned pass just ahead of each pass.
        ratio, base = r.get("paired_ratio", r["gbps"] / raw), r.get("raw_gbps", raw)
        print(f"{r['case']:<18} total {r['bytes'] >> 30}G layer {r['layer_bytes'] >> 20}M: "
              f"{r['gbps']:6.2f} GB/s = {ratio:.2f} x raw pinned ({base:.2f}); "
              f"first pass {r['first_pass_gbps']:.2f} GB/s; prefetch hit ratio "
              f"{'n/a' if hr is None else f'{hr:.3f}'} at the call, "
              f"{'n/a' if it is None else f'{it:.3f}'} in time ({r.get('pieces_waited_on')} "
              f"pieces waited on; steady passes {r.get('steady_hit_ratio')} / "
              f"{r.get('steady_in_time_ratio')}, {r.get('steady_pieces_waited_on')}); bytes from T0 "
              f"{r.get('h2d_t0_hit_bytes_fraction')}, decoded {r.get('bytes_decoded_fraction')}")
        if r.get("pass_gbps"):
            if r.get("raw_pass_gbps"):
                print(f"{'':<18} raw pinned passes {r['raw_pass_gbps']} GB/s")
            print(f"{'':<18} passes {r['pass_gbps']} GB/s; owned T0 slots written back per pass "
                  f"{r.get('pass_writebacks')}; last pass, tenths from T0 per layer: "
                  f"{r.get('last_pass_t0_tenths')}")
scan = [r["r"] for r in rows if r.get("mode") == "scan"]
if scan:
    print("\nCPU scans over compressed bf16 (zrtier bench scan): GB/s")
    print(f"{'mode':<8} {'threads':>7} {'zrtier':>8} {'plain':>8} {'kernel zram swap':>17}")
    for r in scan:
        print(f"{r['mode']:<8} {r['threads']:>7} {r['gbps']:>8} {r['memcpy_gbps']:>8} {r['kernel_gbps']:>17}")
gd = [r for r in rows if r.get("mode") == "gpu-decode"]
if gd:
    print("\nGPU decode against the CPU path (alternating processes; x base: raw pinned in the same "
          "process for copies and streaming, a plain run for infer.py; min / median / max)")
    print(f"{'what':<8} {'path':<4} {'value':>24} {'x base':>20} {'CPU s':>16} {'CPU ms/GiB':>24}  identical")
    mmm = lambda v: " / ".join(f"{x:.2f}" for x in (min(v), sorted(v)[len(v) // 2], max(v))) if v else "-"
    for what in ("copy64M", "copy1G", "stream", "infer"):
        for path in ("cpu", "gpu"):
            sel = [r for r in gd if r["what"] == what and r["path"] == path and "value" in r]
            bad = sum(1 for r in gd if r["what"] == what and r["path"] == path and "value" not in r)
            ident = {r.get("identical") for r in sel} - {None}
            print(f"{what:<8} {path:<4} {mmm([r['value'] for r in sel]):>24} "
                  f"{mmm([r['value'] / r['base'] for r in sel]):>20} {mmm([r['cpu_s'] for r in sel]):>16} "
                  f"{mmm([r['cpu_ms_per_gib'] for r in sel if r.get('cpu_ms_per_gib') is not None]):>24}  "
                  f"{'-' if not ident else all(ident)}{f'  ({bad} failed)' if bad else ''}")
inf = {r["case"]: r["r"] for r in rows if r.get("mode") == "infer"}
if "plain" in inf:
    p = inf["plain"]
    for case, z in inf.items():
        if case == "plain":
            continue
        where = "rest compressed (T2)" if case.endswith("t2") else "rest resident (T1)"
        print(f"\ninfer.py tokens/s: plain {p['tokens_per_s']:.2f}, zrtier pool 50%, {where}: "
              f"{z['tokens_per_s']:.2f} = {z['tokens_per_s'] / p['tokens_per_s']:.2f} x; "
              f"logits identical: {p['logits_sha256'] == z['logits_sha256']}")
        if p.get("pass_seconds") and z.get("pass_seconds"):
            # The forward passes' median over the second half: steady state, without the prompt.
            med = lambda v: sorted(v[len(v) // 2:])[len(v[len(v) // 2:]) // 2] * 1e3
            print(f"  steady forward pass: plain {med(p['pass_seconds']):.0f} ms, zrtier "
                  f"{med(z['pass_seconds']):.0f} ms = {med(p['pass_seconds']) / med(z['pass_seconds']):.2f} x; "
                  f"every pass (ms): {[round(x * 1e3) for x in z['pass_seconds']]}")
        if z.get("zrtier_pass_profile"):
            # Where a steady pass's time goes (infer.py reads zrtier's counters per pass).
            print(f"  per steady pass: {z['zrtier_pass_profile']}")
        if z.get("zrtier_first_passes"):
            # The first passes one by one (learning; the write-back of the D2H-filled weights),
            # and where the weights were when generation began (MiB).
            print(f"  at the start (MiB): {z.get('zrtier_at_start_mib')}")
            for i, f in enumerate(z["zrtier_first_passes"]):
                print(f"  pass {i + 1}: {f}")
PYEOF
