"""The AutoML runs of a bring-up, for peers.py --summary --automl FILE (and alone: FILE...).

Each automl.json gives its device (cpu, or cuda and its GPUs, a worker each), precision,
resolution and starting network, and AIPerf's figures: candidates a minute, the score (the
series' highest FLOPS), the regulated score, the workers' share of the run spent training, the
master's busy seconds, the FLOPS series. On GPUs the score per GPU is set beside AIPerf's
published one: 56.1 TOPS on 4 nodes of 8 T4s (Ren et al., AIPerf, 2021), about 1.75 TOPS a GPU,
measured on ImageNet at 224² from ResNet-50; a run on other data or sizes compares only in kind.
"""
import json
import sys

AIPERF_TOPS = 56.1e12
AIPERF_GPUS = 32
AIPERF_PER_GPU = AIPERF_TOPS / AIPERF_GPUS


def workers_of(conf):
    """The run's workers: a list of core lists (threads), or "N teams of ..." (MPI)."""
    w = conf.get("workers")
    if isinstance(w, list):
        return len(w)
    if isinstance(w, str) and w.split(" ", 1)[0].isdigit():
        return int(w.split(" ", 1)[0])
    return None


def summary(paths):
    """Lines for summary.txt and a record per run for summary.json."""
    lines, records = [], []
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            lines.append(f"automl {path}: not read ({e})")
            continue
        conf, s = doc.get("configuration", {}), doc.get("score", {})
        device = str(conf.get("device", "cpu"))
        gpu = device.startswith("cuda")
        workers = workers_of(conf)
        flops = s.get("flops") or 0.0
        per_gpu = flops / workers if gpu and workers else None
        rec = {
            "file": path,
            "device": device,
            "precision": conf.get("precision", "f32"),
            "resolution": conf.get("resolution"),
            "start": conf.get("start"),
            "workers": workers,
            "elapsed_s": s.get("elapsed_s"),
            "candidates_per_minute": s.get("candidates_per_minute"),
            "flops": flops,
            "regulated": s.get("regulated"),
            "error": s.get("error"),
            "training_share": s.get("training_share"),
            "master_seconds": s.get("master_seconds"),
            "series": [[p.get("at_s"), p.get("flops")] for p in doc.get("series", [])],
            "flops_per_gpu": per_gpu,
            "of_aiperf_per_gpu": per_gpu / AIPERF_PER_GPU if per_gpu else None,
            "valid": doc.get("valid"),
        }
        records.append(rec)
        share = rec["training_share"]
        lines.append(
            f"automl {device}, {rec['precision']}, {rec['resolution']}², {rec['start']}: "
            f"{rec['candidates_per_minute'] or 0:.2f} candidates a minute, "
            f"{flops / 1e12:.3f} TFLOP/s (regulated {(rec['regulated'] or 0) / 1e12:.3f}), "
            f"error {rec['error'] if rec['error'] is None else round(rec['error'], 4)}, "
            f"workers training {100 * share if share is not None else 0:.0f}% of the run, "
            f"master busy {rec['master_seconds'] or 0:.1f} s of {rec['elapsed_s'] or 0:.0f} s"
        )
        if per_gpu:
            lines.append(
                f"  per GPU {per_gpu / 1e12:.3f} TFLOP/s: {per_gpu / AIPERF_PER_GPU:.2f}x AIPerf's "
                f"published {AIPERF_PER_GPU / 1e12:.2f} TOPS a T4 ({AIPERF_TOPS / 1e12:.1f} TOPS on {AIPERF_GPUS})"
            )
        if rec["series"]:
            pts = ", ".join(f"{t:.0f}s {v / 1e12:.3f}" for t, v in rec["series"][:12] if t is not None and v is not None)
            lines.append(f"  FLOPS series (s, TFLOP/s): {pts}")
    return lines, records


if __name__ == "__main__":
    out, _ = summary(sys.argv[1:])
    print("\n".join(out))
