#!/usr/bin/env python3
"""compare_pytorch.py: petra-train side by side with PyTorch on the same network.

What it does
  Builds in PyTorch exactly the network petra builds (nn/blocks.cpp, nn/models.cpp: RevNet18/34/50 or
  ResNet18/34/50, a width w, the CIFAR or ImageNet stem, conv biases everywhere, a global-average-pool +
  linear head with cross-entropy) and checks that it is petra's (skip with --skip-checks):
    1. the parameter count equals `petra-train --print-model`'s;
    2. the state_dict has exactly the tensor names and shapes of `petra-train --save-params`;
    3. numerically: petra-train saves its initial parameters and takes one SGD step on 64 images; the torch
       network loads those parameters and takes the same step in float32 and float64. The training loss (the
       forward pass), the test loss in eval mode after the step, and every parameter and running statistic
       after it (relative to the update, against torch float64) must agree; torch float32's own distance to
       float64 is printed beside petra's as the rounding-noise yardstick.
  Then, by --mode:

  speed (default)  For each thread count (--threads, default 1,2) times training steps of PyTorch (plain autograd
                   backprop, in each layout of --torch-formats: NCHW and channels_last by default), of petra-train
                   (--methods, default backprop; --revbackprop adds revbackprop; pipelined methods such as petra run
                   T CPU workers x 1 thread) and, with --official-src DIR, of the official PETRA code (PETRA, k = 1,
                   its one-process pipeline simulation) at the same batch size, on the same Fashion-MNIST images (no
                   augmentation), SGD (Nesterov 0.9, weight decay 5e-4 not on BN parameters and biases); a step is
                   data fetch + forward + loss + backward + optimizer step. Every run takes --warmup + --steps steps
                   (default 40 + 120); its speed is batch / the MEDIAN time of its steps --warmup .. --warmup+--steps-1
                   (default steps 40-159, issue 15's window) on every side: torch's and the official code's timed
                   in the child, petra's read from the per-step times of its --log-json. The peers of one thread
                   count run one after the other in one window, in reversed order at every repeat (--repeats R,
                   medians over the repeats). The table gives images/s, ms per step, the ratio to the faster torch
                   layout, and the GFLOP/s and fraction of the machine's peak (--peak-gflops-per-core x threads)
                   that a step reaches (work = 3 x the forward's FLOPs in convolutions and linear layers). The
                   script says when other processes competed for the CPU (this machine is shared).
  accuracy         Trains the PyTorch network with petra-train's default recipe: Fashion-MNIST, batch 64,
                   --epochs (default 10), SGD Nesterov momentum 0.9, lr 0.05 with a linear per-iteration
                   warm-up over 1 epoch (capped at half the run) then cosine to 0, weight decay 5e-4 (not on
                   BN parameters or biases), petra's augmentation for 28x28 images (random crop with 2 pixels
                   of black padding, horizontal flip with p = 1/2), normalisation mean 0.2860 std 0.3530,
                   test set evaluated after every epoch; prints the final test accuracy. --also-petra runs
                   petra-train with the same settings afterwards and prints both.
  evaluate         Loads petra's parameters from --params DIR (a `petra-train --save-params` directory or the
                   model/ directory of a checkpoint) into the PyTorch network and evaluates the test set twice:
                   with batch norm's running statistics (eval mode, what petra-train reports) and with each
                   test batch's own statistics (--batch-size images; the running statistics are not touched).
                   The first must reproduce petra-train's test accuracy; a large difference between the two
                   says the running statistics lag the parameters (docs/results-cpu.md section 7).

How to run (from the repository root, after building build/petra-train)
  python3 benchmarks/compare_pytorch.py                            # speed, revnet18 w16, batch 64, 1 and 2 threads
  python3 benchmarks/compare_pytorch.py --repeats 3 --methods backprop,revbackprop,petra --official-src PETRA --json
  python3 benchmarks/compare_pytorch.py --steps 8 --warmup 2 --threads 1       # a quick check (~1 minute)
  python3 benchmarks/compare_pytorch.py --mode accuracy --epochs 10 --threads 2 --also-petra
  python3 benchmarks/compare_pytorch.py --mode accuracy --epochs 1 --limit-train 2000 --limit-test 1000   # a quick check
  python3 benchmarks/compare_pytorch.py --mode evaluate --skip-checks --params ckpt/epoch-000005/model
  Any python3 can start it: the PyTorch work runs in child processes of --python (default /usr/bin/python3).

What it needs
  * Debian's PyTorch for /usr/bin/python3 (apt-get install python3-torch python3-numpy libopenblas0-pthread;
    the pyenv python3 on the PATH cannot import it). Without it the script stops with a message.
  * build/petra-train (--petra) for speed mode, --also-petra and the parameter-count check.
  * Fashion-MNIST's IDX .gz files in /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).

Timing environment (printed with the results, as issue 15 sets PyTorch up)
  The torch child gets OMP_NUM_THREADS = MKL_NUM_THREADS = OPENBLAS_NUM_THREADS = T and torch.set_num_threads(T)
  (torch.set_num_threads alone does not limit OpenBLAS); OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed, so
  that OpenBLAS autodetects its AVX-512 kernel (this machine's environment forces Haswell, 2x slower;
  --keep-openblas-coretype keeps them); and MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=68719476736
  MALLOC_TOP_PAD_=268435456, which keeps glibc from returning memory to the kernel between steps: page faults cost
  ~11.5 us per 4 KB page on these VMs and without this torch's step times vary by up to 2x (--malloc-tuning
  both|none to change). The child prints which OpenBLAS it loaded and the kernel it chose. The PyTorch network is
  written as a good PyTorch user (and the official PETRA code) writes it: the two streams travel as a pair of
  tensors, ReLUs are in place (--torch-net sliced: the older formulation, ~20% slower). petra-train gets
  --threads T and OMP_NUM_THREADS=T. In speed mode petra-train reads a copy of the same training images as an npy
  directory with a 64-image test set, so that its per-epoch test evaluation does not cost a full pass over 10000
  images (--petra-data fashion-mnist for the stock data set); the training step is the same.
  How to take a quiet measurement: docs/profiling.md.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "MALLOC_TOP_PAD_": "268435456",
}
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
CLASSES = 10
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
ARCHITECTURES = ("revnet18", "revnet34", "revnet50", "resnet18", "resnet34", "resnet50")


# ====================================================================== data (plain Python, no NumPy)
def read_idx_bytes(path: str) -> tuple[list[int], bytes]:
    """An IDX file (optionally .gz): its dimensions and its raw uint8 payload."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not a uint8 IDX file")
    dims = list(struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim]))
    payload = data[4 + 4 * ndim:]
    if len(payload) != math.prod(dims):
        raise SystemExit(f"{path}: {len(payload)} bytes of data for dimensions {dims}")
    return dims, payload


def fashion_files(data_dir: str) -> dict[str, str]:
    names = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
             "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
    out = {}
    for key, stem in names.items():
        for candidate in (stem + ".gz", stem):
            if os.path.exists(os.path.join(data_dir, candidate)):
                out[key] = os.path.join(data_dir, candidate)
                break
        else:
            raise SystemExit(f"Fashion-MNIST file {stem}(.gz) not found in {data_dir} "
                             "(apt-get install dataset-fashion-mnist, or pass --data-dir)")
    return out


