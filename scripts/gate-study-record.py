#!/usr/bin/env python3
"""Records a gate study's runs as test data for the gate's model (roofline/data/gate-study-*.json).

Usage: scripts/gate-study-record.py DIR OUT.json "what was run, where, when"

Reads DIR/q*.json and DIR/s*.json (machine.json files written by scripts/gate-study.sh) and
keeps what the gate reads of each: per ceiling [unit, value, samples], the one-core clock, and
whether the probe's load check found the machine busy.
"""
import json
import re
import sys
from pathlib import Path


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, out, what = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    runs = []
    key = lambda p: (p.stem[0], int(p.stem[1:]))
    files = sorted((p for p in src.glob("*.json") if re.fullmatch(r"[qs]\d+", p.stem)), key=key)
    if not files:
        sys.exit(f"no q*.json or s*.json in {src}")
    for p in sorted(files, key=lambda p: (int(p.stem[1:]), p.stem[0] == "q")):
        m = json.loads(p.read_text())
        prov = m["provenance"]
        clock = (prov["cpu"].get("measured_clock_hz_t1") or {}).get("median")
        load = prov.get("load") or {}
        runs.append({
            "name": p.stem,
            "busy": bool(load.get("busy")),
            "clock_hz_t1": clock,
            "metrics": {
                c["id"]: [c["unit"], c["value"], c["stats"]["values"]] for c in m["ceilings"]
            },
        })
    cpu = runs and json.loads(files[0].read_text())["provenance"]["cpu"]
    doc = {
        "what": what,
        "cpu": {k: cpu.get(k) for k in ("vendor", "model_name", "family", "model", "stepping", "cores", "simd")},
        "runs": runs,
    }
    out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{out}: {len(runs)} runs")


if __name__ == "__main__":
    main()
