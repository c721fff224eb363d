#!/usr/bin/env python3
"""A strict checker of the Prometheus text exposition format (version 0.0.4), for the tests.

  prom_validate.py [--labels pid,cmd] [--except NAME,...] < exposition
  prom_validate.py --self-test     # the checker refuses each of a list of broken texts

Checks: every line is a comment, blank, or a sample; metric and label names are valid; label values
use only the escapes \\\\, \\" and \\n and are valid UTF-8; values are floats (or +Inf, -Inf, NaN);
each family has at most one HELP and one TYPE, the TYPE before its samples, and its samples in one
group; no series repeats; a counter's samples end in _total; a histogram's samples are _bucket (with
le), _sum and _count; per series, le values ascend, bucket counts never decrease, the last bucket is
le="+Inf" and equals _count; a summary's quantile label is a float in [0, 1]. With --labels, every
sample outside --except carries those labels. When the python prometheus_client parser is installed
the text must also parse with it. Exit 0 and "ok N samples", or exit 1 naming the first problem.
"""
import argparse
import math
import re
import sys

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class Invalid(Exception):
    pass


def parse_float(text, where):
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise Invalid(f"{where}: '{text}' is not a float")
    return float(text)


def parse_labels(text, pos, where):
    """Parses {a="x",b="y"} starting at text[pos] == '{'; returns (dict, position after '}')."""
    labels = {}
    pos += 1
    while True:
        if pos < len(text) and text[pos] == "}":
            return labels, pos + 1
        m = LABEL.match(text, pos)
        if not m:
            raise Invalid(f"{where}: bad label name at column {pos}")
        name = m.group(0)
        if name in labels:
            raise Invalid(f"{where}: label {name} given twice")
        pos = m.end()
        if text[pos:pos + 2] != '="':
            raise Invalid(f"{where}: expected =\" after label {name}")
        pos += 2
        value = []
        while True:
            if pos >= len(text):
                raise Invalid(f"{where}: unterminated value of label {name}")
            c = text[pos]
            if c == "\\":
                nxt = text[pos + 1:pos + 2]
                if nxt not in ("\\", '"', "n"):
                    raise Invalid(f"{where}: bad escape \\{nxt} in label {name}")
                value.append({"\\": "\\", '"': '"', "n": "\n"}[nxt])
                pos += 2
            elif c == '"':
                pos += 1
                break
            elif c == "\n":
                raise Invalid(f"{where}: raw newline in label {name}")
            else:
                value.append(c)
                pos += 1
        labels[name] = "".join(value)
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos < len(text) and text[pos] == "}":
            continue
        else:
            raise Invalid(f"{where}: expected , or }} after label {name}")


def family_of(name, types):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if types.get(base) in ("histogram", "summary"):
                return base
    return name


def validate(text, required_labels=(), exempt=()):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Invalid(f"not UTF-8: {e}")
    if text and not text.endswith("\n"):
        raise Invalid("the last line does not end in a newline")
    helps, types = {}, {}
    done = set()  # families whose group of samples has ended
    current = None
    series = set()
    hist = {}  # (family, labels without le) -> {"buckets": [(le, v)], "sum", "count"}
    samples = 0
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = f"line {n}"
        if line == "":
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.fullmatch(name):
                    raise Invalid(f"{where}: bad metric name {name!r}")
                if parts[1] == "HELP":
                    if name in helps:
                        raise Invalid(f"{where}: second HELP for {name}")
                    help_text = parts[3] if len(parts) > 3 else ""
                    if re.search(r"\\[^\\n]", help_text.replace("\\\\", "")):
                        raise Invalid(f"{where}: bad escape in HELP of {name}")
                    helps[name] = help_text
                else:
                    if name in types:
                        raise Invalid(f"{where}: second TYPE for {name}")
                    if len(parts) != 4 or parts[3] not in TYPES:
                        raise Invalid(f"{where}: bad TYPE line")
                    if name in done or name == current:
                        raise Invalid(f"{where}: TYPE of {name} after its samples")
                    types[name] = parts[3]
            continue
        m = NAME.match(line)
        if not m:
            raise Invalid(f"{where}: bad metric name")
        name = m.group(0)
        pos = m.end()
        labels = {}
        if pos < len(line) and line[pos] == "{":
            labels, pos = parse_labels(line, pos, where)
        rest = line[pos:]
        if not rest.startswith(" "):
            raise Invalid(f"{where}: expected a space before the value")
        fields = rest.split()
        if len(fields) not in (1, 2):
            raise Invalid(f"{where}: expected a value and an optional timestamp")
        value = parse_float(fields[0], where)
        if len(fields) == 2 and not re.fullmatch(r"-?\d+", fields[1]):
            raise Invalid(f"{where}: bad timestamp")
        samples += 1
        fam = family_of(name, types)
        kind = types.get(fam, "untyped")
        if fam != current:
            if fam in done:
                raise Invalid(f"{where}: samples of {fam} are not in one group")
            if current is not None:
                done.add(current)
            current = fam
        key = (name, tuple(sorted(labels.items())))
        if key in series:
            raise Invalid(f"{where}: series {name}{labels} repeats")
        series.add(key)
        if required_labels and fam not in exempt:
            missing = [l for l in required_labels if l not in labels]
            if missing:
                raise Invalid(f"{where}: {name} lacks labels {missing}")
        if kind == "counter":
            if name != fam or not name.endswith("_total"):
                raise Invalid(f"{where}: counter sample {name} does not end in _total")
            if value < 0:
                raise Invalid(f"{where}: negative counter")
        elif kind == "gauge" or kind == "untyped":
            if name != fam:
                raise Invalid(f"{where}: {name} does not belong to {kind} {fam}")
        elif kind == "summary":
            if name == fam:
                q = parse_float(labels.get("quantile", "x"), where)
                if not 0 <= q <= 1:
                    raise Invalid(f"{where}: quantile out of [0, 1]")
            elif name not in (fam + "_sum", fam + "_count"):
                raise Invalid(f"{where}: {name} does not belong to summary {fam}")
        elif kind == "histogram":
            base = {k: v for k, v in labels.items() if k != "le"}
            h = hist.setdefault((fam, tuple(sorted(base.items()))),
                                {"buckets": [], "sum": None, "count": None})
            if name == fam + "_bucket":
                if "le" not in labels:
                    raise Invalid(f"{where}: bucket without le")
                le = parse_float(labels["le"], where)
                if h["buckets"] and le <= h["buckets"][-1][0]:
                    raise Invalid(f"{where}: le {labels['le']} does not ascend")
                if h["buckets"] and value < h["buckets"][-1][1]:
                    raise Invalid(f"{where}: bucket count decreases")
                h["buckets"].append((le, value))
            elif name == fam + "_sum":
                h["sum"] = value
            elif name == fam + "_count":
                h["count"] = value
            else:
                raise Invalid(f"{where}: {name} does not belong to histogram {fam}")
            if "le" in labels and name != fam + "_bucket":
                raise Invalid(f"{where}: le on {name}")
    for (fam, labels), h in hist.items():
        what = f"histogram {fam}{dict(labels)}"
        if not h["buckets"] or h["buckets"][-1][0] != math.inf:
            raise Invalid(f"{what}: no le=\"+Inf\" bucket")
        if h["count"] is None or h["sum"] is None:
            raise Invalid(f"{what}: no _count or _sum")
        if h["buckets"][-1][1] != h["count"]:
            raise Invalid(f"{what}: +Inf bucket {h['buckets'][-1][1]} != _count {h['count']}")
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        pass
    else:
        for _ in text_string_to_metric_families(text):
            pass
    return samples


