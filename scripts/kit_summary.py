#!/usr/bin/env python3
"""The GPU bring-up kit's record of one call, rewritten as every step starts and ends.

  kit_summary.py --work WORK --out OUT --call 1 --budget 480 --reserve 45 --spent 120 [--dry-run]
  kit_summary.py --validate summary.json [--schema summary.schema.json]

gpu-bringup.sh runs it after each step: it reads the call's work folder (steps.jsonl, one line
per step as it starts and ends; the machine files; train/<step>.json; peers.json; automl/*.json;
placements) and writes OUT/summary.json and OUT/summary.txt, each atomically (a call killed
at any point leaves the last whole pair). summary.json is peers.py's record (roofline beside
PyTorch and torchvision: resnet50[], ewa[], conv[], ceilings[], automl[]) with the kit's own:
the call, its budget and clock, and every step with its status, seconds, limit, estimate and
the estimate's source. --validate checks a summary against summary.schema.json (a subset of
JSON Schema: type, required, properties, items, enum, minimum) and exits 1 naming the first
field that breaks it.
"""
import argparse
import glob
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peers  # noqa: E402

SCHEMA = "roofline/gpu-bringup-summary/v2"


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def steps_of(path):
    """The steps in the order they started, each as its last line says (running, then its end)."""
    order, last = [], {}
    for line in open(path) if os.path.exists(path) else []:
        line = line.strip()
        if not line:
            continue
        try:
            s = json.loads(line)
        except ValueError:
            continue
        name = s.get("name")
        if name not in last:
            order.append(name)
        last[name] = s
    out = []
    for name in order:
        s = last[name]
        num = lambda k: float(s[k]) if s.get(k) not in (None, "") else None  # noqa: E731
        out.append({
            "name": name, "status": s.get("status"), "seconds": num("seconds"),
            "limit_s": num("limit_s"), "estimate_s": num("estimate_s"),
            "estimate_source": s.get("source"), "why": s.get("why") or None,
            "args": s.get("args", ""),
        })
    return out


def merged_machine(work):
    """Call 1's machine file (from an earlier call), this call's probes on top: ceilings and
    tables by id, the later file's where both have one."""
    files = ["machine-call1.json", "machine.json", "machine-conv.json", "machine-fma.json"]
    merged = None
    for name in files:
        m = read_json(os.path.join(work, name))
        if not m:
            continue
        if merged is None:
            merged = dict(m)
            merged["ceilings"], merged["tables"] = [], []
        for key in ("ceilings", "tables"):
            ids = {c.get("id") for c in m.get(key, [])}
            merged[key] = [c for c in merged[key] if c.get("id") not in ids] + list(m.get(key, []))
    return merged


def train_lines(work, steps, dry):
    """Each training's report as a line of train.jsonl, with the step's precision and batch
    (in a dry run the CPU stood in for them: what it ran is kept under kit_ran)."""
    lines = []
    for s in steps:
        path = os.path.join(work, "train", s["name"] + ".json")
        t = read_json(path)
        if not t:
            continue
        args = s["args"].split()
        t["kit_step"] = s["name"]
        if dry and args:
            t["kit_ran"] = {"precision": t.get("precision"), "batch": t.get("batch")}
            t["precision"] = args[0]
            t["batch"] = int(args[-1])
        lines.append(json.dumps(t))
    return lines


