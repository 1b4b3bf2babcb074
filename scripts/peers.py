#!/usr/bin/env python3
"""The peer figures for roofline's GPU bring-up, on the same GPU in the same call.

  peers.py --batch 128 --steps 30 -o peers.json      # measure with PyTorch
  peers.py --batches 128,256 --steps 30 -o peers.json   # ResNet-50 at each batch
  peers.py --summary --machine machine.json --train train.jsonl --peers peers.json \
      [--placement placement.json ...] [--json summary.json]

Measured: matmul TFLOP/s per precision at roofline's GEMM shapes (the full probe's squares and
its two ResNet-50 shapes; A stored transposed as roofline's TN layout), a device-to-device copy
(bytes read plus written, as roofline's gpu0/d2d), and torchvision ResNet-50 training images/s
at roofline's batch and 224x224 per precision: f32 (TF32 off), tf32 (TF32 on), bf16 and f16
(autocast; f16 with a gradient scaler), channels-last, SGD with momentum; and (--parts ewa)
torchvision's Faster R-CNN ResNet-50-FPN training step at EWA's 768x1152 with 16 channels
(its stem widened to 16 inputs, no resizing, four classes and background, batch norm trained as
roofline's is), images/s per precision. Timing: CUDA events, after warm-up, best and median of
several samples; inputs random (never zeros). An existing output file is updated, so that the
parts can run in separate calls.

  peers.py --parts ewa --ewa-batch 2,8 --steps 10 -o peers.json   # Faster R-CNN at each batch
  peers.py --parts conv --machine machine.json -o peers.json   # PyTorch at the probe's conv shapes

--parts conv (scripts/conv_peers.py): for every row of the probe's convolution tables, the same
convolution in PyTorch (cudnn.benchmark, channels-last, the same dtype), forward, backward-data
and backward-filter; the summary gives roofline/PyTorch per shape.

--summary prints roofline's figures beside PyTorch's; with --json it also writes them for the
record (docs/gpu/<date>-<gpu>.json): the revision, GPU, driver and libraries, and for each
precision and batch roofline's images/s, PyTorch's, the ratio, the host's waits per step, the
joules per image and (where a placement ran at that precision and batch) the idle share; for
the detector, each precision, anchor configuration and batch against torchvision at the same
batch, and the per-stage table of its placement (each part's share of the step).
"""
import argparse
import json
import os
import statistics
import sys
import time

GEMM_SHAPES = [
    (1024, 1024, 1024, "square 1024"),
    (2048, 2048, 2048, "square 2048"),
    (4096, 4096, 4096, "square 4096"),
    (8192, 8192, 8192, "square 8192"),
    (256 * 7 * 7, 2048, 512, "resnet50 conv5 1x1 expand (batch 256)"),
    (2048, 1024, 256, "resnet50 fc weight gradient (batch 256, n padded to 1024)"),
]
PRECISIONS = ["f64", "f32", "tf32", "f16", "bf16", "int8", "fp8"]


