#!/usr/bin/env bash
# The one call on the GPU machine: build, the whole ctest suite, the GPU tests (real PyTorch
# programs under LD_PRELOAD, outputs compared bit for bit with a run without zrtier) and the
# benchmarks; prints a PASS/FAIL table at the end.
#   here:   scripts/device-prep.sh          (liburing and nlohmann-json for the GPU machine, into .device/)
#   device: scripts/device-check.sh [build] [test] [gpu-decode] [gpu] [bench]   (default: all; carry .device)
#           scripts/device-check.sh suite   (not in the default list: the offloading suite, see its stage)
# Results (logs, JSON) go to $OUT (the device tool's output folder) or /tmp/zrtier-device.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/zrtier-device}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-device}
LIB=$PWD/$BUILD/preload/libzrtier.so
stages=("$@"); ((${#stages[@]})) || stages=(build test gpu-decode gpu bench)
declare -a results
record() { results+=("$(printf '%-44s %s' "$1" "$2")"); echo "== $1: $2"; }
export PYTHONUNBUFFERED=1

for stage in "${stages[@]}"; do
  case $stage in
    build)
      uring=$PWD/.device/uring
      if [[ -d $uring/usr/include ]]; then
        export PKG_CONFIG_PATH=$uring/usr/lib/x86_64-linux-gnu/pkgconfig
        export PKG_CONFIG_SYSROOT_DIR=$uring
      fi
      # nlohmann-json (header-only): its CMake package config, found through CMAKE_PREFIX_PATH.
      nlohmann=$PWD/.device/nlohmann
      if [[ -d $nlohmann/usr/include/nlohmann ]]; then
        export CMAKE_PREFIX_PATH=$nlohmann/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
      fi
      if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$OUT/configure.log" 2>&1 &&
         cmake --build "$BUILD" -j "$(nproc)" >"$OUT/build.log" 2>&1; then
        record build PASS
      else
        tail -30 "$OUT/configure.log" "$OUT/build.log"; record build FAIL; break
      fi ;;
    test)
      if (cd "$BUILD" && ZRTIER_TEST_STRESS_SECONDS=${STRESS:-10} ctest -j 8 --output-on-failure \
            >"$OUT/ctest.log" 2>&1); then
        record "ctest ($(grep -o '[0-9]*% tests passed.*' "$OUT/ctest.log" | tail -1))" PASS
      else
        grep -E "Failed|\*\*\*|tests passed" "$OUT/ctest.log" | tail -20; record ctest FAIL
      fi ;;
    gpu-decode)
      # The GPU decode kernel (issue #39): every byte it decodes compared with the original and the
      # CPU decoder, then its speed alone on 1 GiB of bf16 output (bar: >= 400 GB/s on an H100).
      chk=$PWD/$BUILD/tests/gpu_decode_check
      if [[ ! -x $chk ]]; then record "gpu_decode_check" "SKIP (not built: no nvcc at build time)"; continue; fi
      if timeout -k 10 600 "$chk" >"$OUT/gpu_decode.log" 2>&1; then
        record "gpu_decode_check: GPU decode bit-identical to CPU" PASS
      else tail -20 "$OUT/gpu_decode.log"; record "gpu_decode_check: GPU decode bit-identical to CPU" FAIL; fi
      grep -E '^gpu-(de|en)code kernel' "$OUT/gpu_decode.log"
      gbs=$(sed -n 's/^gpu-decode kernel bf16: .* \([0-9.]*\) GB\/s.*/\1/p' "$OUT/gpu_decode.log")
      line="gpu_decode_check: kernel bf16 ${gbs:-?} GB/s >= 400"
      if [[ -n $gbs ]] && awk "BEGIN{exit !($gbs >= 400)}"; then record "$line" PASS; else record "$line" FAIL; fi ;;
    gpu)
      py=python3
      $py scripts/examples/train.py --out "$OUT/train_plain.json" >"$OUT/train_plain.log" 2>&1
      LD_PRELOAD=$LIB $py scripts/examples/train.py --out "$OUT/train_zrtier.json" >"$OUT/train_zrtier.log" 2>&1
      if $py scripts/examples/train.py --compare "$OUT/train_plain.json" "$OUT/train_zrtier.json"; then
        record "train.py losses bit-identical" PASS; else tail -5 "$OUT/train_zrtier.log"; record "train.py losses bit-identical" FAIL; fi
      $py scripts/examples/infer.py --out "$OUT/infer_plain.json" >"$OUT/infer_plain.log" 2>&1
      LD_PRELOAD=$LIB $py scripts/examples/infer.py --out "$OUT/infer_zrtier.json" >"$OUT/infer_zrtier.log" 2>&1
      if $py scripts/examples/infer.py --compare "$OUT/infer_plain.json" "$OUT/infer_zrtier.json"; then
        record "infer.py logits bit-identical" PASS; else tail -5 "$OUT/infer_zrtier.log"; record "infer.py logits bit-identical" FAIL; fi
      # CPU stores into pinned buffers between copies (self-checking; plain run as a sanity check).
      if $py scripts/gpu/cpu_writes.py >"$OUT/cpu_writes_plain.log" 2>&1 &&
         LD_PRELOAD=$LIB $py scripts/gpu/cpu_writes.py >"$OUT/cpu_writes_zrtier.log" 2>&1; then
        record "cpu_writes.py: CPU stores reach the GPU" PASS
      else tail -5 "$OUT"/cpu_writes_*.log; record "cpu_writes.py: CPU stores reach the GPU" FAIL; fi
      # Copies of pinned memory captured in a CUDA graph replay with each replay's bytes, and
      # kernels read and write pinned memory through its device pointer (self-checking): plain,
      # the defaults (pinned in place), and a budget below the buffers (pages unpinned and
      # compressed before, pinned again by the capture or the device pointer). cudaHostGetFlags on a
      # region answers as on the driver's own allocation.
      for check in "graph_capture:captured copies replay" "zero_copy:kernels read and write it" \
                   "host_flags:cudaHostGetFlags as the driver"; do
        for cfg in plain defaults budget; do
          env=()
          case $cfg in
            defaults) env=(LD_PRELOAD=$LIB) ;;
            budget) env=(LD_PRELOAD=$LIB ZRTIER_MEMORY=96M) ;;
          esac
          name="${check%%:*}.py ($cfg): ${check#*:}"
          if env "${env[@]}" timeout -k 5 120 $py "scripts/gpu/${check%%:*}.py" >"$OUT/${check%%:*}_$cfg.log" 2>&1; then
            record "$name" PASS
          else tail -5 "$OUT/${check%%:*}_$cfg.log"; record "$name" FAIL; fi
        done
      done
      # fork: a child reads the parent's pinned bytes as they are at its first touch, in every tier
      # (self-checking): pinned in place (defaults), owned T0 slots, the RAM store, a spill file.
      # The plain run checks what plain pinned memory does: a shared mapping, the parent's later
      # bytes, and the child's writes reach the parent.
      fspill=$(mktemp -d /tmp/zrtier-spill.XXXXXX)
      for cfg in plain defaults owned ram file; do
        env=() expect=first-touch
        case $cfg in
          plain) expect=shared ;;
          defaults) env=(LD_PRELOAD=$LIB) ;;
          owned) env=(LD_PRELOAD=$LIB ZRTIER_PIN_IN_PLACE=0 ZRTIER_PINNED_POOL=1G) ;;
          ram) env=(LD_PRELOAD=$LIB ZRTIER_PIN_IN_PLACE=0 ZRTIER_PINNED_POOL=64M ZRTIER_RESIDENT_LIMIT=64M) ;;
          file) env=(LD_PRELOAD=$LIB ZRTIER_PIN_IN_PLACE=0 ZRTIER_PINNED_POOL=64M ZRTIER_RESIDENT_LIMIT=64M
                     ZRTIER_STORE_BACKEND=ram+file ZRTIER_STORE_LIMIT=16M "ZRTIER_SPILL_DIR=$fspill") ;;
        esac
        # A hang (a child stuck, a pipe never closed) is a failure, not a stuck check.
        if env "${env[@]}" timeout -k 5 120 $py scripts/gpu/fork_child.py --expect $expect >"$OUT/fork_child_$cfg.log" 2>&1; then
          record "fork_child.py ($cfg): child reads the parent's bytes" PASS
        else tail -5 "$OUT/fork_child_$cfg.log"; record "fork_child.py ($cfg): child reads the parent's bytes" FAIL; fi
      done
      rm -rf "$fspill"
      wb=$($py -c "import json; print(json.load(open('$OUT/infer_plain.json'))['weight_bytes'])" 2>/dev/null || echo 0)
      if ((wb > 0)); then
        # Pool and resident limit at 25 % of the weights, twice: the compressed rest in the RAM
        # store (the default tiers), and spilled to a file (ram+file with a small RAM store).
        # Bit-identical both times. The memory bar (<= 0.5 x the plain run) is the issue's "peak
        # host memory (RSS plus pinned)": the process's peak RSS (VmHWM), which holds its pinned
        # memory too (cudaHostAlloc's pages are mapped into it), checked on the spilling run. The
        # system-wide peak (MemTotal - MemAvailable above the start) is printed beside it: on the
        # GPU VM it holds 0.5-0.8 GiB on file-spill runs that no /proc/meminfo field explains
        # (docs/decisions.md, "The memory bar: peak RSS plus pinned").
        spill=$(mktemp -d /tmp/zrtier-spill.XXXXXX)
        for cfg in ram file; do
          extra=(); [[ $cfg == file ]] && extra=(ZRTIER_STORE_BACKEND=ram+file ZRTIER_STORE_LIMIT=64M "ZRTIER_SPILL_DIR=$spill")
          env ZRTIER_PINNED_POOL=$((wb / 4)) ZRTIER_RESIDENT_LIMIT=$((wb / 4)) "${extra[@]}" LD_PRELOAD=$LIB \
            $py scripts/examples/infer.py --out "$OUT/infer_small_$cfg.json" >"$OUT/infer_small_$cfg.log" 2>&1
          if $py scripts/examples/infer.py --compare "$OUT/infer_plain.json" "$OUT/infer_small_$cfg.json"; then
            record "infer.py pool+resident 25%, $cfg store: bit-identical" PASS; else tail -5 "$OUT/infer_small_$cfg.log"; record "infer.py pool+resident 25%, $cfg store: bit-identical" FAIL; fi
          $py - "$OUT/infer_plain.json" "$OUT/infer_small_$cfg.json" "$cfg" <<'PYEOF' | tee -a "$OUT/infer_memory.txt"
