#!/usr/bin/env python3
"""benchmarks/pytorch_gpu.py: the PyTorch peer of scripts/gpu-check.sh's GPU training runs.

The same network as petra-train --model revnet18 (compare_pytorch.torch_network: the two streams
as a pair of tensors, ReLU in place, conv biases), the same recipe as gpu-check.sh's runs (width
64, 3x32x32 synthetic images, batch 128, SGD with Nesterov momentum 0.9 and weight decay 5e-4,
cross-entropy), trained with plain autograd (which stores the activations: petra's backprop) in
PyTorch eager mode on cuDNN, set up as a good PyTorch user would: torch.backends.cudnn.benchmark
on (cuDNN picks each layer's fastest algorithm), the data already on the GPU (so the peer never
waits for the host), the optimizer's foreach path.

Two precisions, one after the other in one process: fp32 (cudnn.allow_tf32 and
matmul.allow_tf32 off: the precision of petra's default kernels) and tf32 (PyTorch's default for
convolutions: allow_tf32 on). Each: --warmup steps, then --steps timed steps between two
torch.cuda.synchronize() calls (no per-step host synchronisation); images/s = steps * batch /
seconds, and the peak memory PyTorch's allocator held. Prints one line per precision and writes
the JSON to --json.

    python3 benchmarks/pytorch_gpu.py --json OUT/pytorch-gpu.json
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_pytorch import torch_network  # noqa: E402  (the network twin; imports nothing heavy)


def run(torch, precision: str, args) -> dict:
    torch.backends.cudnn.benchmark = True
    tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.manual_seed(0)
    device = torch.device("cuda:0")
    make_model = torch_network(torch, pair=True)
    net = make_model("revnet18", args.width, 3, 10, "cifar").to(device)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4,
                          foreach=True)
    # A pool of distinct batches on the GPU, cycled: the loader costs nothing on this side.
    pool = 8
    x = torch.randn(pool, args.batch_size, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (pool, args.batch_size), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x[i % pool]), y[i % pool])
        loss.backward()
        opt.step()
        return loss

    net.train()
    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i).detach()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"precision": precision, "steps": args.steps, "warmup": args.warmup, "seconds": seconds,
            "images_per_second": args.steps * args.batch_size / seconds, "final_loss": loss.item(),
            "peak_bytes": torch.cuda.max_memory_allocated()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=250, help="timed steps")
    ap.add_argument("--warmup", type=int, default=50, help="untimed steps first (cuDNN's autotuning)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--precisions", default="fp32,tf32")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("pytorch_gpu: PyTorch sees no GPU")
    report = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
              "gpu": torch.cuda.get_device_name(0), "width": args.width, "batch_size": args.batch_size,
              "runs": []}
    print(f"PyTorch {report['torch']}, cuDNN {report['cudnn']}, {report['gpu']}; RevNet18 width {args.width}, "
          f"3x32x32, batch {args.batch_size}, eager, cudnn.benchmark on; {args.warmup} + {args.steps} steps")
    for precision in args.precisions.split(","):
        r = run(torch, precision, args)
        report["runs"].append(r)
        print(f"pytorch {precision}: {r['images_per_second']:.0f} images/s ({r['steps']} steps in "
              f"{r['seconds']:.2f} s), peak {r['peak_bytes'] / 2**20:.0f} MiB, last loss {r['final_loss']:.4f}",
              flush=True)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