def timed(torch, fn, samples=7, want_s=0.05):
    """Seconds per call: best and median of `samples` event-timed batches of calls."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    reps = max(1, min(1000, int(want_s / one)))
    per = []
    for _ in range(samples):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / 1e3 / reps)
    return min(per), statistics.median(per)


def gemm(torch, prec, m, n, k):
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    if prec in ("f64", "f32", "tf32", "f16", "bf16"):
        dt = {"f64": torch.float64, "f32": torch.float32, "tf32": torch.float32,
              "f16": torch.float16, "bf16": torch.bfloat16}[prec]
        a = torch.randn(k, m, device=dev, dtype=dt).t()  # A stored k x m: TN
        b = torch.randn(k, n, device=dev, dtype=dt)
        fn = lambda: torch.matmul(a, b)  # noqa: E731
    elif prec == "int8":
        a = torch.randint(-8, 8, (m, k), device=dev, dtype=torch.int8)
        b = torch.randint(-8, 8, (n, k), device=dev, dtype=torch.int8).t()
        fn = lambda: torch._int_mm(a, b)  # noqa: E731
    else:
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    best, med = timed(torch, fn)
    flops = 2.0 * m * n * k
    return flops / best, flops / med


def copy_rate(torch):
    n = 1 << 28  # 1 GiB of f32
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    best, med = timed(torch, lambda: dst.copy_(src), samples=9, want_s=0.02)
    if not torch.equal(dst, src):
        raise RuntimeError("copy check failed")
    return 2 * 4 * n / best, 2 * 4 * n / med


def resnet(torch, prec, batch, steps):
    import torchvision

    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    amp = {"bf16": torch.bfloat16, "f16": torch.float16}.get(prec)
    scaler = torch.amp.GradScaler("cuda", enabled=prec == "f16")
    loss_fn = torch.nn.CrossEntropyLoss()

    return images_per_second(torch, opt, scaler, amp, lambda: loss_fn(model(x), y),
                             batch, 5, steps, f"resnet50 {prec}")


def images_per_second(torch, opt, scaler, amp, loss_of, batch, warm, steps, what):
    """Training images/s of SGD steps on `loss_of()` under autocast to `amp` (None: off),
    after `warm` steps, over `steps` steps; the last loss must be finite."""

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_of()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    if not torch.isfinite(loss):
        raise RuntimeError(f"{what}: loss not finite")
    return batch * steps / dt


# roofline's detector (DetectorConfig::ewa): nine anchors a cell on every level, sizes
# 32*2^l*{1, 2^(1/3), 2^(2/3)} x ratios {0.5, 1, 2} (height / width, as torchvision's), 2000
# proposals a level and 2000 after NMS 0.7 in training (1000 / 1000 at inference), 256 anchors
# sampled (half foreground), 512 regions (a quarter foreground).
OURS = {
    "rpn_pre_nms_top_n_train": 2000, "rpn_post_nms_top_n_train": 2000,
    "rpn_pre_nms_top_n_test": 1000, "rpn_post_nms_top_n_test": 1000,
    "rpn_nms_thresh": 0.7, "rpn_batch_size_per_image": 256, "rpn_positive_fraction": 0.5,
    "box_batch_size_per_image": 512, "box_positive_fraction": 0.25,
    "box_score_thresh": 0.05, "box_nms_thresh": 0.5, "box_detections_per_img": 100,
}


def detector(torch, prec, batch, steps, config="ours"):
    """torchvision Faster R-CNN (ResNet-50-FPN) training images/s at 768x1152, 16 channels:
    at roofline's anchors, proposal counts and sampling sizes (config "ours": the same work as
    our detector), or at torchvision's defaults ("torchvision": three anchors a cell)."""
    import torchvision
    from torchvision.models.detection import fasterrcnn_resnet50_fpn
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.rpn import RPNHead

    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.benchmark = True
    h, w, c = 768, 1152, 16
    # Untrained: torchvision then trains every backbone layer with ordinary batch norm.
    extra = {}
    if config == "ours":
        sizes = tuple(tuple(32.0 * 2 ** l * 2 ** (i / 3) for i in range(3)) for l in range(5))
        extra = dict(OURS, rpn_anchor_generator=AnchorGenerator(sizes, ((0.5, 1.0, 2.0),) * 5),
                     rpn_head=RPNHead(256, 9))
    model = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=5,
                                    min_size=h, max_size=w, image_mean=[0.0] * c,
                                    image_std=[1.0] * c, **extra)
    anchors = model.rpn.anchor_generator.num_anchors_per_location()[0]
    model.backbone.body.conv1 = torch.nn.Conv2d(c, 64, 7, 2, 3, bias=False)
    model = model.cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.02 * batch / 16, momentum=0.9,
                          weight_decay=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(1)
    images = [torch.randn(c, h, w, device="cuda", generator=gen) for _ in range(batch)]
    targets = []
    for i in range(batch):
        xy = torch.rand(6, 2, device="cuda", generator=gen) * torch.tensor([w - 200.0, h - 200.0], device="cuda")
        wh = 20 + torch.rand(6, 2, device="cuda", generator=gen) * 180
        targets.append({"boxes": torch.cat([xy, xy + wh], 1),
                        "labels": torch.randint(1, 5, (6,), device="cuda", generator=gen)})
    amp = {"bf16": torch.bfloat16, "f16": torch.float16}.get(prec)
    scaler = torch.amp.GradScaler("cuda", enabled=prec == "f16")

    rate = images_per_second(torch, opt, scaler, amp,
                             lambda: sum(model(images, targets).values()),
                             batch, 3, steps, f"faster r-cnn {prec}")
    return {"images_per_second": rate, "batch": batch, "steps": steps, "config": config,
            "anchors_per_cell": anchors, "resolution": [h, w], "channels": c,
            "torchvision": torchvision.__version__}


