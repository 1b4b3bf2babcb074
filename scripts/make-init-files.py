#!/usr/bin/env python3
"""Writes one small ResNet's weights in the two layouts `--init` reads, for the tests:

  OUT/tv.safetensors  torchvision's state dict names and layouts (convolutions out x in x h x w,
                      the classifier out x in, num_batches_tracked), as safetensors.torch's
                      save_file writes it (here through safetensors.numpy);
  OUT/keras.h5        Keras 2's save_weights layout for ResNet50 (a group per layer, a group of
                      the same name inside, datasets kernel:0, bias:0, gamma:0, beta:0,
                      moving_mean:0, moving_variance:0; kernels h x w x in x out), with a bias
                      on every convolution and the batch norm's moving mean raised by it, so that
                      folding the bias back gives torchvision's file exactly.
  OUT/keras1.h5       the same weights in keras_applications' names and Keras 1's layout, as
                      resnet50_weights_tf_dim_ordering_tf_kernels.h5 of that era has them
                      (conv1, bn_conv1, res2a_branch2a, bn2a_branch1, fc1000; datasets
                      directly in the layer's group, named {layer}_W:0, _b:0, _gamma:0,
                      _beta:0, _running_mean:0, _running_std:0, the last the variance).

The network: ResNet-50 v1's shape at width W (64·W base channels), bottlenecks DEPTH per stage,
CLASSES outputs. Nothing is downloaded.

usage: make-init-files.py OUT [--width 0.125] [--depth 1,1,1,1] [--classes 4] [--seed 1]
"""
import argparse
import os

import h5py
import numpy as np
from safetensors.numpy import save_file


def channels(base, width):
    return max(1, round(base * width))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--depth", default="1,1,1,1")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    depth = [int(x) for x in a.depth.split(",")]
    tv = {}
    keras = []  # (layer, {var: array})

    def conv(tv_name, keras_layer, cin, cout, k):
        w = rng.normal(0, 0.1, (cout, cin, k, k)).astype(np.float32)
        b = rng.normal(0, 0.1, cout).astype(np.float32)
        tv[tv_name + ".weight"] = w
        keras.append((keras_layer, {"kernel": w.transpose(2, 3, 1, 0).copy(), "bias": b}))
        return b

    def bn(tv_name, keras_layer, c, bias):
        g = rng.uniform(0.5, 1.5, c).astype(np.float32)
        beta = rng.normal(0, 0.1, c).astype(np.float32)
        mean = rng.normal(0, 0.1, c).astype(np.float32)
        var = rng.uniform(0.5, 1.5, c).astype(np.float32)
        tv[tv_name + ".weight"] = g
        tv[tv_name + ".bias"] = beta
        tv[tv_name + ".running_mean"] = mean
        tv[tv_name + ".running_var"] = var
        tv[tv_name + ".num_batches_tracked"] = np.array(7, dtype=np.int64)
        keras.append((keras_layer, {"gamma": g, "beta": beta,
                                    "moving_mean": (mean + bias).astype(np.float32),
                                    "moving_variance": var}))

    c0 = channels(64, a.width)
    bn("bn1", "conv1_bn", c0, conv("conv1", "conv1_conv", 3, c0, 7))
    cin = c0
    for s, n in enumerate(depth):
        mid = channels(64 << s, a.width)
        for b in range(n):
            tvp, kp = f"layer{s + 1}.{b}", f"conv{s + 2}_block{b + 1}"
            for i, (ci, co, k) in enumerate([(cin, mid, 1), (mid, mid, 3), (mid, mid * 4, 1)], 1):
                bn(f"{tvp}.bn{i}", f"{kp}_{i}_bn", co, conv(f"{tvp}.conv{i}", f"{kp}_{i}_conv", ci, co, k))
            if b == 0:
                bn(f"{tvp}.downsample.1", f"{kp}_0_bn", mid * 4,
                   conv(f"{tvp}.downsample.0", f"{kp}_0_conv", cin, mid * 4, 1))
            cin = mid * 4
    fw = rng.normal(0, 0.1, (a.classes, cin)).astype(np.float32)
    fb = rng.normal(0, 0.1, a.classes).astype(np.float32)
    tv["fc.weight"], tv["fc.bias"] = fw, fb
    keras.append(("predictions", {"kernel": fw.T.copy(), "bias": fb}))

    os.makedirs(a.out, exist_ok=True)
    save_file(tv, os.path.join(a.out, "tv.safetensors"))
    with h5py.File(os.path.join(a.out, "keras.h5"), "w") as f:
        f.attrs["layer_names"] = np.array([k.encode() for k, _ in keras])
        f.attrs["backend"] = b"tensorflow"
        for layer, vs in keras:
            g = f.create_group(layer)
            g.attrs["weight_names"] = np.array([f"{layer}/{v}:0".encode() for v in vs])
            inner = g.create_group(layer)
            for v, x in vs.items():
                inner.create_dataset(v + ":0", data=x)
    keras1_vars = {"kernel": "W", "bias": "b", "gamma": "gamma", "beta": "beta",
                   "moving_mean": "running_mean", "moving_variance": "running_std"}
    with h5py.File(os.path.join(a.out, "keras1.h5"), "w") as f:
        names = [keras1_name(k) for k, _ in keras]
        f.attrs["layer_names"] = np.array([k.encode() for k in names])
        for layer, (_, vs) in zip(names, keras):
            g = f.create_group(layer)
            g.attrs["weight_names"] = np.array(
                [f"{layer}_{keras1_vars[v]}:0".encode() for v in vs])
            for v, x in vs.items():
                g.create_dataset(f"{layer}_{keras1_vars[v]}:0", data=x)


def keras1_name(layer):
    """conv3_block2_1_conv -> res3b_branch2a, conv3_block2_0_bn -> bn3b_branch1."""
    fixed = {"conv1_conv": "conv1", "conv1_bn": "bn_conv1", "predictions": "fc1000"}
    if layer in fixed:
        return fixed[layer]
    stage, block, i, kind = layer[4], int(layer.split("_")[1][5:]), int(layer.split("_")[2]), layer.split("_")[3]
    branch = "1" if i == 0 else "2" + "abc"[i - 1]
    return f"{'res' if kind == 'conv' else 'bn'}{stage}{chr(ord('a') + block - 1)}_branch{branch}"


if __name__ == "__main__":
    main()
