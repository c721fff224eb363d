# Covers `zrtier bench codec`: speeds are the median of at least 3 full passes with min and max in
# the JSON; on a model (safetensors files or a directory of them) the bytes measured are spread over
# the whole model -- the ratio of a 1 MiB sample matches the whole model's where the first half is
# thousands of small tensors -- and are reported; a directory of shards, the shards listed and one
# file of the same tensors give the same rows; bad paths fail naming the path.
source "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "python3 writes the test's safetensors files"
dir=$(mktemp -d /tmp/zrtier_bench_codec.XXXXXX)
trap 'rm -rf "$dir"' EXIT

# json_num ROW KEY: the number after "KEY": in one JSON row.
json_num() { sed -n "s/.*\"$2\": \([-0-9.e+]*\).*/\1/p" <<<"$1"; }
# the zrtier row of a --json run, without its timings (which differ between runs)
zrtier_row() { grep '"codec": "zrtier"' <<<"$1" | sed 's/, "\(en\|de\)code_[a-z_]*": [0-9.]*//g'; }
# expect_between X LO HI WHAT (floating point)
expect_between() {
  awk -v x="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(x >= lo && x <= hi) }' ||
    fail "$4: $1 not in [$2, $3]"
}

# Sample data: JSON keys, passes, min <= median <= max.
out=$("$ZRTIER" bench codec --data bf16 --bytes 1M --chunk 64K --seconds 0.01 --json) ||
  fail "bench codec --data bf16 failed"
expect_status 4 "$(grep -c '^{' <<<"$out")" "bench codec --data bf16 rows"
row=$(grep '"codec": "zrtier"' <<<"$out")
for dir_ in encode decode; do
  for key in ${dir_}_mbps_per_core ${dir_}_mbps_per_core_min ${dir_}_mbps_per_core_max \
      ${dir_}_passes; do
    [[ -n "$(json_num "$row" $key)" ]] || fail "bench codec --json lacks $key: $row"
  done
  med=$(json_num "$row" ${dir_}_mbps_per_core)
  expect_between "$med" "$(json_num "$row" ${dir_}_mbps_per_core_min)" \
    "$(json_num "$row" ${dir_}_mbps_per_core_max)" "$dir_ median between min and max"
  expect_between "$(json_num "$row" ${dir_}_passes)" 3 1000000 "$dir_ passes"
done
expect_status 1048576 "$(json_num "$row" bytes)" "bench codec --bytes 1M bytes"

# A model whose first half is 4000 tensors of 1 KiB of random bytes (4096000 bytes) and whose
# second half is one 4 MiB tensor of zeros: one file, and the same tensors as two shards in a
# directory (beside an index and a README, which a directory does not include).
python3 - "$dir" <<'PY'
import json, os, random, struct, sys
d = sys.argv[1]
small = [("a.%04d" % i, random.Random(i).randbytes(1024)) for i in range(4000)]
large = [("b", bytes(4 << 20))]
def write(path, tensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, data in tensors:
        header[name] = {"dtype": "BF16", "shape": [len(data) // 2],
                        "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, data in tensors:
            f.write(data)
write(os.path.join(d, "model.safetensors"), small + large)
os.mkdir(os.path.join(d, "shards"))
write(os.path.join(d, "shards", "model-00001-of-00002.safetensors"), small)
write(os.path.join(d, "shards", "model-00002-of-00002.safetensors"), large)
open(os.path.join(d, "shards", "model.safetensors.index.json"), "w").write("{}")
open(os.path.join(d, "shards", "README.md"), "w").write("# a model\n")
PY
[[ $? == 0 ]] || fail "writing the test's safetensors files"

codec() { "$ZRTIER" bench codec --chunk 64K --seconds 0.01 --json "$@"; }
all=$(codec --max-bytes 64M "$dir/model.safetensors") || fail "bench codec FILE failed"
all_row=$(grep '"codec": "zrtier"' <<<"$all")
expect_status 8290304 "$(json_num "$all_row" bytes)" "whole model: bytes measured"
expect_status 8290304 "$(json_num "$all_row" bytes_total)" "whole model: bytes_total"
expect_status 4001 "$(json_num "$all_row" tensors)" "whole model: tensors"
expect_status 4001 "$(json_num "$all_row" tensors_read)" "whole model: tensors_read"
whole=$(json_num "$all_row" ratio)

sample=$(codec --max-bytes 1M "$dir/model.safetensors") || fail "bench codec --max-bytes 1M failed"
row=$(grep '"codec": "zrtier"' <<<"$sample")
expect_between "$(json_num "$row" bytes)" 943718 1258291 "1 MiB sample: bytes measured"
expect_status 8290304 "$(json_num "$row" bytes_total)" "1 MiB sample: bytes_total"
expect_between "$(json_num "$row" tensors_read)" 400 600 "1 MiB sample: tensors_read"
ratio=$(json_num "$row" ratio)
expect_between "$ratio" "$(awk -v r="$whole" 'BEGIN { print r * 0.95 }')" \
  "$(awk -v r="$whole" 'BEGIN { print r * 1.05 }')" "1 MiB sample's ratio, whole model's $whole"

# Shards: the directory, the files listed, and the one file give the same rows.
one=$(zrtier_row "$sample")
shards=$(codec --max-bytes 1M "$dir/shards") || fail "bench codec DIR failed"
expect_status "$one" "$(zrtier_row "$shards")" "bench codec DIR against FILE"
listed=$(codec --max-bytes 1M "$dir"/shards/*.safetensors) || fail "bench codec FILE FILE failed"
expect_status "$one" "$(zrtier_row "$listed")" "bench codec FILE FILE against FILE"
# The table says what it read.
table=$("$ZRTIER" bench codec --chunk 64K --seconds 0.01 --max-bytes 1M "$dir/shards") ||
  fail "bench codec DIR (table) failed"
expect_contains "$table" "of 4001" "bench codec table: tensors read"
expect_contains "$table" "of 7.9" "bench codec table: MiB read"

# Bad paths fail with status 1, naming the path and the problem.
err=$("$ZRTIER" bench codec "$dir/missing.safetensors" 2>&1); expect_status 1 $? "missing file"
expect_contains "$err" "No such file or directory: $dir/missing.safetensors" "missing file message"
err=$("$ZRTIER" bench codec "$dir/shards/README.md" 2>&1); expect_status 1 $? "not safetensors"
expect_contains "$err" "$dir/shards/README.md: safetensors" "not safetensors message"
mkdir "$dir/empty"
err=$("$ZRTIER" bench codec "$dir/empty" 2>&1); expect_status 1 $? "directory without shards"
expect_contains "$err" "$dir/empty: no .safetensors file in it" "directory without shards message"
err=$("$ZRTIER" bench codec /dev/null 2>&1); expect_status 1 $? "bench codec /dev/null"
expect_contains "$err" "/dev/null is neither a file nor a directory" "bench codec /dev/null message"
err=$("$ZRTIER" bench codec --dtype bf16 "$dir/shards" 2>&1); expect_status 1 $? "--dtype DIR"
expect_contains "$err" "Is a directory: $dir/shards" "--dtype DIR message"
echo "PASS"