def write_npy_u8(path: str, shape: list[int], payload: bytes) -> None:
    """A version-1.0 .npy file of uint8 with the given C-order shape."""
    header = "{'descr': '|u1', 'fortran_order': False, 'shape': (%s), }" % "".join(f"{d}, " for d in shape)
    pad = 64 - (10 + len(header) + 1) % 64
    header += " " * (pad % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(payload)


def write_npy_directory(directory: str, data_dir: str, train: int, test: int) -> None:
    """The first `train` training and `test` test images of Fashion-MNIST as petra's npy directory layout."""
    files = fashion_files(data_dir)
    for split, n, prefix in (("train", train, ""), ("test", test, "test_")):
        dims, images = read_idx_bytes(files[f"{split}_images"])
        _, labels = read_idx_bytes(files[f"{split}_labels"])
        n = min(n, dims[0])
        plane = dims[1] * dims[2]
        write_npy_u8(os.path.join(directory, prefix + "images.npy"), [n, dims[1], dims[2]], images[:n * plane])
        write_npy_u8(os.path.join(directory, prefix + "labels.npy"), [n], labels[:n])
    with open(os.path.join(directory, "classes.txt"), "w") as f:  # petra-train reads the class count from it
        f.write("".join(f"{name}\n" for name in FASHION_CLASSES))


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def blas_description() -> str:
    """In the torch child: which OpenBLAS this process loaded and the kernel it chose (openblas_get_corename),
    read through ctypes from the library mapped in /proc/self/maps."""
    import ctypes
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
    except OSError:
        paths = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_config.restype = ctypes.c_char_p
            return (f"{path}: kernel {lib.openblas_get_corename().decode()}, "
                    f"{lib.openblas_get_config().decode().strip()}, {lib.openblas_get_num_threads()} thread(s)")
        except (OSError, AttributeError):
            continue
    return "no OpenBLAS loaded (reference BLAS? install libopenblas0-pthread)"


# ====================================================================== the PyTorch side (runs in the child)
def torch_network(torch, pair: bool = True):
    """The PyTorch twin of petra's networks (nn/models.cpp, nn/blocks.cpp): returns
    make_model(arch, width, in_channels, classes, stem). Shared by this script's worker and by
    benchmarks/pytorch_gpu.py (the GPU peer)."""
    nn, F = torch.nn, torch.nn.functional

    # ---------------------------------------------------------------- the network, as nn/blocks.cpp
    def conv(cin, cout, k, s):
        return nn.Conv2d(cin, cout, k, s, k // 2, bias=True)

    # Module and parameter names follow petra's (stages.J.f.conv1.weight, ...), so that a state_dict
    # has exactly the names of petra-train --save-params (plus BatchNorm's num_batches_tracked).
    # Two formulations of the same network (same parameters, same numbers), chosen by pair (cfg["net"]):
    #   "pair"   (default) as a good PyTorch user writes a RevNet, and as the official PETRA code does: the two
    #            streams travel between blocks as a pair of tensors (no slicing or concatenation per block), and
    #            each ReLU is in place (on batch norm's fresh output, which its backward does not need).
    #   "sliced" the formulation this script had until issue 15: one tensor of 2C channels, sliced into the
    #            streams and concatenated again in every block, out-of-place ReLUs. About 20% slower at 1
    #            thread; kept so that the old figures of docs/results-cpu.md can be reproduced.

    def relu(x):
        return F.relu(x, inplace=True) if pair else F.relu(x)

    class ResidualFunction(nn.Module):  # conv -> BN -> ReLU for each layer (ReLU after the last too)
        def __init__(self, layers):
            super().__init__()
            self.n = len(layers)
            for i, (cin, cout, k, s) in enumerate(layers, 1):
                setattr(self, f"conv{i}", conv(cin, cout, k, s))
                setattr(self, f"bn{i}", nn.BatchNorm2d(cout))

        def forward(self, x):
            for i in range(1, self.n + 1):
                x = relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
            return x

    def basic_f(cin, cout, stride):
        return ResidualFunction([(cin, cout, 3, stride), (cout, cout, 3, 1)])

    def bottleneck_f(cin, hidden, cout, stride):
        return ResidualFunction([(cin, hidden, 1, 1), (hidden, hidden, 3, stride), (hidden, cout, 1, 1)])

    def streams(x, c):  # the two streams, from a pair or from one tensor of 2c channels
        return x if pair else (x[:, :c], x[:, c:])

    def joined(y1, y2):
        return (y1, y2) if pair else torch.cat([y1, y2], 1)

    class Stem(nn.Module):  # conv -> BN -> ReLU (-> max pool); the output's channel halves are the streams
        def __init__(self, cin, cout, imagenet, split=False):
            super().__init__()
            self.imagenet, self.split = imagenet, split and pair
            self.conv = conv(cin, cout, 7, 2) if imagenet else conv(cin, cout, 3, 1)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x):
            y = relu(self.bn(self.conv(x)))
            y = F.max_pool2d(y, 2, 2) if self.imagenet else y
            return torch.chunk(y, 2, 1) if self.split else y

    class Reversible(nn.Module):  # (x1, x2) -> (x2 + F(x1), x1), x1 = the first half of the channels
        def __init__(self, f, c):
            super().__init__()
            self.f, self.c = f, c

        def forward(self, x):
            x1, x2 = streams(x, self.c)
            return joined(x2 + self.f(x1), x1)

    class BasicTransition(nn.Module):  # h = ReLU(BN(conv3x3_s2(x1))); (ReLU(BN(conv3x3(h))) + BN(conv1x1_s2(x2)), h)
        def __init__(self, cin, cout):
            super().__init__()
            self.cin = cin
            self.conv1, self.bn1 = conv(cin, cout, 3, 2), nn.BatchNorm2d(cout)
            self.conv2, self.bn2 = conv(cout, cout, 3, 1), nn.BatchNorm2d(cout)
            self.conv_proj, self.bn_proj = conv(cin, cout, 1, 2), nn.BatchNorm2d(cout)

        def forward(self, x):
            x1, x2 = streams(x, self.cin)
            h = relu(self.bn1(self.conv1(x1)))
            # h is an output too: the ReLU on conv2's path is on a fresh tensor, h is not overwritten
            y1 = relu(self.bn2(self.conv2(h))) + self.bn_proj(self.conv_proj(x2))
            return joined(y1, h)

    class BottleneckTransition(nn.Module):  # (F_s(x1) + BN(conv1x1_s(x2)), BN(conv1x1_s(x1)))
        def __init__(self, cin, hidden, cout, stride):
            super().__init__()
            self.cin = cin
            self.f = bottleneck_f(cin, hidden, cout, stride)
            self.conv_proj1, self.bn_proj1 = conv(cin, cout, 1, stride), nn.BatchNorm2d(cout)
            self.conv_proj2, self.bn_proj2 = conv(cin, cout, 1, stride), nn.BatchNorm2d(cout)

        def forward(self, x):
            x1, x2 = streams(x, self.cin)
            y1 = self.f(x1) + self.bn_proj2(self.conv_proj2(x2))
            y2 = self.bn_proj1(self.conv_proj1(x1))
            return joined(y1, y2)

    class ResidualBlock(nn.Module):  # torchvision layout, conv biases; ReLU(G(x) + shortcut(x))
        def __init__(self, bottleneck, cin, hidden, cout, stride):
            super().__init__()
            layers = ([(cin, hidden, 1, 1), (hidden, hidden, 3, stride), (hidden, cout, 1, 1)] if bottleneck
                      else [(cin, cout, 3, stride), (cout, cout, 3, 1)])
            self.n = len(layers)
            for i, (ci, co, k, s) in enumerate(layers, 1):
                setattr(self, f"conv{i}", conv(ci, co, k, s))
                setattr(self, f"bn{i}", nn.BatchNorm2d(co))
            self.has_proj = stride != 1 or cin != cout
            if self.has_proj:
                self.conv_proj, self.bn_proj = conv(cin, cout, 1, stride), nn.BatchNorm2d(cout)

        def forward(self, x):
            h = x
            for i in range(1, self.n + 1):
                h = getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(h))
                if i < self.n:
                    h = relu(h)
            return relu(h + (self.bn_proj(self.conv_proj(x)) if self.has_proj else x))

    class Head(nn.Module):  # global average pool -> linear (the cross-entropy is in the step)
        def __init__(self, channels, classes, streams_in=False):
            super().__init__()
            self.fc = nn.Linear(channels, classes)
            self.streams_in = streams_in and pair

        def forward(self, x):
            if self.streams_in:  # the pooled streams side by side: the same numbers as pooling their concatenation
                return self.fc(torch.cat([x[0].mean(dim=(2, 3)), x[1].mean(dim=(2, 3))], 1))
            return self.fc(x.mean(dim=(2, 3)))

    class Model(nn.Module):
        def __init__(self, stages):
            super().__init__()
            self.stages = nn.ModuleList(stages)

        def forward(self, x):
            for stage in self.stages:
                x = stage(x)
            return x

    def make_model(arch, w, in_channels, classes, stem):  # nn/models.cpp
        reversible = arch.startswith("revnet")
        bottleneck = arch.endswith("50")
        blocks = [2, 2, 2, 2] if arch.endswith("18") else [3, 4, 6, 3]
        expansion = 4 if bottleneck else 1
        imagenet = stem == "imagenet"
        stages = []
        if reversible:
            stream = w
            stages.append(Stem(in_channels, 2 * w, imagenet, split=True))
            for g, nb in enumerate(blocks):
                hidden = w << g
                out, stride = hidden * expansion, (1 if g == 0 else 2)
                for b in range(nb):
                    if b == 0 and (stride != 1 or stream != out):
                        stages.append(BottleneckTransition(stream, hidden, out, stride) if bottleneck
                                      else BasicTransition(stream, out))
                    else:
                        f = bottleneck_f(out, hidden, out, 1) if bottleneck else basic_f(out, out, 1)
                        stages.append(Reversible(f, out))
                    stream = out
            stages.append(Head(2 * stream, classes, streams_in=True))
        else:
            channels = w
            stages.append(Stem(in_channels, w, imagenet))
            for g, nb in enumerate(blocks):
                hidden = w << g
                out = hidden * expansion
                for b in range(nb):
                    stages.append(ResidualBlock(bottleneck, channels, hidden, out, 2 if (g > 0 and b == 0) else 1))
                    channels = out
            stages.append(Head(channels, classes))
        return Model(stages)

    return make_model


