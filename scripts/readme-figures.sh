#!/usr/bin/env bash
# Regenerates the example `roofline probe` table of the README and docs/methodology.md — the
# block between the `<!-- figures:probe -->` and `<!-- /figures:probe -->` markers — from a
# probe of this machine,
# and stamps it with the machine, the date and the revision it came from (the test
# tests/docs_stamped.rs fails on a figure without a stamp).
#
# Usage: scripts/readme-figures.sh [probe arguments, e.g. --quick]   (a full probe: minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=target/release/roofline
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BIN" probe -o "$tmp/machine.json" "$@" > "$tmp/table.txt"
# The revision, `-dirty` when files other than the two pages (which this script rewrites) differ.
rev=$(git describe --always --abbrev=7)
git diff --quiet HEAD -- . ':!README.md' ':!docs/methodology.md' || rev="$rev-dirty"
python3 - "$tmp/table.txt" "$tmp/machine.json" "$rev" <<'PY'
import json, re, subprocess, sys, datetime
table, machine, rev = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
lines = open(table).read().split("\n")
ids = ["cpu/fma/f32/t1", "cpu/fma/f32/all", "cpu/fma/bf16/all", "cpu/mem/L1/triad/t1",
       "cpu/mem/L2/triad/t1", "cpu/mem/L3/triad/t1", "cpu/mem/DRAM/triad/t1",
       "cpu/gemm/f32/all", "cpu/conv/f32/all"]
head = [l for l in lines[:3]]
header = next(l for l in lines if l.startswith("ceiling "))
rows = [l for i in ids for l in lines if l.split(" ")[0].rstrip("*") == i]
cpu = machine["provenance"]["cpu"]
date = machine["provenance"]["time_utc"][:10]
who = f'{cpu["model_name"]} (family {cpu["family"]} model {cpu["model"]}), {cpu["cores"]} cores, {cpu["simd"]}'
block = ["```", *head, header, *rows, "...", "```", "",
         f"Measured on {who}, {date}, revision {rev} (`scripts/readme-figures.sh`)."]
for page in ["README.md", "docs/methodology.md"]:
    text = open(page).read()
    new, n = re.subn(r"(<!-- figures:probe -->\n).*?(\n<!-- /figures:probe -->)",
                     lambda m: m.group(1) + "\n".join(block) + m.group(2), text, flags=re.S)
    if n != 1:
        sys.exit(f"{page}: the figures:probe markers are missing")
    open(page, "w").write(new)
print("\n".join(block))
PY