GOOD = """# HELP a_total a counter
# TYPE a_total counter
a_total{pid="1",cmd="x \\"q\\" \\\\ \\n"} 3
# TYPE h_seconds histogram
h_seconds_bucket{pid="1",le="0.5"} 1
h_seconds_bucket{pid="1",le="+Inf"} 2
h_seconds_sum{pid="1"} 0.75
h_seconds_count{pid="1"} 2
"""

# Each of these breaks one rule: the checker must refuse every one.
BAD = {
    "+Inf bucket != _count": GOOD.replace('h_seconds_count{pid="1"} 2', 'h_seconds_count{pid="1"} 3'),
    "decreasing buckets": GOOD.replace('le="+Inf"} 2', 'le="+Inf"} 0').replace("} 2\n", "} 0\n"),
    "no +Inf bucket": GOOD.replace('h_seconds_bucket{pid="1",le="+Inf"} 2\n', ""),
    "no _sum": GOOD.replace('h_seconds_sum{pid="1"} 0.75\n', ""),
    "le not ascending": GOOD.replace('le="0.5"', 'le="+Inf"'),
    "bad escape": GOOD.replace(' \\n"', ' \\x"'),
    "counter without _total": GOOD.replace("a_total", "a"),
    "repeated series": GOOD.replace("# TYPE h_seconds", 'a_total{pid="1",cmd="x \\"q\\" \\\\ \\n"} 3\n# TYPE h_seconds'),
    "TYPE after samples": GOOD + "# TYPE a_total counter\n",
    "split group": GOOD + 'a_total{pid="2"} 1\n',
    "bad value": GOOD.replace("} 3", "} three"),
    "bad metric name": GOOD.replace("h_seconds_sum", "h-seconds_sum"),
    "unterminated label": GOOD.replace('a_total{pid="1",', 'a_total{pid="1,'),
    "no final newline": GOOD.rstrip("\n"),
}


def self_test():
    validate(GOOD, ["pid"], ["a"])
    for why, text in BAD.items():
        try:
            validate(text)
        except Invalid:
            continue
        raise SystemExit(f"prom_validate self-test: accepted {why}")
    try:
        validate(GOOD.replace('h_seconds_sum{pid="1"}', "h_seconds_sum"), ["pid"])
    except Invalid:
        pass
    else:
        raise SystemExit("prom_validate self-test: accepted a sample without a required label")
    print(f"self-test ok ({len(BAD) + 1} bad texts refused)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--labels", default="")
    ap.add_argument("--except", dest="exempt", default="")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return 0
    text = sys.stdin.buffer.read()
    try:
        decoded = text.decode("utf-8")
        n = validate(decoded, [l for l in args.labels.split(",") if l],
                     [e for e in args.exempt.split(",") if e])
    except (Invalid, UnicodeDecodeError, ValueError) as e:
        print(f"prom_validate: {e}", file=sys.stderr)
        return 1
    print(f"ok {n} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
