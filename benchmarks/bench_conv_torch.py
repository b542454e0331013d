#!/usr/bin/env python3
"""benchmarks/bench_conv_torch.py: petra's CPU convolutions beside PyTorch's, shape by shape.

For every distinct convolution of the benchmark network (RevNet18 width 16, 28x28 Fashion-MNIST,
batch 64; the list and the calls per backprop step come from build/bench-conv-shapes, which reads
them from nn/models.cpp's structure), it times forward, backward-data and backward-weight:
  - petra: build/bench-conv-shapes --json (each case checked against ref:: first);
  - PyTorch (Debian's python3-torch): torch.nn.functional.conv2d for the forward pass and
    torch.ops.aten.convolution_backward with output_mask [dx only] / [dw only] for the two backward
    passes, in NCHW and in channels_last, no bias (petra's convolutions have none here).

The two sides alternate in one window: each round runs petra then torch for every thread count
(subprocesses, so each gets its own environment); each process reports the median (or with
--stat fastest the fastest) of --repeats runs after two warm-ups, and the table gives the median
over --rounds rounds. On a loaded machine the ratios (torch time / petra time: above 1, petra is
faster) are the result, not the absolute times; --stat fastest is the least disturbed run.

PyTorch is set up as issue 15 prescribes (as benchmarks/compare_pytorch.py does): OMP_NUM_THREADS =
MKL_NUM_THREADS = OPENBLAS_NUM_THREADS = T and torch.set_num_threads(T); OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE removed (OpenBLAS autodetects its AVX-512 kernel); glibc malloc tuned with
MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=268435456.
petra gets OMP_NUM_THREADS = T and --threads T.

  python3 benchmarks/bench_conv_torch.py --threads 1,2 --rounds 5
  python3 benchmarks/bench_conv_torch.py --threads 1 --filter 16->16 --json out.json
  python3 benchmarks/bench_conv_torch.py --baseline-lib /tmp/main-lib   # + petra with main's kernels
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "MALLOC_TOP_PAD_": "268435456",
}
PASSES = ("fwd", "bwd-data", "bwd-weight")


def parse_layer(name: str):
    """'3x3 16->32 @28 s2' (or 'stem 3x3 1->32 @28') -> kernel, cin, cout, pixels, stride."""
    words = name.split()
    if words[0] == "stem":
        words = words[1:]
    kernel = int(words[0].split("x")[0])
    cin, cout = (int(v) for v in words[1].split("->"))
    pixels = int(words[2].lstrip("@"))
    stride = int(words[3].lstrip("s")) if len(words) > 3 else 1
    return kernel, cin, cout, pixels, stride


def torch_worker(args) -> None:
    """Times torch on the layers given as JSON on stdin; prints one JSON object per case."""
    import torch

    torch.set_num_threads(args.threads)
    layers = json.load(sys.stdin)
    gen = torch.Generator().manual_seed(0)
    for layer in layers:
        kernel, cin, cout, pixels, stride = parse_layer(layer["layer"])
        pad = kernel // 2
        x = torch.rand(layer["batch"], cin, pixels, pixels, generator=gen) * 2 - 1
        w = torch.rand(cout, cin, kernel, kernel, generator=gen) * 2 - 1
        out = (pixels + 2 * pad - kernel) // stride + 1
        dy = torch.rand(layer["batch"], cout, out, out, generator=gen) * 2 - 1
        for fmt in args.formats.split(","):
            mf = torch.channels_last if fmt == "channels_last" else torch.contiguous_format
            xf, wf, dyf = (t.contiguous(memory_format=mf) for t in (x, w, dy))

            def forward():
                return torch.nn.functional.conv2d(xf, wf, None, stride, pad)

            def backward(mask):
                return torch.ops.aten.convolution_backward(dyf, xf, wf, None, [stride, stride], [pad, pad],
                                                           [1, 1], False, [0, 0], 1, mask)

            runs = {"fwd": forward, "bwd-data": lambda: backward([True, False, False]),
                    "bwd-weight": lambda: backward([False, True, False])}
            for p in layer["passes"]:
                run = runs[p]
                with torch.no_grad():
                    run()
                    run()
                    times = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        run()
                        times.append(time.perf_counter() - t0)
                print(json.dumps({"layer": layer["layer"], "pass": p, "format": fmt, "threads": args.threads,
                                  "seconds": statistics.median(times), "fastest_seconds": min(times)}),
                      flush=True)


def torch_env(threads: int) -> dict:
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[key] = str(threads)
    env.update(MALLOC_ENV)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    return env


def run_petra(args, threads: int, library_dir: str = "") -> list:
    cmd = [args.petra, "--threads", str(threads), "--repeats", str(args.repeats), "--json"]
    if args.filter:
        cmd += ["--filter", args.filter]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if library_dir:  # an older libpetra-core.so (the binary's RUNPATH yields to LD_LIBRARY_PATH)
        env["LD_LIBRARY_PATH"] = library_dir
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def run_torch(args, threads: int, petra_cases: list) -> list:
    layers = {}
    for c in petra_cases:
        layers.setdefault(c["layer"], {"layer": c["layer"], "batch": c["batch"], "passes": []})["passes"].append(c["pass"])
    cmd = [args.python, os.path.abspath(__file__), "--worker", "--threads", str(threads), "--repeats",
           str(args.repeats), "--formats", args.formats]
    out = subprocess.run(cmd, env=torch_env(threads), input=json.dumps(list(layers.values())), check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--petra", default="build/bench-conv-shapes", help="the bench-conv-shapes binary")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (petra, torch) per thread count")
    ap.add_argument("--repeats", type=int, default=21, help="timed runs per case and round (median)")
    ap.add_argument("--formats", default="nchw,channels_last", help="torch layouts: nchw, channels_last")
    ap.add_argument("--stat", choices=("median", "fastest"), default="median",
                    help="per process and case: the median of the runs (default) or the fastest run (the "
                         "least disturbed one on a shared machine)")
    ap.add_argument("--baseline-lib", default="",
                    help="directory of another libpetra-core.so (e.g. main's kernels): also timed in every round, "
                         "as the column 'baseline'")
    ap.add_argument("--filter", default="", help="only the layers whose name contains this")
    ap.add_argument("--peak-gflops", type=float, default=220.0, help="FP32 peak of one core (GFLOP/s)")
    ap.add_argument("--python", default="/usr/bin/python3", help="interpreter with PyTorch (Debian's python3-torch)")
    ap.add_argument("--json", default="", help="also write every measurement to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.threads = int(args.threads)
        torch_worker(args)
        return

    key = "fastest_seconds" if args.stat == "fastest" else "seconds"
    other_key = "seconds" if args.stat == "fastest" else "fastest_seconds"
    other = {}  # the same for the other statistic, for the summary line
    thread_counts = [int(t) for t in args.threads.split(",")]
    # the columns compared with petra: its baseline library (if given), then torch's layouts
    formats = (["baseline"] if args.baseline_lib else []) + args.formats.split(",")
    samples = {}  # (threads, layer, pass, side) -> list of per-round medians
    meta = {}     # (layer, pass) -> (calls, flops)
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_start = os.getloadavg()
    for r in range(args.rounds):
        for t in thread_counts:
            petra = run_petra(args, t)
            for c in petra:
                samples.setdefault((t, c["layer"], c["pass"], "petra"), []).append(c[key])
                other.setdefault((t, c["layer"], c["pass"], "petra"), []).append(c[other_key])
                meta[(c["layer"], c["pass"])] = (c["calls"], c["flops"])
            if args.baseline_lib:
                for c in run_petra(args, t, args.baseline_lib):
                    samples.setdefault((t, c["layer"], c["pass"], "baseline"), []).append(c[key])
                    other.setdefault((t, c["layer"], c["pass"], "baseline"), []).append(c[other_key])
            for c in run_torch(args, t, petra):
                samples.setdefault((t, c["layer"], c["pass"], c["format"]), []).append(c[key])
                other.setdefault((t, c["layer"], c["pass"], c["format"]), []).append(c[other_key])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    end = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())

    print(f"bench_conv_torch.py: {start} .. {end}; load average at start {load_start[0]:.2f}, "
          f"at end {os.getloadavg()[0]:.2f}; median over {args.rounds} interleaved rounds of the {args.stat} of "
          f"{args.repeats} runs; peak {args.peak_gflops:.0f} GFLOP/s per thread")
    version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    print(f"torch {version} ({args.python}), threads env as issue 15 (OMP/MKL/OPENBLAS_NUM_THREADS = T, "
          f"OPENBLAS_CORETYPE unset, malloc tuned); petra {args.petra}"
          + (f"; baseline: the same with LD_LIBRARY_PATH={args.baseline_lib}" if args.baseline_lib else ""))
    results = []
    for t in thread_counts:
        peak = args.peak_gflops * t
        print(f"\n{t} thread(s): GFLOP/s (% of {peak:.0f}); ratio = torch time / petra time (> 1: petra faster)")
        head = f"{'layer':22} {'pass':10} {'calls':>5} {'petra':>13}"
        for f in formats:
            head += f" {f:>17} {'ratio':>6}"
        print(head)
        totals = {side: 0.0 for side in ["petra"] + formats}
        for (layer, p), (calls, flops) in meta.items():
            med = {side: statistics.median(samples[(t, layer, p, side)]) for side in ["petra"] + formats}
            for side in totals:
                totals[side] += calls * med[side]
            line = f"{layer:22} {p:10} {calls:5d}"
            for side in ["petra"] + formats:
                g = flops / med[side] / 1e9
                line += f" {g:7.1f} ({100 * g / peak:3.0f}%)" if side == "petra" else f" {g:9.1f} ({100 * g / peak:3.0f}%)"
                if side != "petra":
                    line += f" {med[side] / med['petra']:6.2f}"
            print(line)
            results.append({"threads": t, "layer": layer, "pass": p, "calls": calls, "flops": flops,
                            **{f"{side}_seconds": med[side] for side in med},
                            **{f"{side}_rounds": samples[(t, layer, p, side)] for side in med}})
        line = f"{'conv time of one step (ms)':33} {totals['petra'] * 1e3:13.1f}"
        for f in formats:
            line += f" {totals[f] * 1e3:17.1f} {totals[f] / totals['petra']:6.2f}"
        print(line)
        others = {side: sum(meta[lp][0] * statistics.median(other[(t, *lp, side)]) for lp in meta)
                  for side in ["petra"] + formats}
        other_name = "fastest run" if args.stat == "median" else "median"
        line = f"{'  the same, ' + other_name:33} {others['petra'] * 1e3:13.1f}"
        for f in formats:
            line += f" {others[f] * 1e3:17.1f} {others[f] / others['petra']:6.2f}"
        print(line)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"start": start, "end": end, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
