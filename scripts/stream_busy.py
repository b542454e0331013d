#!/usr/bin/env python3
"""scripts/stream_busy.py: how busy each CUDA stream of a run was, from a GPU trace.

    python3 scripts/stream_busy.py TRACE.csv LABEL [--window 0.3,0.9]

TRACE.csv is either petra's CUPTI trace (libpetra-kernel-trace.so, benchmarks/kernel_trace.cpp:
start_ns,end_ns,stream,kind,name) or Nsight Systems' cuda_gpu_trace report (Start (ns),
Duration (ns), ..., Strm, ..., Name). Every kernel, copy and memset is an interval on its stream.
Over the steady part of the run (by default from 30% to 90% of the trace: past the warm-up, before
the drain and the test-set evaluation) each stream's intervals are merged, and the script prints
each stream's busy share of that window, the share where the two busiest streams run at once,
and where no stream runs (the GPU idle). scripts/gpu-check.sh's `streams` group runs it;
tests/cli/stream_busy.sh checks it on traces whose answers are known.
"""
import argparse
import csv
import sys


def read_events(path):
    """(start, end, stream) of every row, in ns, from either trace format."""
    rows = list(csv.reader(open(path, errors="replace")))
    head = rows[0] if rows else []

    def col(word):
        return next((i for i, h in enumerate(head) if h.startswith(word)), None)

    cupti = col("start_ns") is not None
    start, stop, stream = ((col("start_ns"), col("end_ns"), col("stream")) if cupti else
                           (col("Start"), col("Duration"), col("Strm")))
    if None in (start, stop, stream):
        raise ValueError(f"unexpected columns {head}")
    events = []
    for r in rows[1:]:
        try:
            a = int(r[start])
            events.append((a, int(r[stop]) if cupti else a + int(r[stop]), r[stream]))
        except (ValueError, IndexError):
            continue  # a summary or malformed line
    return events


def clipped_union(intervals, window):
    """The union of `intervals` inside `window`, as sorted disjoint [a, b] pairs."""
    out = []
    for a, b in sorted(intervals):
        a, b = max(a, window[0]), min(b, window[1])
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(intervals):
    return sum(b - a for a, b in intervals)


def intersection(x, y):
    """The intersection of two sorted disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append([a, b])
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def report(events, label, fractions=(0.3, 0.9)):
    """The lines the script prints, for `events` = [(start, end, stream)]."""
    begin, end = min(e[0] for e in events), max(e[1] for e in events)
    window = (begin + fractions[0] * (end - begin), begin + fractions[1] * (end - begin))
    span = window[1] - window[0]
    streams = {}
    for a, b, s in events:
        streams.setdefault(s, []).append((a, b))
    busy = {s: clipped_union(v, window) for s, v in streams.items()}
    lines = [f"== streams {label}: {len(events)} kernels and copies; steady window {span / 1e6:.1f} ms "
             f"({100 * fractions[0]:.0f}% to {100 * fractions[1]:.0f}% of the trace)"]
    for s, v in sorted(busy.items(), key=lambda kv: -length(kv[1])):
        count = sum(1 for a, b, t in events if t == s and b > window[0] and a < window[1])
        lines.append(f"== streams {label}: stream {s}: busy {100 * length(v) / span:5.1f}% of the window "
                     f"({count} kernels and copies)")
    top = sorted(busy, key=lambda s: -length(busy[s]))[:2]
    if len(top) == 2:
        both = length(intersection(busy[top[0]], busy[top[1]]))
        either = length(clipped_union([tuple(i) for s in busy for i in busy[s]], window))
        lines.append(f"== streams {label}: streams {top[0]} and {top[1]} both busy {100 * both / span:5.1f}% of the "
                     f"window; some stream busy {100 * either / span:5.1f}%, none {100 - 100 * either / span:5.1f}%")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("label")
    ap.add_argument("--window", default="0.3,0.9", help="the steady part, as fractions of the trace")
    args = ap.parse_args()
    fractions = tuple(float(f) for f in args.window.split(","))
    try:
        events = read_events(args.trace)
    except (OSError, ValueError) as e:
        sys.exit(f"== trace {args.label}: {e}")
    if not events:
        sys.exit(f"== trace {args.label}: no kernels in it")
    print("\n".join(report(events, args.label, fractions)))


if __name__ == "__main__":
    main()