def from_fixture(args):
    """The kit's dry run: PyTorch's side from a fixture file, as `measure` would have written
    it, for the parts asked; merged into the output as `measure` merges."""
    out = read_output(args.output)
    with open(args.fixture) as f:
        fx = json.load(f)
    parts = set(args.parts.split(","))
    keys = {"gemm": ["gemm", "d2d"], "resnet": ["resnet50_by_batch", "resnet50"], "conv": ["conv"],
            "ewa": ["ewa_by_batch", "ewa", "ewa_torchvision"]}
    for k in ("gpu", "torch", "cuda", "cudnn"):
        out[k] = fx.get(k)
    for part in parts:
        for k in keys.get(part, []):
            if k in fx:
                out[k] = fx[k]
    out["fixture"] = args.fixture
    write_json(args.output, out)
    print("peers from the fixture", args.fixture, "parts", ",".join(sorted(parts)), flush=True)


def read_output(path):
    """The output file as an earlier part wrote it (each part adds its keys), or nothing."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def write_json(path, doc):
    """Atomically: a call killed mid-write leaves the last whole file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def measure(args):
    import torch

    out = read_output(args.output)
    out.update({
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    })
    parts = set(args.parts.split(","))
    if "conv" in parts:
        import conv_peers
        if not args.machine:
            raise SystemExit("--parts conv needs --machine (the probe's machine.json: its shapes)")
        with open(args.machine) as f:
            out["conv"] = conv_peers.measure(torch, timed, json.load(f))
        print("conv rows", len(out["conv"]), flush=True)
        write_json(args.output, out)
    if "ewa" in parts:
        # "ewa": at our configuration (the row our detector is held to); "ewa_torchvision":
        # at torchvision's defaults (three anchors a cell), the figure torchvision users know.
        # Each batch under ewa_by_batch; the first also as "ewa" and "ewa_torchvision".
        batches = [int(b) for b in str(args.ewa_batch).split(",")]
        out["ewa_by_batch"] = {}
        for batch in batches:
            row = out["ewa_by_batch"][str(batch)] = {}
            for key, config in [("ewa", "ours"), ("ewa_torchvision", "torchvision")]:
                row[key] = {}
                for prec in args.precisions.split(",") if args.precisions else ["f32", "bf16"]:
                    try:
                        row[key][prec] = detector(torch, prec, batch, args.steps, config)
                    except Exception as e:  # torchvision missing, or out of memory
                        row[key][prec] = {"error": str(e).splitlines()[0][:200]}
                    torch.cuda.empty_cache()
                    print("faster r-cnn", config, prec, "batch", batch, row[key][prec], flush=True)
                if batch == batches[0]:
                    out[key] = row[key]
                write_json(args.output, out)
    if "gemm" in parts:
        gemms(torch, out)
        write_json(args.output, out)
    if "resnet" in parts:
        resnets(torch, args, out)
        write_json(args.output, out)


def gemms(torch, out):
    """matmul at roofline's GEMM shapes in every precision, and a device-to-device copy."""
    out["gemm"] = {}
    for prec in PRECISIONS:
        rows = []
        for m, n, k, name in GEMM_SHAPES:
            try:
                best, med = gemm(torch, prec, m, n, k)
                rows.append({"shape": name, "m": m, "n": n, "k": k, "best": best, "median": med})
            except Exception as e:  # a precision the GPU or PyTorch lacks
                rows.append({"shape": name, "error": str(e).splitlines()[0][:200]})
            torch.cuda.empty_cache()
        out["gemm"][prec] = rows
        print(prec, max((r.get("best", 0) for r in rows), default=0) / 1e12, "T", flush=True)
    out["d2d"] = dict(zip(("best", "median"), copy_rate(torch)))


def resnets(torch, args, out):
    """torchvision ResNet-50 training images/s at each batch and precision asked (kept beside
    those of other batches and precisions already in the file)."""
    batches = [int(b) for b in (args.batches or str(args.batch)).split(",")]
    out.setdefault("resnet50_by_batch", {})
    for batch in batches:
        row = out["resnet50_by_batch"].setdefault(str(batch), {})
        for prec in args.precisions.split(",") if args.precisions else ["f32", "tf32", "bf16", "f16"]:
            try:
                row[prec] = resnet(torch, prec, batch, args.steps)
            except Exception as e:  # out of memory at a large batch, a precision missing
                row[prec] = {"error": str(e).splitlines()[0][:200]}
            torch.cuda.empty_cache()
            print("resnet50", prec, "batch", batch, row[prec], flush=True)
            write_json(args.output, out)
    out["resnet50"] = out["resnet50_by_batch"][str(batches[0])]