import json, sys
p, z = (json.load(open(f)) for f in sys.argv[1:3])
for k in ("peak_host_used_above_start_bytes", "peak_rss_bytes"):
    print(f"infer.py {k}: plain {p[k] / 2**30:.2f} GiB, zrtier(pool 25%, resident 25%, {sys.argv[3]} store) "
          f"{z[k] / 2**30:.2f} GiB = {z[k] / p[k]:.2f} x")
print(f"weights {p['weight_bytes'] / 2**30:.2f} GiB; tokens/s plain {p['tokens_per_s']:.2f} zrtier {z['tokens_per_s']:.2f}")
for tag, r in (("plain", p), ("zrtier", z)):
    a = r.get("at_peak", {})
    print(f"  at the {tag} peak ({a.get('phase', '?')}, {a.get('seconds', '?')} s): " +
          ", ".join(f"{k} {v / 2**30:.2f}" for k, v in a.items() if isinstance(v, int)) + " GiB")
PYEOF
        done
        rm -rf "$spill"
        ratio() { $py -c "import json; p=json.load(open('$OUT/infer_plain.json')); z=json.load(open('$OUT/infer_small_$1.json')); print(round(z['$2']/p['$2'],3))" 2>/dev/null || echo nan; }
        rf=$(ratio file peak_rss_bytes); rr=$(ratio ram peak_rss_bytes)
        sf=$(ratio file peak_host_used_above_start_bytes); sr=$(ratio ram peak_host_used_above_start_bytes)
        line="infer.py peak RSS+pinned <= 0.5x (file $rf, ram $rr; system-wide file $sf, ram $sr)"
        if $py -c "import sys; sys.exit(0 if float('$rf') <= 0.5 else 1)" 2>/dev/null; then
          record "$line" PASS; else record "$line" FAIL; fi
      fi ;;
    bench)
      if BENCH_JSON="$OUT/bench-gpu.jsonl" LIB=$LIB scripts/bench-gpu.sh ${BENCH_STAGES:-copy stream infer scan} >"$OUT/bench.log" 2>&1; then
        record "bench-gpu.sh" PASS; else record "bench-gpu.sh" FAIL; fi
      # The summary tables (from the copy table on; a stream- or infer-only run has no copy table).
      if grep -q '^H2D / D2H' "$OUT/bench.log"; then sed -n '/^H2D \/ D2H/,$p' "$OUT/bench.log"
      else sed -n '/^Cyclic streaming\|^CPU scans\|^infer.py tokens/,$p' "$OUT/bench.log"; fi ;;
    suite)
      # The suite of real offloading programs (scripts/examples/), each run in four configs: plain
      # (no zrtier, the baseline, run first), defaults (LD_PRELOAD, no ZRTIER_* option), mem75
      # (ZRTIER_MEMORY = 75 % of the plain run's pinned_bytes, a per-process budget) and mem40file
      # (40 %, store ram+file spilling to a fresh directory); mem75cpu (mem75 with
      # ZRTIER_GPU_DECODE=0: the CPU decodes every chunk) and mem75noenc (mem75 with
      # ZRTIER_GPU_ENCODE=0: the CPU encodes what D2H copies send to the store) when SUITE_CONFIGS
      # names them. One table: bit-identical to plain, speed
      # and peak RSS as ratios to plain (reported, not asserted); $OUT/suite.txt and suite.jsonl.
      #   SUITE_PROGRAMS="weight_streaming infer"  SUITE_CONFIGS="plain mem40file"  narrow it (a plain
      #     run left in $OUT is reused when SUITE_CONFIGS leaves plain out);
      #   SUITE_SMALL=1: a smoke run (--small, or small sizes for infer.py/train.py);
      #   SUITE_TIMEOUT: seconds a run may take (default 900);
      #   SUITE_ARGS_<program>: more arguments for that program's runs (e.g. "--steps 6").
      py=python3
      read -ra suite_progs <<<"${SUITE_PROGRAMS:-weight_streaming save_on_cpu_train fsdp2_offload dataloader_pinned infer train}"
      read -ra suite_cfgs <<<"${SUITE_CONFIGS:-plain defaults mem75 mem40file}"
      # No ZRTIER_* variable or LD_PRELOAD of the caller's reaches a run: each config sets its own.
      suite_clean=(-u LD_PRELOAD)
      for v in $(compgen -e | grep '^ZRTIER_'); do suite_clean+=(-u "$v"); done
      ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
      if [[ ! -f $LIB && " ${suite_cfgs[*]} " != " plain " ]]; then
        record "suite: $LIB" "FAIL (not built: run the build stage first)"; continue
      fi
      : >"$OUT/suite_runs.tsv"
      # suite_run PROGRAM CONFIG [ZRTIER_MEMORY]: one run; its log, JSON and comparison with the plain
      # run go to $OUT/suite_PROGRAM_CONFIG.{log,json,cmp}, a line to suite_runs.tsv; sets suite_ident.
      suite_run() {
        local prog=$1 cfg=$2 mem=${3:-} spill="" rc t0=$SECONDS envs=()
        local json=$OUT/suite_${1}_${2}.json log=$OUT/suite_${1}_${2}.log
        case $cfg in
          plain) ;;
          defaults) envs=("LD_PRELOAD=$LIB") ;;
          mem75) envs=("LD_PRELOAD=$LIB" "ZRTIER_MEMORY=$mem") ;;
          mem75cpu) envs=("LD_PRELOAD=$LIB" "ZRTIER_MEMORY=$mem" ZRTIER_GPU_DECODE=0) ;;
          mem75noenc) envs=("LD_PRELOAD=$LIB" "ZRTIER_MEMORY=$mem" ZRTIER_GPU_ENCODE=0) ;;
          mem40file) spill=$(mktemp -d -t zrtier-suite-spill.XXXXXX)
            envs=("LD_PRELOAD=$LIB" "ZRTIER_MEMORY=$mem" ZRTIER_STORE_BACKEND=ram+file "ZRTIER_SPILL_DIR=$spill") ;;
        esac
        rm -f "$json"
        echo "+ ${envs[*]} ${suite_launch[*]} ${suite_small[*]} --out $json" >"$log"
        # PYTHONFAULTHANDLER: a run that dies of a signal prints every Python thread's stack in its
        # log; ZRTIER_CRASH_REPORT the dying thread's native stack before it.
        [[ $cfg != plain ]] && envs+=(ZRTIER_CRASH_REPORT=1)
        env "${suite_clean[@]}" "${envs[@]}" PYTHONFAULTHANDLER=1 timeout -k 30 "${SUITE_TIMEOUT:-900}" \
          "${suite_launch[@]}" "${suite_small[@]}" --out "$json" >>"$log" 2>&1
        rc=$?
        [[ -n $spill ]] && rm -rf "$spill"
        if ((rc == 124 || rc == 137)); then suite_ident="NO (timeout or killed)"
        elif ((rc != 0)) || [[ ! -s $json ]]; then
          # A JSON next to a failed exit: the program finished its work and died on the way out.
          suite_ident="NO (exit $rc$([[ -s $json ]] && echo ', after writing its JSON'))"
        elif [[ $cfg == plain ]]; then suite_ident=-
        elif $py "$suite_script" --compare "$OUT/suite_${prog}_plain.json" "$json" >"$OUT/suite_${prog}_${cfg}.cmp" 2>&1
        then suite_ident=yes
        else suite_ident=NO; fi
        [[ $suite_ident == NO* ]] && tail -5 "$log"
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$prog" "$cfg" "$rc" "$suite_ident" "$((SECONDS - t0))" "${mem:--}" \
          >>"$OUT/suite_runs.tsv"
        echo "== suite $prog $cfg: exit $rc, identical $suite_ident, $((SECONDS - t0)) s"
      }
      for prog in "${suite_progs[@]}"; do
        suite_script=scripts/examples/$prog.py
        name="suite $prog: bit-identical in every config"
        if [[ ! -f $suite_script ]]; then record "$name" "FAIL (no $suite_script)"; continue; fi
        suite_launch=("$py" "$suite_script")
        if [[ $prog == fsdp2_offload ]]; then
          if ((ngpu < 2)); then record "$name" "SKIP (needs 2 GPUs, found $ngpu)"; continue; fi
          # torchrun passes the environment (LD_PRELOAD, ZRTIER_*) through to the ranks.
          suite_launch=("$py" -m torch.distributed.run --standalone --nproc-per-node 2 "$suite_script")
        fi
        suite_small=()
        # SUITE_ARGS_<program>: more arguments for every run of that program (e.g. fewer steps).
        extra_var=SUITE_ARGS_$prog
        [[ -n ${!extra_var:-} ]] && read -ra suite_small <<<"${!extra_var}"
        if [[ ${SUITE_SMALL:-0} == 1 ]]; then
          case $prog in
            infer) suite_small=(--layers 2 --new-tokens 4) ;;
            train) suite_small=(--layers 2 --steps 4) ;;
            *) suite_small=(--small) ;;
          esac
        fi
        plain_json=$OUT/suite_${prog}_plain.json
        if [[ " ${suite_cfgs[*]} " == *" plain "* || ! -s $plain_json ]]; then
          suite_run "$prog" plain
          if [[ $suite_ident != - ]]; then record "$name" "FAIL (plain run: $suite_ident)"; continue; fi
        else
          echo "== suite $prog plain: reusing $plain_json"
          printf '%s\tplain\t0\t-\t0\t-\n' "$prog" >>"$OUT/suite_runs.tsv"
        fi
        pinned=$($py -c 'import json, sys; print(int(json.load(open(sys.argv[1])).get("pinned_bytes") or 0))' \
                 "$plain_json" 2>/dev/null || echo 0)
        verdict=PASS; detail=()
        for cfg in "${suite_cfgs[@]}"; do
          [[ $cfg == plain ]] && continue
          case $cfg in
            defaults) suite_run "$prog" "$cfg" ;;
            mem75|mem75cpu|mem75noenc|mem40file)
              if ((pinned <= 0)); then
                suite_ident="SKIP (plain run has no pinned_bytes)"
                printf '%s\t%s\t-\t%s\t0\t-\n' "$prog" "$cfg" "$suite_ident" >>"$OUT/suite_runs.tsv"
              else
                pct=75; [[ $cfg == mem40file ]] && pct=40
                suite_run "$prog" "$cfg" $((pinned * pct / 100))
              fi ;;
            *) suite_ident="NO (unknown config)" ;;
          esac
          detail+=("$cfg ${suite_ident%% *}")
          [[ $suite_ident == yes || $suite_ident == SKIP* ]] || verdict=FAIL
        done
        ((${#detail[@]})) || detail=("plain only")
        record "$name ($(IFS=,; echo "${detail[*]}" | sed 's/,/, /g'))" "$verdict"
      done
      if [[ -s $OUT/suite_runs.tsv ]]; then
        echo; $py scripts/examples/suite_util.py table "$OUT" || record "suite table" FAIL
      fi ;;
    *) echo "device-check: unknown stage $stage" >&2; exit 2 ;;
  esac
done
echo; echo "device-check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), $(date -u +%F))"
printf '%s\n' "${results[@]}" | tee "$OUT/summary.txt"
! printf '%s\n' "${results[@]}" | grep -q FAIL