def write_atomic(path, text):
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def build(a):
    work = a.work
    steps = steps_of(os.path.join(work, "steps.jsonl"))
    machine = merged_machine(work)
    mpath = os.path.join(work, ".machine-merged.json")
    if machine:
        with open(mpath, "w") as f:
            json.dump(machine, f)
    tpath = os.path.join(work, ".train.jsonl")
    with open(tpath, "w") as f:
        f.write("\n".join(train_lines(work, steps, a.dry_run)) + "\n")
    placements = sorted(glob.glob(os.path.join(work, "placement*.json")))
    automl = sorted(glob.glob(os.path.join(work, "automl", "*.json")))
    automl = [p for p in automl if (read_json(p) or {}).get("schema", "").startswith("roofline/automl")]
    args = types.SimpleNamespace(machine=mpath if machine else None, train=tpath,
                                 peers=os.path.join(work, "peers.json"), placement=placements,
                                 automl=automl, json=None)
    lines = []
    prefix = "cpu/" if a.dry_run else "gpu0/"
    record = peers.summary(args, say=lines.append, prefix=prefix)
    record["schema"] = SCHEMA
    counts = {k: sum(1 for s in steps if s["status"] == k) for k in ("pass", "fail", "skipped", "running")}
    record["kit"] = {
        "call": a.call, "dry_run": a.dry_run, "budget_s": a.budget, "reserve_s": a.reserve,
        "spent_s": a.spent, "clock": a.clock, "counts": counts, "writes": a.writes,
        "estimated_s": sum(s["estimate_s"] or 0 for s in steps),
    }
    record["steps"] = steps
    head = [f"roofline bring-up, call {a.call}{' (dry run on the CPU)' if a.dry_run else ''}: "
            f"{a.spent:.0f} s of {a.budget:.0f} s spent ({a.clock} clock); "
            f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped"
            + (f", {counts['running']} running" if counts["running"] else "")]
    for s in steps:
        took = f"{s['seconds']:.0f}s" if s["seconds"] is not None else "-"
        est = f"{s['estimate_s']:.0f}s" if s["estimate_s"] is not None else "-"
        head.append(f"  {s['name']:<22} {s['status']:<8} {took:>5} (limit {s['limit_s'] or 0:.0f}s, "
                    f"estimate {est}){'  ' + s['why'] if s['why'] else ''}")
    # The steps' own times, for docs/gpu/step-times.tsv (a GPU's replace the estimates).
    if not a.dry_run:
        where = f"{record.get('gpu') or 'GPU'}, {str(record.get('time_utc') or '')[:10]}, revision {record.get('revision') or '?'}"
        timed = [f"{s['name']}\t{s['seconds']:.0f}\t{where}" for s in steps
                 if s["status"] == "pass" and s["seconds"] is not None]
        if timed:
            lines += ["", "for docs/gpu/step-times.tsv (name, seconds, where measured):"] + timed
    return record, "\n".join(head + [""] + lines) + "\n"


# ---- a JSON Schema subset ------------------------------------------------------------------

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
         "integer": int, "number": (int, float)}


def check(value, schema, where="$"):
    """The first way `value` breaks `schema` (a subset of JSON Schema), or None."""
    want = schema.get("type")
    if want is not None:
        kinds = want if isinstance(want, list) else [want]
        ok = any(isinstance(value, TYPES[k]) and not (k in ("integer", "number") and isinstance(value, bool))
                 for k in kinds)
        if not ok:
            return f"{where}: {json.dumps(value)[:80]} is not {' or '.join(kinds)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {value!r} is not one of {schema['enum']}"
    if "minimum" in schema and isinstance(value, (int, float)) and not isinstance(value, bool) \
            and value < schema["minimum"]:
        return f"{where}: {value} is below {schema['minimum']}"
    if isinstance(value, dict):
        for k in schema.get("required", []):
            if k not in value:
                return f"{where}: no field '{k}'"
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                e = check(value[k], sub, f"{where}.{k}")
                if e:
                    return e
    if isinstance(value, list) and "items" in schema:
        if len(value) < schema.get("minItems", 0):
            return f"{where}: {len(value)} items, fewer than {schema['minItems']}"
        for i, v in enumerate(value):
            e = check(v, schema["items"], f"{where}[{i}]")
            if e:
                return e
    return None


def validate(path, schema_path):
    schema = read_json(schema_path)
    if schema is None:
        print(f"{schema_path}: no schema", file=sys.stderr)
        return 2
    doc = read_json(path)
    if doc is None:
        print(f"{path}: not JSON", file=sys.stderr)
        return 1
    e = check(doc, schema)
    if e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    print(f"{path}: valid against {os.path.basename(schema_path)}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work")
    ap.add_argument("--out")
    ap.add_argument("--call", default="1")
    ap.add_argument("--budget", type=float, default=480)
    ap.add_argument("--reserve", type=float, default=45)
    ap.add_argument("--spent", type=float, default=0)
    ap.add_argument("--clock", default="real")
    ap.add_argument("--writes", type=int, default=1, help="how many times this call has written its summary, this one included")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--validate", metavar="SUMMARY")
    ap.add_argument("--schema", help="default: summary.schema.json beside this script, else docs/gpu's")
    a = ap.parse_args()
    if a.validate:
        schema = a.schema or os.path.join(HERE, "summary.schema.json")
        if not os.path.exists(schema):
            schema = os.path.join(HERE, "..", "docs", "gpu", "summary.schema.json")
        return validate(a.validate, schema)
    if not a.work or not a.out:
        ap.error("--work and --out (or --validate)")
    record, text = build(a)
    write_atomic(os.path.join(a.out, "summary.json"), json.dumps(record, indent=1) + "\n")
    write_atomic(os.path.join(a.out, "summary.txt"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