def worker_main(config_path: str) -> None:
    with open(config_path) as f:
        cfg = json.load(f)
    import numpy as np
    import torch

    threads = cfg["threads"]
    torch.set_num_threads(threads)
    torch.manual_seed(cfg["seed"])
    nn, F = torch.nn, torch.nn.functional

    pair = cfg.get("net", "pair") == "pair"
    make_model = torch_network(torch, pair)

    # ---------------------------------------------------------------- data
    def load_idx(path):
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            data = f.read()
        ndim = data[3]
        dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
        return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)

    files = fashion_files(cfg["data_dir"])

    def split(name, limit):
        images = load_idx(files[f"{name}_images"])
        labels = load_idx(files[f"{name}_labels"])
        if limit:
            images, labels = images[:limit], labels[:limit]
        return torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))

    def normalise(u8):
        return (u8.float() / 255.0 - FASHION_MEAN) / FASHION_STD

    # petra's augmentation (data/transforms.cpp): shift (dy, dx) uniform in [-pad, pad], output pixel (y, x) =
    # input (y + dy, x + dx) or black padding outside; then a horizontal flip of the crop with p = 1/2.
    def augment(u8, pad, gen):
        n, _, h, w = u8.shape
        padded = F.pad(u8, (pad, pad, pad, pad))  # uint8 zeros = black
        dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
        dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
        flip = torch.randint(0, 2, (n,), generator=gen).bool()
        ys = dy[:, None] + torch.arange(h)[None, :]                                   # [n, h]
        xs = torch.arange(w)[None, :].expand(n, w)
        xs = torch.where(flip[:, None], w - 1 - xs, xs) + dx[:, None]                # [n, w]
        rows = padded[:, 0].gather(1, ys[:, :, None].expand(n, h, w + 2 * pad))      # [n, h, w + 2 pad]
        return rows.gather(2, xs[:, None, :].expand(n, h, w)).unsqueeze(1)

    def load_petra_parameters(net, directory):
        """petra's .npy parameters and running statistics (--save-params, a checkpoint's model/) into net."""
        with torch.no_grad():
            for k, tensor in net.state_dict().items():
                if k.endswith("num_batches_tracked"):
                    continue
                path = os.path.join(directory, k + ".npy")
                if not os.path.exists(path):
                    raise SystemExit(f"torch: {path} is missing: not a petra parameter directory of this network")
                value = torch.from_numpy(np.load(path))
                if value.numel() != tensor.numel():
                    raise SystemExit(f"torch: {path} holds {list(value.shape)}, this network's {k} is "
                                     f"{list(tensor.shape)}: pass petra-train's --model and --width")
                tensor.copy_(value.reshape(tensor.shape))

    # ---------------------------------------------------------------- optimisation, as petra's trainer
    model = make_model(cfg["model"], cfg["width"], 1, CLASSES, cfg["stem"])
    params = sum(p.numel() for p in model.parameters())
    if cfg.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    decay = [p for p in model.parameters() if p.ndim > 1]       # conv and linear weights
    no_decay = [p for p in model.parameters() if p.ndim <= 1]   # BN gamma/beta, biases
    opt = torch.optim.SGD([{"params": decay, "weight_decay": cfg["weight_decay"]},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=cfg["lr"], momentum=cfg["momentum"], nesterov=cfg["momentum"] > 0)
    batch = cfg["batch_size"]

    def learning_rate(it, per_epoch, epochs):  # nn/schedule.cpp, cosine with the trainer's warm-up cap
        warm = min(cfg["warmup_epochs"], 0.5 * epochs) * per_epoch
        if it < warm:
            return cfg["lr"] * min(1.0, (it + 1) / warm)
        progress = min(max((it - warm) / (epochs * per_epoch - warm), 0.0), 1.0)
        return cfg["lr"] * 0.5 * (1 + math.cos(math.pi * progress))

    def train_step(x, y, lr):
        for group in opt.param_groups:
            group["lr"] = lr
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item(), int((logits.argmax(1) == y).sum())

    def to_input(u8):
        x = normalise(u8)
        return x.contiguous(memory_format=torch.channels_last) if cfg.get("channels_last") else x

    def forward_flops(net, x):
        """FLOPs (2 per multiply-add) of one forward pass in its convolutions and linear layers."""
        total = [0]

        def count(module, inputs, output):
            if isinstance(module, nn.Conv2d):
                kh, kw = module.kernel_size
                total[0] += 2 * output.numel() * (module.in_channels // module.groups) * kh * kw
            elif isinstance(module, nn.Linear):
                total[0] += 2 * output.numel() * module.in_features
        hooks = [m.register_forward_hook(count) for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        net.eval()
        with torch.no_grad():
            net(x)
        for h in hooks:
            h.remove()
        return total[0]

    result = {"torch_version": torch.__version__, "torch_threads": torch.get_num_threads(), "parameters": params,
              "blas": blas_description(), "net": cfg.get("net", "pair"),
              "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
              "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
              "thread_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
              "malloc_tuning": all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()),
              "channels_last": bool(cfg.get("channels_last")), "loadavg_start": os.getloadavg()[0]}

    if cfg["task"] == "params":
        pass
    elif cfg["task"] == "equivalence":
        # petra's initial parameters loaded here, the same steps on the same batches, in float32 and in float64;
        # then the updates (after - before) of every parameter and running statistic are compared: petra's and
        # torch float32's against torch float64 (torch float32 against float64 is the rounding noise floor).
        init_dir, after_dir, data_dir = (os.path.join(cfg["equivalence_dir"], d) for d in ("init", "after", "data"))
        names = sorted(k for k in model.state_dict() if not k.endswith("num_batches_tracked"))
        petra_names = {f[:-4] for f in os.listdir(init_dir) if f.endswith(".npy")}
        load = lambda d, k: torch.from_numpy(np.load(os.path.join(d, k + ".npy")))
        state = model.state_dict()
        shapes = {k: list(load(init_dir, k).shape) for k in petra_names & set(names)}
        result["only_in_torch"] = sorted(set(names) - petra_names)
        result["only_in_petra"] = sorted(petra_names - set(names))
        result["shape_mismatches"] = sorted(f"{k}: torch {list(state[k].shape)}, petra {shapes[k]}"
                                            for k in shapes if list(state[k].shape) != shapes[k])
        if not (result["only_in_torch"] or result["only_in_petra"] or result["shape_mismatches"]):
            u8 = torch.from_numpy(np.load(os.path.join(data_dir, "images.npy"))).unsqueeze(1)
            y = torch.from_numpy(np.load(os.path.join(data_dir, "labels.npy")).astype(np.int64))
            test_u8 = torch.from_numpy(np.load(os.path.join(data_dir, "test_images.npy"))).unsqueeze(1)
            test_y = torch.from_numpy(np.load(os.path.join(data_dir, "test_labels.npy")).astype(np.int64))
            # data/dataset.cpp compute_normalization: statistics of the training bytes, in double; the
            # images are normalised in float32 as petra's byte table does
            v = u8.double() / 255.0
            mean = float(v.mean())
            std = math.sqrt(max(float((v * v).mean()) - mean * mean, 0.0))
            m32, s32 = torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
            norm = lambda t: (t.float() / 255.0 - m32) / s32
            runs = {}
            for dtype in (torch.float64, torch.float32):
                net = make_model(cfg["model"], cfg["width"], 1, CLASSES, cfg["stem"]).to(dtype)
                load_petra_parameters(net, init_dir)
                st = net.state_dict()
                sgd = torch.optim.SGD([{"params": [p for p in net.parameters() if p.ndim > 1],
                                        "weight_decay": cfg["weight_decay"]},
                                       {"params": [p for p in net.parameters() if p.ndim <= 1], "weight_decay": 0.0}],
                                      lr=cfg["lr"], momentum=cfg["momentum"], nesterov=True)
                net.train()
                losses = []
                for step in range(cfg["steps"]):
                    sl = slice(step * batch, (step + 1) * batch)
                    loss = F.cross_entropy(net(norm(u8[sl]).to(dtype)), y[sl])
                    sgd.zero_grad(set_to_none=True)
                    loss.backward()
                    sgd.step()
                    losses.append(float(loss))
                net.eval()
                with torch.no_grad():
                    test_loss = float(F.cross_entropy(net(norm(test_u8).to(dtype)), test_y))
                runs[str(dtype)] = {"state": {k: st[k].double() for k in names},
                                    "train_loss": sum(losses) / len(losses), "test_loss": test_loss}
            ref, t32 = runs["torch.float64"], runs["torch.float32"]
            petra_after = {k: load(after_dir, k).double() for k in names}

            init = {k: load(init_dir, k).double() for k in names}
            updates = {k: float((ref["state"][k] - init[k]).norm()) for k in names}
            total = sum(ref["state"][k].numel() for k in names)
            rms = math.sqrt(sum(u * u for u in updates.values()) / total)  # a typical update of one number

            def worst(other):
                # |other - ref| / |update of ref| per tensor (Frobenius norms); tensors whose gradient is zero
                # in exact arithmetic (a conv bias before BN, a BN bias whose shift a later BN removes) are
                # measured against 1% of a typical update instead of their own rounding noise.
                errors = {}
                for k in names:
                    scale = max(updates[k], 1e-2 * rms * math.sqrt(init[k].numel()), 1e-30)
                    errors[k] = float((other[k] - ref["state"][k]).norm()) / scale
                where = max(errors, key=errors.get)
                return errors[where], where, errors


            result["petra_vs_float64"], result["petra_worst"], petra_errors = worst(petra_after)
            result["float32_vs_float64"], result["float32_worst"], t32_errors = worst(t32["state"])
            result["float32_on_petra_worst"] = t32_errors[result["petra_worst"]]
            result.update({"compared_tensors": len(names), "train_loss": t32["train_loss"],
                           "test_loss": t32["test_loss"], "train_loss_float64": ref["train_loss"],
                           "test_loss_float64": ref["test_loss"]})
    elif cfg["task"] == "speed":
        warmup, steps = cfg["warmup"], cfg["steps"]
        images, labels = split("train", cfg["limit_train"])
        images = normalise(images)
        n = images.shape[0]
        per_epoch = (n + batch - 1) // batch
        gen = torch.Generator().manual_seed(cfg["seed"])
        order = torch.cat([torch.randperm(n, generator=gen) for _ in range((warmup + steps) * batch // n + 1)])
        result["forward_gflop"] = forward_flops(model, to_input(images[:batch] * 0 + 0.5)) / 1e9
        model.train()
        times, cpu = [], 0.0
        for step in range(warmup + steps):
            t0, c0 = time.perf_counter(), time.process_time()
            idx = order[step * batch:(step + 1) * batch]
            x = images.index_select(0, idx)
            if cfg.get("channels_last"):
                x = x.contiguous(memory_format=torch.channels_last)
            train_step(x, labels.index_select(0, idx), learning_rate(step, per_epoch, 1000))
            times.append(time.perf_counter() - t0)
            if step >= warmup:
                cpu += time.process_time() - c0
        steady = times[warmup:]
        result.update({
            "warmup": warmup, "steps": steps, "batch_size": batch, "step_seconds": times,
            "images_per_second_all": (warmup + steps) * batch / sum(times),
            "median_step_ms": 1000 * median(steady),
            "images_per_second_steady": batch / median(steady),
            "min_step_ms": 1000 * min(steady), "max_step_ms": 1000 * max(steady),
            "first_step_ms": 1000 * times[0],
            "cpu_utilisation": cpu / sum(steady),   # process CPU seconds per wall second (<= threads)
            "loadavg_end": os.getloadavg()[0]})
    elif cfg["task"] == "official":
        # The official PETRA code (stephane-rivaud/PETRA) as a peer: its own layers, optimizer and one-process
        # pipeline simulation (AsynchronousSequential.forward_and_update, then synchronize_layers as its main.py
        # does with the default --synchronization-period 1), with PETRA's settings (main.py --remove-ctx-input
        # --remove-ctx-param: no input stored by the reversible blocks, no parameter stash), k = 1. Its
        # make_layers_revnet18 hard-codes 3 input channels and width 64, so the same layers are built here as it
        # builds them, with 1 input channel and this width. Nothing of its method is changed.
        sys.path.insert(0, cfg["official_src"])
        if not hasattr(torch, "func"):
            # The official code calls torch.func.vjp (PyTorch >= 2.0); PyTorch 1.13 has the same function as
            # functorch.vjp, which torch.func was renamed from. Only the name is supplied; nothing else changes.
            import functorch
            torch.func = functorch
            result["torch_func_from_functorch"] = True
        from async_torch.layers.compression import QuantizSimple
        from async_torch.models.models_RevNet import AVGFlattenFullyConnectedCE, BasicBlock, ConvBNReLUMax
        from async_torch.optim.optimizer import add_optimizer
        from async_torch.sequential_layers import AsynchronousSequential
        if cfg["model"] != "revnet18" or cfg["stem"] != "cifar":
            raise SystemExit("torch: --official-src runs revnet18 with the cifar stem only")
        common = dict(store_vjp=False, store_param=False, accumulation_steps=1, accumulation_averaging=False,
                      quantizer=QuantizSimple, quantize_forward_communication=False,
                      quantize_backward_communication=False)
        channels = [2 * cfg["width"] * m for m in (1, 2, 4, 8)]  # both streams, as the official builder counts
        layers = [ConvBNReLUMax(1, channels[0], kernel_size=3, padding=1, stride=1, max_pool=False, first_layer=True,
                                store_input=True, quantize_buffer=False, **common)]
        x_ch = channels[0]
        for c in channels:
            if x_ch != c:
                layers.append(BasicBlock(x_ch, c, stride=2, downsample=True, padding=1, store_input=True,
                                         quantize_buffer=False, **common))
            else:
                layers.append(BasicBlock(x_ch, c, padding=1, store_input=False, approximate_input=False,
                                         quantize_buffer=False, **common))
            layers.append(BasicBlock(c, c, padding=1, store_input=False, approximate_input=False,
                                     quantize_buffer=False, **common))
            x_ch = c
        layers.append(AVGFlattenFullyConnectedCE(channels[-1], CLASSES, **common))
        for layer in layers:  # main.py --no-bn-weight-decay, as petra: no decay on BN parameters and biases
            kwargs = {"lr": cfg["lr"], "momentum": cfg["momentum"], "dampening": 0.0, "nesterov": True,
                      "maximize": False}
            add_optimizer(layer, "sgd", dict(kwargs, weight_decay=cfg["weight_decay"]),
                          lambda name: "_bn" not in name and "bias" not in name)
            add_optimizer(layer, "sgd", dict(kwargs, weight_decay=0.0), lambda name: "_bn" in name or "bias" in name)
        net = AsynchronousSequential(layers).to(torch.device("cpu"), torch.float32)
        result["official_parameters"] = sum(getattr(l, n + "_backward").numel() for l in layers
                                            for n in l.list_parameters)
        warmup, steps = cfg["warmup"], cfg["steps"]
        images, labels = split("train", cfg["limit_train"])
        images = normalise(images)
        n = images.shape[0]
        per_epoch = (n + batch - 1) // batch
        gen = torch.Generator().manual_seed(cfg["seed"])
        order = torch.cat([torch.randperm(n, generator=gen) for _ in range((warmup + steps) * batch // n + 1)])
        times = []
        for step in range(warmup + steps):
            t0 = time.perf_counter()
            idx = order[step * batch:(step + 1) * batch]
            net.set_lr(learning_rate(step, per_epoch, 1000))
            with torch.no_grad():
                net.forward_and_update(images.index_select(0, idx), labels.index_select(0, idx), step)
            net.synchronize_layers()
            times.append(time.perf_counter() - t0)
        steady = times[warmup:]
        result.update({"warmup": warmup, "steps": steps, "batch_size": batch, "step_seconds": times,
                       "median_step_ms": 1000 * median(steady), "images_per_second_steady": batch / median(steady)})
    elif cfg["task"] == "accuracy":
        train_u8, train_y = split("train", cfg["limit_train"])
        test_u8, test_y = split("test", cfg["limit_test"])
        test_x = normalise(test_u8)
        n, epochs = train_u8.shape[0], cfg["epochs"]
        per_epoch = (n + batch - 1) // batch
        h = train_u8.shape[2]
        pad = (h // 8) if h >= 32 else (2 if h >= 16 else 1)      # data/dataset.cpp default_augmentation
        gen = torch.Generator().manual_seed(cfg["seed"])
        history, it = [], 0
        print(f"torch: {cfg['model']} width {cfg['width']}, {params} parameters, {n} train / {test_x.shape[0]} test "
              f"images, batch {batch}, {epochs} epoch(s), {torch.get_num_threads()} thread(s), augmentation: "
              f"{'crop pad %d + flip' % pad if cfg['augment'] else 'none'}", flush=True)
        for epoch in range(epochs):
            model.train()
            order = torch.randperm(n, generator=gen)
            loss_sum, correct, t0 = 0.0, 0, time.perf_counter()
            for b in range(per_epoch):
                idx = order[b * batch:(b + 1) * batch]
                u8 = train_u8.index_select(0, idx)
                if cfg["augment"]:
                    u8 = augment(u8, pad, gen)
                lr = learning_rate(it, per_epoch, epochs)
                loss, c = train_step(to_input(u8), train_y.index_select(0, idx), lr)
                if not math.isfinite(loss):
                    raise SystemExit(f"torch: the loss became {loss} at epoch {epoch + 1}, step {b}")
                loss_sum += loss * idx.numel()
                correct += c
                it += 1
            seconds = time.perf_counter() - t0
            model.eval()
            test_loss, test_correct = 0.0, 0
            with torch.no_grad():
                for b in range(0, test_x.shape[0], 500):
                    x = test_x[b:b + 500]
                    if cfg.get("channels_last"):
                        x = x.contiguous(memory_format=torch.channels_last)
                    logits = model(x)
                    y = test_y[b:b + 500]
                    test_loss += float(F.cross_entropy(logits, y, reduction="sum"))
                    test_correct += int((logits.argmax(1) == y).sum())
            row = {"epoch": epoch + 1, "train_loss": loss_sum / n, "train_accuracy": correct / n,
                   "test_loss": test_loss / test_x.shape[0], "test_accuracy": test_correct / test_x.shape[0],
                   "images_per_second": n / seconds, "seconds": seconds, "lr": lr}
            history.append(row)
            print(f"torch epoch {epoch + 1}/{epochs}: train loss {row['train_loss']:.4f} acc "
                  f"{100 * row['train_accuracy']:.2f}% | test loss {row['test_loss']:.4f} acc "
                  f"{100 * row['test_accuracy']:.2f}% | {row['images_per_second']:.0f} img/s | lr {lr:.5f} | "
                  f"{seconds:.1f} s", flush=True)
        result.update({"epochs": history, "final_test_accuracy": history[-1]["test_accuracy"] if history else None})
    elif cfg["task"] == "evaluate":
        load_petra_parameters(model, cfg["params"])
        test_u8, test_y = split("test", cfg["limit_test"])
        test_x = normalise(test_u8)

        def evaluate(batch_statistics):
            model.train(batch_statistics)
            for m in model.modules():  # momentum 0: batch statistics used, running ones left as loaded
                if isinstance(m, nn.BatchNorm2d):
                    m.momentum = 0.0
            loss, correct = 0.0, 0
            with torch.no_grad():
                for b in range(0, test_x.shape[0], batch):
                    logits = model(test_x[b:b + batch])
                    y = test_y[b:b + batch]
                    loss += float(F.cross_entropy(logits, y, reduction="sum"))
                    correct += int((logits.argmax(1) == y).sum())
            return {"test_loss": loss / test_x.shape[0], "test_accuracy": correct / test_x.shape[0]}

        result.update({"running_statistics": evaluate(False), "batch_statistics": evaluate(True)})
    with open(cfg["result"], "w") as f:
        json.dump(result, f)


# ====================================================================== the parent
def die(message: str) -> None:
    print(f"compare_pytorch.py: {message}", file=sys.stderr)
    sys.exit(2)


def check_torch(python: str) -> str:
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        die(f"{python} does not exist. PyTorch comes from Debian's python3-torch for /usr/bin/python3 "
            "(apt-get install python3-torch python3-numpy libopenblas0-pthread); --python names another interpreter.")
    probe = subprocess.run([python, "-c", "import torch, numpy; print(torch.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        die(f"{python} cannot import torch and numpy ({last}).\n  Install Debian's PyTorch: apt-get install "
            "python3-torch python3-numpy libopenblas0-pthread (it is for /usr/bin/python3; the pyenv python3 on "
            "the PATH cannot import it), or pass --python with an interpreter that has torch.")
    return probe.stdout.strip()


def other_runnable(samples: int = 5, interval: float = 0.1) -> int:
    """Runnable tasks other than this script right now (median of a few reads of /proc/loadavg's 4th field)."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return 0
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, sorted(counts)[len(counts) // 2])


def torch_env(args, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    if args.malloc_tuning in ("torch", "both"):
        env.update(MALLOC_ENV)
    if not args.keep_openblas_coretype:  # OpenBLAS picks its AVX-512 kernel itself (issue 15's setting)
        env.pop("OPENBLAS_CORETYPE", None)
        env.pop("OPENBLAS_L2_SIZE", None)
    return env


def petra_env(args, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    if args.malloc_tuning == "both":
        env.update(MALLOC_ENV)
    return env


def run_torch(args, task: str, threads: int, tmp: str, **extra) -> dict:
    result_path = os.path.join(tmp, f"torch-{task}-{threads}.json")
    cfg = {"task": task, "threads": threads, "model": args.model, "width": args.width, "stem": args.stem,
           "batch_size": args.batch_size, "seed": args.seed, "data_dir": args.data_dir, "lr": args.lr,
           "momentum": 0.9, "weight_decay": 5e-4, "warmup_epochs": 1.0, "channels_last": args.channels_last,
           "net": args.torch_net,
           "limit_train": args.limit_train, "limit_test": args.limit_test, "result": result_path, **extra}
    cfg_path = os.path.join(tmp, f"torch-{task}-{threads}.config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    proc = subprocess.run([args.python, os.path.abspath(__file__), "--worker", cfg_path], env=torch_env(args, threads))
    if proc.returncode != 0 or not os.path.exists(result_path):
        die(f"the torch child ({args.python}, task {task}, {threads} thread(s)) failed with exit code {proc.returncode}")
    with open(result_path) as f:
        return json.load(f)


def petra_parameters(args) -> int | None:
    cmd = [args.petra, "--print-model", "--model", args.model, "--width", str(args.width), "--stem", args.stem,
           "--classes", str(CLASSES), "--data-dir", args.data_dir]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"total parameters: (\d+)", proc.stdout)
    if proc.returncode != 0 or not m:
        print(f"warning: could not read petra's parameter count from {' '.join(cmd)}:\n{proc.stdout}{proc.stderr}",
              file=sys.stderr)
        return None
    return int(m.group(1))


def run_petra(args, threads: int, method: str | None, extra: list[str], log_json: str | None,
              quiet: bool) -> list[dict]:
    """Runs petra-train with the model options, --threads and `extra`; returns its JSON log lines."""
    cmd = [args.petra, "--model", args.model, "--width", str(args.width), "--stem", args.stem,
           "--classes", str(CLASSES), "--batch-size", str(args.batch_size), "--threads", str(threads),
           "--seed", str(args.seed)] + (["--method", method] if method else []) + extra
    if log_json:
        cmd += ["--log-json", log_json]
        if os.path.exists(log_json):
            os.remove(log_json)
    if not quiet:
        print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=petra_env(args, threads), text=True,
                          stdout=subprocess.PIPE if quiet else None, stderr=subprocess.STDOUT if quiet else None)
    if proc.returncode != 0:
        die(f"petra-train failed with exit code {proc.returncode}: {' '.join(cmd)}\n{proc.stdout or ''}")
    if not log_json:
        return []
    with open(log_json) as f:
        return [json.loads(line) for line in f if line.strip()]


def check_equivalence(args, tmp: str, report: dict) -> None:
    """Same network, numerically: petra's initial parameters go into the torch model, both take one training step
    on the same batch (no shuffle, no augmentation, constant lr, 1 thread), and every parameter and running
    statistic is compared afterwards, with the training loss (the forward pass at the initial parameters) and the
    test loss in evaluation mode after the step. One step: the comparison is of the gradients (through SGD's
    first update), before chaotic growth of rounding differences sets in."""
    steps = 1
    base = os.path.join(tmp, "equivalence")
    data = os.path.join(base, "data")
    os.makedirs(data)
    write_npy_directory(data, args.data_dir, steps * args.batch_size, 64)
    data_args = ["--dataset", "npy", "--data-dir", data]
    run_petra(args, 1, "backprop", data_args + ["--epochs", "0", "--schedule", "constant",
                                          "--save-params", os.path.join(base, "init")], None, quiet=True)
    log = run_petra(args, 1, "backprop", data_args + [
        "--load-params", os.path.join(base, "init"), "--epochs", "1", "--max-steps", str(steps), "--no-shuffle",
        "--no-augment", "--schedule", "constant", "--warmup-epochs", "0", "--lr", str(args.lr), "--momentum", "0.9",
        "--weight-decay", "0.0005", "--optimizer", "sgd", "--save-params", os.path.join(base, "after")],
        os.path.join(base, "log.jsonl"), quiet=True)
    t = run_torch(args, "equivalence", 1, tmp, equivalence_dir=base, steps=steps, channels_last=False)
    structural = t["only_in_torch"] + t["only_in_petra"] + t["shape_mismatches"]
    if structural:
        die("the PyTorch network is not petra's:\n  only in torch: %s\n  only in petra: %s\n  shapes: %s" % (
            t["only_in_torch"], t["only_in_petra"], t["shape_mismatches"]))
    petra_epoch = log[0]
    rel = lambda x, r: abs(x - r) / max(abs(r), 1e-12)
    train_diff = rel(petra_epoch["train_loss"], t["train_loss_float64"])
    test_diff = rel(petra_epoch["test_loss"], t["test_loss_float64"])
    # Thresholds: the forward pass agrees to ~1e-7 and the updates to a few 1e-3 (up to 2e-2 for a BN bias whose
    # gradient is a sum with much cancellation); a different network gives differences of order 1e-2 to 1 in the
    # loss and of order 1 in the updates.
    noise = t["float32_vs_float64"]
    ok = t["petra_vs_float64"] < 5e-2 and train_diff < 1e-5 and test_diff < 1e-4
    report["equivalence"] = {
        "steps": steps, "tensors": t["compared_tensors"],
        "max_update_difference_petra_vs_torch_float64": t["petra_vs_float64"], "petra_worst_tensor": t["petra_worst"],
        "max_update_difference_torch_float32_vs_float64": noise, "torch_float32_worst_tensor": t["float32_worst"],
        "train_loss": {"petra": petra_epoch["train_loss"], "torch_float32": t["train_loss"],
                       "torch_float64": t["train_loss_float64"]},
        "test_loss": {"petra": petra_epoch["test_loss"], "torch_float32": t["test_loss"],
                      "torch_float64": t["test_loss_float64"]},
        "ok": ok}
    print(f"equivalence: the same {t['compared_tensors']} tensors (names and shapes). From petra's initial parameters, "
          f"{steps} SGD step(s) of {args.batch_size} images, compared with torch in float64 (worst tensor's "
          f"|difference| / |update|): petra {t['petra_vs_float64']:.1e} "
          f"({t['petra_worst']}; torch float32 there: {t['float32_on_petra_worst']:.1e}), torch float32 {noise:.1e} ({t['float32_worst']}); train loss petra "
          f"{petra_epoch['train_loss']:.6f} torch {t['train_loss_float64']:.6f}; test loss (eval mode) petra "
          f"{petra_epoch['test_loss']:.6f} torch {t['test_loss_float64']:.6f}: "
          f"{'OK' if ok else 'DIFFERENT'}", flush=True)
    if not ok:
        die("the PyTorch network does not compute what petra's does (see the line above); the comparison would be "
            "unfair. Check nn/blocks.cpp and nn/models.cpp against this script (--skip-checks runs it anyway).")


def steady_window(args) -> tuple[int, int]:
    """The steps [first, last) whose median step time is the steady speed, the same on every side."""
    return args.warmup, args.warmup + args.steps


def petra_speed(args, threads: int, method: str, data_args: list[str], tmp: str) -> dict:
    """One petra-train run of --warmup + --steps steps; the median of the steady steps' times from its --log-json
    (each epoch line holds its steps' wall times). PETRA runs on `threads` CPU workers of one thread each."""
    total = args.warmup + args.steps
    log = os.path.join(tmp, f"petra-{method}-{threads}.jsonl")
    extra = data_args + ["--max-steps", str(total), "--epochs", "2", "--no-augment"]
    run_threads = threads
    if is_pipelined(method):
        extra += ["--devices", ",".join(f"cpu:{i}" for i in range(threads)), "--threads-per-device", "1",
                  "--stages", args.petra_stages]
        run_threads = 1
    rows = run_petra(args, run_threads, method, extra, log, quiet=not args.verbose)
    steps = [s for r in rows if "epoch" in r for s in r.get("step_seconds", [])]
    first, last = steady_window(args)
    if len(steps) < last:
        die(f"petra-train's log {log} has {len(steps)} step times, expected at least {last}: is build/petra-train "
            "older than its per-step times (issue 15)? Rebuild it.")
    step = median(steps[first:last])
    return {"images_per_second_steady": args.batch_size / step, "median_step_ms": 1000 * step,
            "images_per_second_all": rows[0].get("images_per_second"), "step_seconds": steps}


def run_official(args, threads: int, tmp: str, limit_train: int) -> dict:
    """The official PETRA code on the same network and data, in a torch child set up as the PyTorch peer."""
    r = run_torch(args, "official", threads, tmp, warmup=args.warmup, steps=args.steps, limit_train=limit_train,
                  official_src=os.path.abspath(args.official_src), channels_last=False)
    if r["official_parameters"] != r["parameters"]:
        print(f"note: the official network has {r['official_parameters']} parameters, petra's {r['parameters']}",
              flush=True)
    return r


def is_pipelined(method: str) -> bool:
    return method not in ("backprop", "revbackprop")


def fmt(x, width=9, digits=1) -> str:
    return f"{x:{width}.{digits}f}" if isinstance(x, (int, float)) else f"{'-':>{width}}"


def environment_lines(args, torch_result: dict | None) -> list[str]:
    """What the measurement ran on, printed with it."""
    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "?")
    except OSError:
        model = "?"
    # the cache sizes tell hosts of one model name apart (the VM has moved between CPUs)
    caches = []
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(os.path.join(index, "level")) as f_level, open(os.path.join(index, "type")) as f_type, \
                    open(os.path.join(index, "size")) as f_size:
                level, kind, size = f_level.read().strip(), f_type.read().strip(), f_size.read().strip()
        except OSError:
            continue
        if kind != "Instruction":
            caches.append(f"L{level} {size}")
    if caches:
        model += " (" + ", ".join(caches) + ")"
    lines.append(f"machine: {model}, {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.2f} at the end; "
                 f"python {sys.version.split()[0]} (parent), torch child {args.python}")
    if torch_result:
        t = torch_result
        lines.append(f"torch {t['torch_version']}: {t['blas']}")
        lines.append("torch env: " + ", ".join(f"{k}={v}" for k, v in t["thread_env"].items())
                     + f", torch.set_num_threads(threads); OPENBLAS_CORETYPE={t['OPENBLAS_CORETYPE'] or '(unset)'}, "
                     f"OPENBLAS_L2_SIZE={t['OPENBLAS_L2_SIZE'] or '(unset)'}; malloc tuning "
                     + ("on (" + " ".join(f"{k}={v}" for k, v in MALLOC_ENV.items()) + ")" if t["malloc_tuning"]
                        else "off") + f"; network formulation '{t['net']}'")
    lines.append(f"petra: {args.petra} --threads T (pipelined methods: T CPU workers x 1 thread), OMP_NUM_THREADS=T, "
                 f"malloc tuning {'on' if args.malloc_tuning == 'both' else 'off'} (petra has its own caching "
                 "allocator); data: " + ("an npy copy of the training images, 64 test images" if args.petra_data == "npy"
                                         else "fashion-mnist"))
    return lines


def speed_mode(args, tmp: str, report: dict) -> None:
    threads_list = args.threads or [1, 2]
    total = args.warmup + args.steps
    first, last = steady_window(args)
    if args.petra_data == "npy":
        petra_dir = os.path.join(tmp, "petra-npy")
        os.makedirs(petra_dir)
        n_train = args.limit_train or min(60000, max(10000, (total + 1) * args.batch_size))
        write_npy_directory(petra_dir, args.data_dir, n_train, 64)
        data_args = ["--dataset", "npy", "--data-dir", petra_dir]
        limit_train = n_train
    else:
        data_args = ["--dataset", "fashion-mnist", "--data-dir", args.data_dir]
        limit_train = args.limit_train
    if (limit_train or 60000) < total * args.batch_size:
        die(f"{total} steps of {args.batch_size} need {total * args.batch_size} training images in one epoch, "
            f"but only {limit_train} are used")
    methods = list(dict.fromkeys(args.methods + (["revbackprop"] if args.revbackprop else [])))
    formats = args.torch_formats
    # The peers of one thread count, run one after the other in one window; the order is reversed at every
    # repeat so that neither side always runs first (interleaved runs). Each run gives the median of its
    # steady steps; the table gives the median of these over the repeats.
    peers = [("torch", f) for f in formats] + [("petra", m) for m in methods]
    if args.official_src:
        peers.append(("official", "petra"))
    samples: dict[tuple[int, str, str], list[dict]] = {}
    torch_result = None
    for repeat in range(args.repeats):
        for threads in threads_list:
            order = peers if repeat % 2 == 0 else peers[::-1]
            for side, variant in order:
                busy = other_runnable()
                if side == "torch":
                    r = run_torch(args, "speed", threads, tmp, warmup=args.warmup, steps=args.steps,
                                  limit_train=limit_train, channels_last=variant == "channels_last")
                    torch_result = torch_result or r
                    report.setdefault("torch_runs", []).append({k: v for k, v in r.items() if k != "step_seconds"})
                elif side == "petra":
                    r = petra_speed(args, threads, variant, data_args, tmp)
                else:
                    r = run_official(args, threads, tmp, limit_train)
                r["other_runnable"] = busy
                samples.setdefault((threads, side, variant), []).append(r)
                print(f"  [{repeat + 1}/{args.repeats}] {threads} thread(s) {side} {variant:<13}: "
                      f"{r['images_per_second_steady']:.1f} img/s (median step {r['median_step_ms']:.1f} ms, "
                      f"steps {first}-{last - 1}); other runnable processes: {busy}", flush=True)

    peak = args.peak_gflops_per_core * 1e9
    gflop_step = 3 * torch_result["forward_gflop"] if torch_result else None  # forward + backward data + weight
    rows = []
    for (threads, side, variant), runs in samples.items():
        ips = median([r["images_per_second_steady"] for r in runs])
        ms = median([r["median_step_ms"] for r in runs])
        row = {"threads": threads, "side": side, "variant": variant, "repeats": len(runs),
               "images_per_second_steady": ips, "median_step_ms": ms,
               "per_repeat": [r["images_per_second_steady"] for r in runs],
               "other_runnable_max": max(r["other_runnable"] for r in runs)}
        if gflop_step:
            row["gflop_per_second"] = gflop_step / (ms / 1000)
            row["fraction_of_peak"] = row["gflop_per_second"] * 1e9 / (peak * threads)
        rows.append(row)
    for row in rows:  # against the faster torch layout at the same thread count
        best = max((r["images_per_second_steady"] for r in rows if r["threads"] == row["threads"] and
                    r["side"] == "torch"), default=None)
        row["ratio_to_torch"] = row["images_per_second_steady"] / best if best else None
    report["speed"] = rows
    report["steady_steps"] = [first, last - 1]

    print()
    print(f"{args.model} width {args.width} ({args.stem} stem), Fashion-MNIST 1x28x28, batch {args.batch_size}; "
          f"each run {total} steps; speed = batch / the median step time of steps {first}-{last - 1}, "
          f"median over {args.repeats} interleaved repeat(s)")
    for line in environment_lines(args, torch_result):
        print(line)
    if gflop_step:
        print(f"work per step: {gflop_step:.2f} GFLOP (3 x the forward's {gflop_step / 3:.2f} GFLOP in convolutions and "
              f"linear layers); peak {args.peak_gflops_per_core:.0f} GFLOP/s per core (--peak-gflops-per-core)")
    print()
    head = (f"{'threads':>7}  {'peer':<34}  {'img/s':>8}  {'ms/step':>8}  {'/ torch':>7}  {'GFLOP/s':>8}  "
            f"{'% peak':>6}")
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["threads"], r["side"] != "torch", r["side"], r["variant"])):
        peer = {"torch": "PyTorch backprop", "petra": "petra", "official": "official PETRA"}[r["side"]]
        peer += f" ({r['variant']})" if r["side"] != "official" else " (k=1, one process)"
        print(f"{r['threads']:>7}  {peer:<34}  {fmt(r['images_per_second_steady'], 8)}  {fmt(r['median_step_ms'], 8)}  "
              f"{fmt(r['ratio_to_torch'], 7, 2)}  {fmt(r.get('gflop_per_second'), 8)}  "
              f"{fmt(100 * r['fraction_of_peak'] if 'fraction_of_peak' in r else None, 6)}")
    print("(/ torch: against the faster PyTorch layout at the same thread count; petra's pipelined methods run T "
          "workers x 1 thread; GFLOP/s and % peak count backprop's work per mini-batch for every peer, so a method "
          "that recomputes does more than it is credited with)")
    busy = max(r["other_runnable_max"] for r in rows)
    if busy > 0:
        print(f"note: other processes wanted the CPU during the runs (up to {busy} runnable besides this script): "
              "the numbers are noisy, and 2-thread runs suffer most. Rerun on an idle machine (see `uptime`, `top`).")


def accuracy_mode(args, tmp: str, report: dict) -> None:
    threads = (args.threads or [os.cpu_count() or 1])[0]
    t = run_torch(args, "accuracy", threads, tmp, epochs=args.epochs, augment=not args.no_augment)
    report["torch"] = t
    report["torch_final_test_accuracy"] = t["final_test_accuracy"]
    petra_final = None
    if args.also_petra:
        if args.limit_train or args.limit_test:
            petra_dir = os.path.join(tmp, "petra-npy")
            os.makedirs(petra_dir)
            write_npy_directory(petra_dir, args.data_dir, args.limit_train or 60000, args.limit_test or 10000)
            data_args = ["--dataset", "npy", "--data-dir", petra_dir]
            print("note: petra-train reads the limited sets as an npy directory, and normalises them with their own "
                  "mean and std (torch uses 0.2860 / 0.3530)")
        else:
            data_args = ["--dataset", "fashion-mnist", "--data-dir", args.data_dir]
        extra = data_args + ["--epochs", str(args.epochs), "--lr", str(args.lr), "--momentum", "0.9",
                             "--weight-decay", "0.0005", "--warmup-epochs", "1", "--schedule", "cosine",
                             "--optimizer", "sgd"] + (["--no-augment"] if args.no_augment else [])
        rows = run_petra(args, threads, "backprop", extra, os.path.join(tmp, "petra-accuracy.jsonl"), quiet=False)
        epochs = [r for r in rows if "epoch" in r]
        report["petra"] = rows
        petra_final = epochs[-1]["test_accuracy"] if epochs else None
        report["petra_final_test_accuracy"] = petra_final
    print()
    print(f"{args.model} width {args.width}, Fashion-MNIST ({args.limit_train or 60000} train / "
          f"{args.limit_test or 10000} test), batch {args.batch_size}, {args.epochs} epoch(s), {threads} thread(s)")
    print(f"final test accuracy: torch {100 * t['final_test_accuracy']:.2f}%"
          + (f", petra {100 * petra_final:.2f}%" if petra_final is not None else ""))


def evaluate_mode(args, tmp: str, report: dict) -> None:
    t = run_torch(args, "evaluate", 1, tmp, params=os.path.abspath(args.params))
    report.update({k: t[k] for k in ("running_statistics", "batch_statistics")})
    print(f"{args.params}: {args.model} width {args.width}, Fashion-MNIST test set ({args.limit_test or 10000} images)")
    for name in ("running_statistics", "batch_statistics"):
        r = t[name]
        print(f"  BN {name.replace('_', ' ')}: test accuracy {100 * r['test_accuracy']:.2f}%, "
              f"loss {r['test_loss']:.4f}")


def parse_threads(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of thread counts, got '{text}'")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got '{text}'")
    return values


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2])
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="petra-train side by side with PyTorch (see the file's docstring).",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--mode", choices=["speed", "accuracy", "evaluate"], default="speed")
    ap.add_argument("--model", choices=ARCHITECTURES, default="revnet18")
    ap.add_argument("--width", type=int, default=16, help="channels of one stream in the first group")
    ap.add_argument("--stem", choices=["cifar", "imagenet"], default="cifar")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=parse_threads, default=None,
                    help="comma-separated thread counts (speed: default 1,2; accuracy: the first, default all cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with PyTorch")
    ap.add_argument("--petra", default=os.path.join(root, "build", "petra-train"), help="petra-train binary")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--limit-train", type=int, default=0, help="use only the first N training images (0 = all)")
    ap.add_argument("--limit-test", type=int, default=0, help="accuracy: only the first N test images (0 = all)")
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON object at the end")
    ap.add_argument("--malloc-tuning", choices=["torch", "both", "none"], default="torch",
                    help="which child processes get the glibc malloc environment variables")
    ap.add_argument("--keep-openblas-coretype", action="store_true",
                    help="keep OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE in the torch child's environment (by default "
                         "they are removed, so OpenBLAS autodetects its AVX-512 kernel: 2x faster here)")
    ap.add_argument("--unset-openblas-coretype", action="store_true", help=argparse.SUPPRESS)  # now the default
    ap.add_argument("--channels-last", action="store_true",
                    help="torch: channels_last memory format (accuracy and evaluate; speed: --torch-formats)")
    ap.add_argument("--torch-net", choices=["pair", "sliced"], default="pair",
                    help="the PyTorch formulation: streams as a pair with in-place ReLU (pair), or sliced and "
                         "concatenated in every block (sliced: this script before issue 15)")
    ap.add_argument("--skip-checks", action="store_true",
                    help="skip the checks that the torch network is petra's (parameter count, names and shapes, "
                         "two training steps from petra's initial parameters)")
    sp = ap.add_argument_group("speed mode")
    sp.add_argument("--steps", type=int, default=120, help="steady steps: the median of their times is the speed")
    sp.add_argument("--warmup", type=int, default=40,
                    help="steps before the steady ones (the default window, steps 40-159, is issue 15's)")
    sp.add_argument("--repeats", type=int, default=1,
                    help="run every peer this many times, interleaved (order reversed at each repeat); report medians")
    sp.add_argument("--methods", type=lambda t: [m for m in t.split(",") if m], default=["backprop"],
                    help="petra-train methods to time, comma-separated (backprop, revbackprop, petra, ...; the "
                         "pipelined ones run T workers x 1 thread)")
    sp.add_argument("--petra-stages", default="auto",
                    help="petra-train's --stages for the pipelined methods (auto: its default; blocks: one block "
                         "per stage, the official code's layout)")
    sp.add_argument("--revbackprop", action="store_true", help="also time petra's --method revbackprop")
    sp.add_argument("--petra-steady", action="store_true", help=argparse.SUPPRESS)  # steady is now always measured
    sp.add_argument("--torch-formats", type=lambda t: [f for f in t.split(",") if f], default=["nchw", "channels_last"],
                    help="PyTorch memory formats to time (nchw, channels_last); petra is compared with the faster")
    sp.add_argument("--official-src", metavar="DIR",
                    help="also time the official PETRA code (a checkout of stephane-rivaud/PETRA) on the same network")
    sp.add_argument("--peak-gflops-per-core", type=float, default=220.0,
                    help="fp32 peak of one core, for the fraction of peak (220: Zen 5, 2 x 512-bit FMA at 3.44 GHz)")
    sp.add_argument("--petra-data", choices=["npy", "fashion-mnist"], default="npy",
                    help="petra-train's data in speed mode (npy: the same images, a 64-image test set)")
    sp.add_argument("--verbose", action="store_true", help="show petra-train's output")
    ac = ap.add_argument_group("accuracy mode")
    ac.add_argument("--epochs", type=int, default=10)
    ac.add_argument("--no-augment", action="store_true", help="no random crop or flip")
    ac.add_argument("--also-petra", action="store_true", help="also train with petra-train, same settings")
    ev = ap.add_argument_group("evaluate mode")
    ev.add_argument("--params", help="a directory of petra's .npy parameters (--save-params, or a checkpoint's model/)")
    args = ap.parse_args()

    if min(args.width, args.batch_size, args.steps, args.epochs, args.repeats) < 1 or args.warmup < 0:
        die("--width, --batch-size, --steps, --epochs and --repeats must be >= 1, --warmup >= 0")
    if args.channels_last and args.mode == "speed":
        args.torch_formats = ["channels_last"]
    if any(f not in ("nchw", "channels_last") for f in args.torch_formats):
        die(f"--torch-formats takes nchw and channels_last, got {','.join(args.torch_formats)}")
    if args.official_src and not os.path.isdir(os.path.join(args.official_src, "async_torch")):
        die(f"--official-src {args.official_src}: not a checkout of stephane-rivaud/PETRA (no async_torch/ in it)")
    if args.mode == "evaluate" and not (args.params and os.path.isdir(args.params)):
        die("--mode evaluate needs --params DIR, a directory of petra's .npy parameters")
    torch_version = check_torch(args.python)
    fashion_files(args.data_dir)
    needs_petra = args.mode == "speed" or args.also_petra
    if needs_petra and not os.access(args.petra, os.X_OK):
        die(f"{args.petra} not found: build petra first (scripts/setup.sh) or pass --petra")
    report = {"mode": args.mode, "model": args.model, "width": args.width, "stem": args.stem,
              "batch_size": args.batch_size, "torch_version": torch_version, "python": args.python}
    tmp = tempfile.mkdtemp(prefix="compare_pytorch.")
    try:
        # the same network on both sides: parameter counts, then names, shapes and two training steps
        t = run_torch(args, "params", 1, tmp)
        report["torch_parameters"] = t["parameters"]
        if not args.skip_checks and os.access(args.petra, os.X_OK):
            p = petra_parameters(args)
            report["petra_parameters"] = p
            same = p == t["parameters"]
            print(f"parameters: torch {t['parameters']}, petra {p}" + ("" if same else "  <-- MISMATCH"), flush=True)
            if p is not None and not same:
                die("the PyTorch network does not have petra's parameter count; the comparison would be unfair")
            check_equivalence(args, tmp, report)
        else:
            print(f"parameters: torch {t['parameters']} (not checked against petra)", flush=True)
        if args.mode == "speed":
            speed_mode(args, tmp, report)
        elif args.mode == "evaluate":
            evaluate_mode(args, tmp, report)
        else:
            accuracy_mode(args, tmp, report)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
