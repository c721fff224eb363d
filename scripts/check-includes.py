#!/usr/bin/env python3
"""Checks every #include "..." of the source tree against the layer table in runtime/README.md.

  scripts/check-includes.py            # the whole tree; exit 1 and one line per violation
  scripts/check-includes.py --table    # prints the rules as read from the table

A file is covered by the most specific row: its own (a row naming the file), else its folder's, else
the row of the nearest folder above that ends its cell in "anything" (tests/). An include is allowed
when it names a file of the same folder, or lies under (or is) an entry of the row's "may include"
cell. "zrtier/x.h" stands for include/zrtier/x.h.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "runtime", "README.md")
SOURCES = (".cc", ".h", ".c")
TREES = ("include", "runtime", "preload", "tools", "tests")


def read_rules():
    rules = {}
    for line in open(TABLE, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        allowed = re.findall(r"`([^`]+)`", cells[2])
        anything = cells[2] == "anything"
        for name in names:
            rules[name.rstrip("/")] = (allowed, anything)
    if not rules:
        sys.exit(f"check-includes: no layer table found in {TABLE}")
    return rules


def rule_for(path, rules):
    if path in rules:
        return path, rules[path]
    folder = os.path.dirname(path)
    if folder in rules:
        return folder, rules[folder]
    parts = folder.split("/")
    for n in range(len(parts) - 1, 0, -1):
        up = "/".join(parts[:n])
        if up in rules and rules[up][1]:
            return up, rules[up]
    return None, None


def allowed(target, path, entries):
    if os.path.dirname(target) == os.path.dirname(path):
        return True
    for e in entries:
        e = e.rstrip("/")
        if target == e or target.startswith(e + "/"):
            return True
    return False


def main():
    rules = read_rules()
    if "--table" in sys.argv:
        for name, (entries, anything) in sorted(rules.items()):
            print(f"{name}: {'anything' if anything else ' '.join(entries) or '(own folder only)'}")
        return 0
    bad = []
    uncovered = []
    for tree in TREES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, tree)):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), ROOT)
                row, rule = rule_for(path, rules)
                if rule is None:
                    uncovered.append(path)
                    continue
                entries, anything = rule
                if anything:
                    continue
                for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    target = m.group(1)
                    if target.startswith("zrtier/"):
                        target = "include/" + target
                    if "/" not in target:
                        target = os.path.join(os.path.dirname(path), target)
                    if not allowed(target, path, entries):
                        bad.append(f"{path}:{n}: includes {m.group(1)}, which the row `{row}` of "
                                   f"runtime/README.md does not allow")
    for u in uncovered:
        bad.append(f"{u}: no row of runtime/README.md covers this file (add its folder)")
    for b in bad:
        print(b)
    if bad:
        print(f"check-includes: {len(bad)} violation(s)", file=sys.stderr)
        return 1
    print("check-includes: every include follows the layer table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
