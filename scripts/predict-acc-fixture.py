#!/usr/bin/env python3
"""Records AIPerf's predicted accuracy as its reference computes it (`utils.predict_acc` of
AI-HPC-Research-Team/AIPerf, examples/trials/network_morphism/imagenet: scipy's curve_fit of
a*log2(x+b)+c through the validation curve and the anchor (120, 0.75), read at epoch 90, less
twice the RMSE, else max(acc_y[:-1])) on seeded validation curves of 10 to 79 epochs, for the
test workloads/automl/src/curve.rs `the_fit_is_scipy_s`. Needs numpy and scipy; writes JSON
to stdout:

    python3 scripts/predict-acc-fixture.py > workloads/automl/src/curve_scipy.json
"""
import json
import sys
import warnings

import numpy as np
from scipy.optimize import curve_fit

warnings.filterwarnings("ignore")


def logfun(x, a, b, c):
    return a * np.log2(np.array(x) + b) + c


def predict_acc(acc):
    """The reference's predict_acc(tid, range(1, len+1), acc, 90), None where it raises."""
    xs = list(range(1, len(acc) + 1)) + [120]
    ys = list(acc) + [0.75]
    try:
        popt, _ = curve_fit(logfun, xs, ys, maxfev=100000)
    except Exception:
        return None, None
    pred = logfun(xs, *popt)
    err = np.sqrt(np.sum(np.square(np.subtract(np.array(ys, dtype=float), pred))) / len(pred))
    target = logfun(90, *popt) - 2 * err
    if target < max(ys[:-1]) or target > 1:
        target = max(ys[:-1])
    return [float(v) for v in popt], float(target)


def main():
    rng = np.random.default_rng(2026)
    curves = []
    for _ in range(44):
        epochs = int(rng.integers(10, 80))
        top, k, noise = rng.uniform(0.3, 0.95), rng.uniform(0.05, 0.5), rng.uniform(0, 0.03)
        x = np.arange(1, epochs + 1)
        y = np.clip(top * (1 - np.exp(-k * x)) + rng.normal(0, noise, epochs), 0, 1)
        curves.append([float(v) for v in y])
    # The model itself, a flat curve, a falling one, a jagged one.
    curves.append([0.08 * np.log2(x + 1.0) + 0.2 for x in range(1, 16)])
    curves.append([0.5] * 12)
    curves.append([0.6 - 0.01 * x for x in range(1, 21)])
    curves.append([0.7 if x % 2 else 0.2 for x in range(1, 16)])
    out = []
    for y in curves:
        popt, predicted = predict_acc(y)
        out.append({"y": y, "popt": popt, "predicted": predicted})
    json.dump(out, sys.stdout, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