def summary(args, say=print, prefix="gpu0/"):
    """Prints (by `say`) roofline's figures beside the peers' and returns them as the record
    for summary.json (also written to args.json when set). `prefix`: whose ceilings (gpu0/; the
    kit's dry run: cpu/)."""
    m = json.load(open(args.machine)) if args.machine and os.path.exists(args.machine) else {"ceilings": []}
    ceil = {c["id"]: c for c in m.get("ceilings", [])}
    # The AutoML part runs without PyTorch's figures.
    peers = json.load(open(args.peers)) if args.peers and os.path.exists(args.peers) else {}
    train, ewa, runs = {}, {}, {}
    for line in (open(args.train) if args.train and os.path.exists(args.train) else []):
        if line.strip():
            t = json.loads(line)
            if t.get("workload") == "ewa":
                ewa[(t.get("precision"), t.get("anchors_per_cell", 9), t.get("batch"))] = t
            else:
                train[t.get("precision")] = t
            if t.get("workload") != "ewa":
                runs[(t.get("precision"), t.get("batch"))] = t
    # The idle share of each placement (its step's time not computing, communicating or waiting
    # for data), by the workload ("ewa" or "resnet50"), precision and batch it ran at; and the
    # detector's per-stage table (each part's share of the step).
    idle, stages = {}, {}
    for path in args.placement or []:
        try:
            pl = json.load(open(path))
        except (OSError, ValueError) as e:
            say(f"no idle share: {path}: {e}")
            continue
        tb, wl = pl.get("time", {}), pl.get("workload", {})
        name = "ewa" if str(wl.get("name", "")).startswith("ewa") else "resnet50"
        key = (name, wl.get("precision"), wl.get("batch"))
        if tb.get("total_s"):
            idle[key] = tb.get("idle_s", 0.0) / tb["total_s"]
        if name == "ewa":
            stages[key] = sorted(pl.get("layers", []), key=lambda p: -(p.get("share_of_step") or 0.0))
    say(f"GPU: {peers.get('gpu')}; PyTorch {peers.get('torch')} (CUDA {peers.get('cuda')}, cuDNN {peers.get('cudnn')})")
    say(f"{'figure':<42} {'roofline':>12} {'PyTorch':>12} {'ratio':>7}")

    def row(name, ours, theirs, unit, scale):
        o = f"{ours / scale:.1f}" if ours else "-"
        t = f"{theirs / scale:.1f}" if theirs else "-"
        r = f"{ours / theirs:.2f}" if ours and theirs else "-"
        say(f"{name + ' (' + unit + ')':<42} {o:>12} {t:>12} {r:>7}")

    for prec in PRECISIONS:
        ours = ceil.get(f"{prefix}gemm/{prec}", {}).get("value")
        theirs = max((r.get("best", 0) for r in peers.get("gemm", {}).get(prec, [])), default=0)
        row(f"GEMM {prec}", ours, theirs, "TFLOP/s" if prec != "int8" else "TOP/s", 1e12)
    row("device-to-device copy", ceil.get(f"{prefix}d2d", {}).get("value"), peers.get("d2d", {}).get("best"), "GB/s", 1e9)
    by_batch = peers.get("resnet50_by_batch") or {str(peers.get("batch", 128)): peers.get("resnet50", {})}
    records = []
    for (prec, batch), t in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        p = by_batch.get(str(batch), {}).get(prec)
        p = p if isinstance(p, float) else None
        ours = t.get("steady_images_per_second")
        row(f"ResNet-50 train {prec} b{batch}", ours, p, "img/s", 1.0)
        energy = t.get("energy") or {}
        graph = t.get("cuda_graph") or {}
        if graph:
            ms = lambda s: f"{1e3 * s:.2f} ms" if s else "-"
            say(f"  CUDA graph b{batch} {prec}: used {graph.get('used')}, a step {ms(graph.get('graph_step_seconds'))} as a graph, "
                  f"{ms(graph.get('eager_step_seconds'))} enqueued; {graph.get('why')}")
        records.append({
            "precision": prec, "batch": batch,
            "images_per_second": ours, "pytorch_images_per_second": p,
            "ratio": ours / p if ours and p else None,
            "host_syncs_per_step": t.get("host_syncs_per_step"),
            "device_allocations_per_step": t.get("device_allocations_per_step"),
            "joules_per_image": energy.get("joules_per_image"),
            "energy_note": energy.get("note"),
            "idle_share": idle.get(("resnet50", prec, batch)),
            "cuda_graph_used": graph.get("used"),
            "graph_step_seconds": graph.get("graph_step_seconds"),
            "eager_step_seconds": graph.get("eager_step_seconds"),
            "cuda_graph_why": graph.get("why"),
            # Which steps the rate counts: graph launches after the CUDA-graph trial, eager
            # steps, or mixed (a run that ended inside the trial).
            "steady_kind": (t.get("steady_steps") or {}).get("kind"),
            "steady_steps": (t.get("steady_steps") or {}).get("steps"),
        })
    ewa_records = []
    # Each row the same work on both sides: our detector at nine anchors a cell against
    # torchvision at our configuration, and at three (--anchors 3) against torchvision's
    # defaults; FLOP/s by our count of that configuration's step at 768x1152.
    # Each batch our runs have, torchvision's at the same batch (ewa_by_batch, or the older
    # single-batch record where its batch matches).
    def torchvision_at(key, prec, batch):
        p = peers.get("ewa_by_batch", {}).get(str(batch), {}).get(key, {}).get(prec)
        if p is None:
            p = peers.get(key, {}).get(prec, {})
            p = p if p.get("batch") == batch else {}
        return p

    ewa_batches = sorted({b for (_, _, b) in ewa if b is not None}) or [2]
    for anchors, key, short in [(9, "ewa", "ours"), (3, "ewa_torchvision", "defaults")]:
        for batch in ewa_batches:
            for prec in ["f32", "bf16"]:
                t = ewa.get((prec, anchors, batch))
                if t is None and (anchors, batch) != (9, ewa_batches[0]):
                    continue
                t = t or {}
                ours = t.get("steady_images_per_second")
                per_image = t.get("flops_step_per_image_at_768x1152")
                p = torchvision_at(key, prec, batch)
                theirs = p.get("images_per_second")
                row(f"EWA {prec} b{batch}, {anchors} anchors ({short})", ours, theirs, "img/s", 1.0)
                share = idle.get(("ewa", prec, batch))
                if per_image:
                    flops = lambda r: f"{r * per_image / 1e12:.1f}" if r else "-"
                    idle_text = f", idle {100 * share:.0f}% of the step" if share is not None else ""
                    say(f"  TFLOP/s by our count: roofline {flops(ours)}, torchvision {flops(theirs)}; "
                          f"{t.get('host_syncs_per_step')} host syncs a step{idle_text}")
                ewa_records.append({
                    "precision": prec, "anchors_per_cell": anchors, "batch": batch,
                    "images_per_second": ours, "torchvision_images_per_second": theirs,
                    "torchvision_config": p.get("config"),
                    "ratio": ours / theirs if ours and theirs else None,
                    "flops_per_image": per_image,
                    "host_syncs_per_step": t.get("host_syncs_per_step"),
                    "idle_share": share,
                })
    ewa_stages = []
    for (_, prec, batch), layers in sorted(stages.items(), key=lambda kv: str(kv[0])):
        say(f"EWA {prec} b{batch} on the GPU, per stage (place --workload ewa):")
        say(f"  {'part':<28} {'share':>7} {'ms a step':>10} {'TFLOP/s':>8}")
        for p in layers[:12]:
            sec = (p.get("seconds_per_step") or {}).get("median")
            ms = f"{1e3 * sec:.2f}" if sec else "-"
            rate = f"{p.get('achieved_flops', 0) / 1e12:.1f}" if p.get("achieved_flops") else "-"
            say(f"  {p.get('label', '?')[:28]:<28} {100 * (p.get('share_of_step') or 0):>6.1f}% {ms:>10} {rate:>8}")
        ewa_stages.append({
            "precision": prec, "batch": batch,
            "idle_share": idle.get(("ewa", prec, batch)),
            "stages": [{"label": p.get("label"), "share_of_step": p.get("share_of_step"),
                        "seconds_per_step": (p.get("seconds_per_step") or {}).get("median"),
                        "achieved_flops": p.get("achieved_flops")} for p in layers],
        })
    import conv_peers
    conv_lines, conv_records = conv_peers.summary(m, peers, prefix.rstrip("/"))
    for line in conv_lines:
        say(line)
    import automl_summary
    automl_lines, automl_records = automl_summary.summary(args.automl or [])
    for line in automl_lines:
        say(line)
    for cid in sorted(ceil):
        if cid.startswith(prefix) and ("/fma/" in cid or "/mma/" in cid or "/wgmma/" in cid or cid.endswith("/hbm") or "/mem/" in cid):
            c = ceil[cid]
            pk = (c.get("theoretical_peak") or {}).get("value")
            frac = f" ({100 * c['value'] / pk:.0f}% of peak)" if pk else ""
            say(f"roofline {cid}: {c['value']:.4g} {c['unit']}{frac}")
    prov = m.get("provenance", {})
    gpus = prov.get("gpus") or [{}]
    record = {
        "schema": "roofline/gpu-bringup-summary/v1",
        "revision": prov.get("git_revision"),
        "time_utc": prov.get("time_utc"),
        "gpu": peers.get("gpu"),
        "driver": gpus[0].get("driver_version"),
        "cuda_driver": gpus[0].get("cuda_driver_version"),
        "libraries": prov.get("libraries", []),
        "pytorch": {k: peers.get(k) for k in ("torch", "cuda", "cudnn")},
        "resnet50": records,
        "ewa": ewa_records,
        "ewa_stages": ewa_stages,
        "conv": conv_records,
        "automl": automl_records,
        # The compute ceilings (conv: ResNet-50's network rate): each with its datasheet
        # peak, and the tensor-core ones (mma.sync, wgmma) beside the best cuBLAS GEMM of
        # their precision.
        "ceilings": [
            {
                "id": cid,
                "value": c["value"],
                "unit": c["unit"],
                "theoretical_peak": (c.get("theoretical_peak") or {}).get("value"),
                "of_peak": c["value"] / c["theoretical_peak"]["value"]
                if (c.get("theoretical_peak") or {}).get("value") else None,
                "of_cublas": c["value"] / ceil[f"{prefix}gemm/{cid.split('/')[2]}"]["value"]
                if ("/mma/" in cid or "/wgmma/" in cid) and f"{prefix}gemm/{cid.split('/')[2]}" in ceil else None,
                # Power-capped parts: the best sample before the cap, and the capped steady
                # state (its power and SM clock) that `value` is.
                "burst": c.get("burst"),
                "sustained": c.get("sustained"),
                "method": c.get("method"),
            }
            for cid, c in sorted(ceil.items())
            if cid.startswith(prefix) and any(f"/{f}/" in cid for f in ("fma", "mma", "wgmma", "gemm", "conv"))
        ],
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return record


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--batches", help="comma list of ResNet-50 batches (default: --batch)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--parts", default="gemm,resnet", help="comma list: gemm (GEMMs, copy), resnet (ResNet-50 training), ewa (Faster R-CNN), conv (the probe's conv shapes, with --machine)")
    ap.add_argument("--precisions", help="comma list of the training precisions (resnet: f32,tf32,bf16,f16; ewa: f32,bf16)")
    ap.add_argument("--fixture", help="take PyTorch's side from this file (the kit's dry run) instead of measuring")
    ap.add_argument("--ewa-batch", default="2", help="comma list of Faster R-CNN batches (default 2)")
    ap.add_argument("-o", "--output", default="peers.json")
    ap.add_argument("--summary", action="store_true")
    ap.add_argument("--machine")
    ap.add_argument("--train")
    ap.add_argument("--peers")
    ap.add_argument("--placement", action="append",
                    help="a placement.json (again for more): its idle share joins the summary, a detector's per-stage table too")
    ap.add_argument("--automl", action="append", help="--summary: an automl.json of this run (repeatable)")
    ap.add_argument("--json", help="--summary: also write the figures as JSON here")
    args = ap.parse_args()
    if args.summary:
        summary(args)
    elif args.fixture:
        from_fixture(args)
    else:
        measure(args)


if __name__ == "__main__":
    sys.exit(main())
