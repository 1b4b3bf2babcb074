"""PyTorch's convolutions at the shapes roofline's GPU probe measured (peers.py --parts conv).

For every row of the probe's convolution tables in machine.json (gpu0/conv/<precision>/<direction>:
each ResNet-50 layer shape it ran, NHWC, with cuDNN's fastest algorithm), the same convolution in
PyTorch: cudnn.benchmark on, channels-last, the same dtype (f32 with TF32 off, tf32 with it on,
f16, bf16), forward as F.conv2d, backward-data as torch.nn.grad.conv2d_input, backward-filter as
torch.nn.grad.conv2d_weight, random inputs; CUDA events, best and median of several samples
after warm-up; FLOPs counted as roofline counts them, 2·N·OH·OW·K·C·R·S.
"""
import re

DTYPES = {"f32": "float32", "tf32": "float32", "f16": "float16", "bf16": "bfloat16"}
SHAPE = re.compile(r"n=(\d+) c=(\d+) h=(\d+) w=(\d+) k=(\d+) r=(\d+) s=(\d+) stride=(\d+) pad=(\d+)")


def shapes_of(machine, device="gpu0"):
    """(precision, direction, layer, rate, shape dict, the row) for every conv table row of
    `device` (gpu0; the kit's dry run: cpu)."""
    out = []
    for t in machine.get("tables", []):
        parts = str(t.get("id", "")).split("/")
        # gpu0/conv/<precision>/<direction> (the table of that ceiling)
        if len(parts) < 4 or parts[0] != device or parts[1] != "conv":
            continue
        prec, direction = parts[2], parts[3]
        for row in t.get("rows", []):
            m = SHAPE.search(row.get("shape", ""))
            if not m:
                continue
            n, c, h, w, k, r, s, stride, pad = (int(v) for v in m.groups())
            out.append((prec, direction, row.get("name"), row.get("value"),
                        dict(n=n, c=c, h=h, w=w, k=k, r=r, s=s, stride=stride, pad=pad), row))
    return out


def flops(s):
    oh = (s["h"] + 2 * s["pad"] - s["r"]) // s["stride"] + 1
    ow = (s["w"] + 2 * s["pad"] - s["s"]) // s["stride"] + 1
    return 2.0 * s["n"] * oh * ow * s["k"] * s["c"] * s["r"] * s["s"], oh, ow


def rate(torch, timed, prec, direction, s):
    """PyTorch's FLOP/s (best, median) for one convolution."""
    import torch.nn.functional as F
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    dtype = getattr(torch, DTYPES[prec])
    f, oh, ow = flops(s)
    cl = torch.channels_last
    x = torch.randn(s["n"], s["c"], s["h"], s["w"], device="cuda", dtype=dtype).to(memory_format=cl)
    w = torch.randn(s["k"], s["c"], s["r"], s["s"], device="cuda", dtype=dtype).to(memory_format=cl)
    dy = torch.randn(s["n"], s["k"], oh, ow, device="cuda", dtype=dtype).to(memory_format=cl)
    st, pad = s["stride"], s["pad"]
    if direction == "fwd":
        fn = lambda: F.conv2d(x, w, stride=st, padding=pad)
    elif direction == "bwd_data":
        fn = lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, stride=st, padding=pad)
    elif direction == "bwd_filter":
        fn = lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, stride=st, padding=pad)
    else:
        raise ValueError(f"direction {direction}")
    with torch.no_grad():
        best, med = timed(torch, fn, samples=3, want_s=0.02)
    return f / best, f / med


def measure(torch, timed, machine):
    """Every conv row's PyTorch rate, or its error."""
    rows = []
    for prec, direction, layer, ours, s, _ in shapes_of(machine):
        row = {"precision": prec, "direction": direction, "layer": layer, "shape": s}
        try:
            row["best"], row["median"] = rate(torch, timed, prec, direction, s)
        except Exception as e:  # out of memory, a dtype the GPU lacks
            row["error"] = str(e).splitlines()[0][:200]
        torch.cuda.empty_cache()
        rows.append(row)
    return rows


def summary(machine, peers, device="gpu0"):
    """Lines comparing roofline's conv rows with PyTorch's at the same shapes, and the records."""
    theirs = {(r["precision"], r["direction"], r["layer"]): r for r in peers.get("conv", [])}
    groups, records = {}, []
    for prec, direction, layer, ours, s, ours_row in shapes_of(machine, device):
        t = theirs.get((prec, direction, layer), {})
        ratio = ours / t["best"] if ours and t.get("best") else None
        heuristic = ours_row.get("heuristic") or {}
        records.append({"precision": prec, "direction": direction, "layer": layer, "shape": s,
                        "roofline": ours, "pytorch": t.get("best"), "ratio": ratio,
                        # What the search chose and tried, cuDNN's heuristic beside it, the
                        # shape's own roof.
                        "method": ours_row.get("detail"), "heuristic": heuristic.get("detail"),
                        "heuristic_rate": heuristic.get("value"), "roof": ours_row.get("roof"),
                        "efficiency": ours_row.get("efficiency")})
        if ratio is not None:
            groups.setdefault((prec, direction), []).append((ratio, layer))
    lines = []
    for (prec, direction), rs in sorted(groups.items()):
        rs.sort()
        med = rs[len(rs) // 2][0]
        below = sum(1 for r, _ in rs if r < 1.0)
        lines.append(f"conv {prec} {direction}: roofline/PyTorch per shape min {rs[0][0]:.2f} "
                     f"({rs[0][1]}), median {med:.2f}; {len(rs) - below} of {len(rs)} shapes at 1.0 or more")
    return lines, records
