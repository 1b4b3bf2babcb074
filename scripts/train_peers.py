#!/usr/bin/env python3
"""ResNet-50 v1.5 CPU training throughput of TensorFlow and PyTorch, for scripts/compare-train.sh.

  train_peers.py --framework torch|tf --precision f32|bf16 --batch 32 --resolution 224 \
                 --threads 2 --steps 4

Runs one framework in one precision (a process each: TensorFlow's precision policy is global)
and prints one JSON line: images/s over the measured steps (after --warm steps, as roofline
train's steady_images_per_second counts them), the best single step, and the versions.

The model is the same as roofline's: ResNet-50 v1.5 (the stride on the 3×3 convolution of each
bottleneck), 1000 classes, batch norm trained, SGD with momentum 0.9 and weight decay 1e-4,
softmax cross-entropy; random images (never zeros) and random labels.
  torch: torchvision's resnet50 (v1.5), channels-last; bf16 = torch.autocast("cpu", bfloat16)
         around the forward pass and the loss (weights and optimizer in f32).
  tf:    the same network written with Keras layers (keras.applications' ResNet50 is v1, with the
         stride on the first 1×1, and a few % fewer FLOPs), NHWC, one tf.function step (oneDNN,
         TensorFlow's default on x86-64); bf16 = the mixed_bfloat16 policy (logits in f32).
"""
import argparse
import json
import os
import sys
import time


def torch_run(a):
    import torch
    import torchvision

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None, num_classes=1000)
    model = model.to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * a.batch / 256, momentum=0.9,
                          weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(a.batch, 3, a.resolution, a.resolution).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        if a.precision == "bf16":
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    params = sum(p.numel() for p in model.parameters())
    return step, params, {"torch": torch.__version__, "torchvision": torchvision.__version__,
                  "mkldnn_bf16": bool(getattr(torch.backends.mkldnn, "is_available", lambda: False)())}


def tf_model(tf, classes):
    L = tf.keras.layers

    def bn(x):
        return L.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)

    def conv(x, k, size, stride=1):
        if stride > 1 and size > 1:
            x = L.ZeroPadding2D(size // 2)(x)
            pad = "valid"
        else:
            pad = "same"
        return L.Conv2D(k, size, strides=stride, padding=pad, use_bias=False,
                        kernel_regularizer=tf.keras.regularizers.L2(0.5e-4))(x)

    def block(x, width, stride, project):
        s = x
        h = L.ReLU()(bn(conv(x, width, 1)))
        h = L.ReLU()(bn(conv(h, width, 3, stride)))
        h = bn(conv(h, 4 * width, 1))
        if project:
            s = bn(conv(x, 4 * width, 1, stride))
        return L.ReLU()(L.Add()([h, s]))

    inp = tf.keras.Input((None, None, 3))
    x = L.ReLU()(bn(conv(inp, 64, 7, 2)))
    x = L.ZeroPadding2D(1)(x)
    x = L.MaxPooling2D(3, 2)(x)
    for i, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        for b in range(blocks):
            x = block(x, width, 2 if (b == 0 and i > 0) else 1, b == 0)
    x = L.GlobalAveragePooling2D()(x)
    out = L.Dense(classes, dtype="float32")(x)
    return tf.keras.Model(inp, out)


def tf_run(a):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if a.precision == "bf16":
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    tf.random.set_seed(0)
    model = tf_model(tf, 1000)
    opt = tf.keras.optimizers.SGD(learning_rate=0.1 * a.batch / 256, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = tf.random.normal((a.batch, a.resolution, a.resolution, 3))
    y = tf.random.uniform((a.batch,), 0, 1000, dtype=tf.int32)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits) + tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def step():
        return float(train_step())

    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)")
    params = sum(int(tf.size(v)) for v in model.trainable_variables)
    return step, params, {"tensorflow": tf.__version__, "onednn_opts": onednn}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--framework", choices=["torch", "tf"], required=True)
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--warm", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args()
    step, params, versions = (torch_run if a.framework == "torch" else tf_run)(a)
    for _ in range(a.warm):
        step()
    times = []
    loss = None
    for i in range(a.steps):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
        print(f"  {a.framework} {a.precision} step {i + 1}/{a.steps}: {a.batch / times[-1]:.2f} images/s",
              file=sys.stderr, flush=True)
    print(json.dumps({
        "framework": a.framework,
        "precision": a.precision,
        "batch": a.batch,
        "resolution": a.resolution,
        "threads": a.threads,
        "steps": a.steps,
        "images_per_second": a.batch * a.steps / sum(times),
        "best_step_images_per_second": a.batch / min(times),
        "final_loss": loss,
        "parameters": params,
        "versions": versions,
    }))


if __name__ == "__main__":
    main()
