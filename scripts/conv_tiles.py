#!/usr/bin/env python3
"""scripts/conv_tiles.py: bench-cuda's convolution table, summed per pass and precision.

    python3 scripts/conv_tiles.py OUT/bench-cuda.json

For each precision (fp32, tf32) and pass (forward, data, weight) over the layers bench-cuda
timed: the sum of petra's times with the tiles conv2d_tiling::choose_tile picked, the sum of the
fastest of the forced tiles per layer (bench-cuda forces each; a sum far below the first says the
rule leaves time on the table), cuDNN's sum in the same call, and how many layers reach 70% of
cuDNN's throughput (issue 12's target), all layers and the 3x3 layers after the stem; and, where
bench-cuda timed it, the weight pass with the Winograd path on the layers where it is faster.
scripts/gpu-check.sh's `bench` group prints it; tests/cli/conv_tiles.sh checks it.
"""
import json
import sys


def fastest_tile_ms(row):
    """The fastest of the four tiles choose_tile picks from, forced, in ms. bench-cuda wrote seconds under the
    petra_ms_by_tile key until 2026-12-04 (runs 3-11): a value 100 times below petra_ms, which is
    one of the four, can only be that."""
    tiles = (row.get("petra_ms_by_tile") or [row["petra_ms"]])[:4]  # (not the TF32 options, which
    if max(tiles) < row["petra_ms"] / 100:                           # choose_tile never picks)
        tiles = [t * 1e3 for t in tiles]
    return min(tiles)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        rows = json.load(open(sys.argv[1]))["conv2d"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        sys.exit(f"conv_tiles: cannot read the conv2d table of {sys.argv[1]}: {error}")
    print("conv2d, ms summed over the layers: petra (its tiles) / the fastest tile per layer / cuDNN;"
          " layers at >= 70% of cuDNN")
    for math in ("fp32", "tf32"):
        for pass_ in ("forward", "data", "weight"):
            layers = [r for r in rows if r["math"] == math and r["pass"] == pass_]
            if not layers:
                continue
            chosen = sum(r["petra_ms"] for r in layers)
            best = sum(fastest_tile_ms(r) for r in layers)
            cudnn = sum(r["cudnn_ms"] for r in layers)
            met = sum(r["petra_share_of_cudnn"] >= 0.7 for r in layers)
            middle = [r for r in layers if "3x3" in r["layer"] and not r["layer"].startswith("stem")]
            middle_met = sum(r["petra_share_of_cudnn"] >= 0.7 for r in middle)
            print(f"{math} {pass_:8} {chosen:7.3f} / {best:7.3f} / {cudnn:7.3f}   "
                  f"{met} of {len(layers)} layers, {middle_met} of {len(middle)} 3x3 after the stem")
            # bench-cuda also timed the weight pass of the 3x3 stride-1 layers in Winograd's domain
            # (petra_winograd_ms, from 2026-12-05): the sum with the faster of the two per layer.
            if any("petra_winograd_ms" in r for r in layers):
                either = sum(min(r["petra_ms"], r.get("petra_winograd_ms", r["petra_ms"])) for r in layers)
                won = [r["layer"] for r in layers if r.get("petra_winograd_ms", float("inf")) < r["petra_ms"]]
                either_met = sum(max(r["petra_share_of_cudnn"], r.get("petra_winograd_share_of_cudnn", 0)) >= 0.7
                                 for r in layers)
                print(f"{math} {pass_:8} {either:7.3f} with Winograd where faster ({len(won)} layers: "
                      f"{', '.join(won) or 'none'}); {either_met} of {len(layers)} layers at >= 70%")
            # and the weight pass as the direct product everywhere (petra_direct_ms, from run 13:
            # petra_ms is then the default, automatic, which takes Winograd's where run 12 timed it
            # faster): what the rule gains. From run 13 the forced tiles of such a pass are the direct
            # product's too, so the fastest tile per layer is compared with this sum.
            if any("petra_direct_ms" in r for r in layers):
                direct = sum(r.get("petra_direct_ms", r["petra_ms"]) for r in layers)
                print(f"{math} {pass_:8} {direct:7.3f} with the direct product everywhere "
                      f"(the fastest tile per layer: {best:7.3f})")
            # and the TF32 passes reading x or dy itself where petra reads channels-last copies
            # (petra_nchw_ms: the forward and backward data from 2026-12-05's third session, the
            # weight gradient from the fourth): the sum so.
            if any("petra_nchw_ms" in r for r in layers):
                nchw = sum(r.get("petra_nchw_ms", r["petra_ms"]) for r in layers)
                count = sum("petra_nchw_ms" in r for r in layers)
                print(f"{math} {pass_:8} {nchw:7.3f} without the channels-last copies ({count} layers)")
            # and the forward and backward data with K cut into slices where the 128 x 128 tiles
            # are too few (petra_split_k_ms, from 2026-12-06's ninth session: the 4 x 4 layers):
            # the sum with the faster of the two per layer.
            if any("petra_split_k_ms" in r for r in layers):
                split = sum(min(r["petra_ms"], r.get("petra_split_k_ms", r["petra_ms"])) for r in layers)
                won = [r["layer"] for r in layers if r.get("petra_split_k_ms", float("inf")) < r["petra_ms"]]
                count = sum("petra_split_k_ms" in r for r in layers)
                print(f"{math} {pass_:8} {split:7.3f} with split-K where faster ({len(won)} of {count} layers: "
                      f"{', '.join(won) if won else 'none'})")
            # and the TF32 128 x 128 tile's options (from 2026-12-06), each against the 128 x 128
            # tile itself (petra_ms_by_tile[3]): the K step of 32 ([5]) on every layer, two blocks
            # per multiprocessor ([4]) on the layers where it ran a kernel of its own
            # (two_blocks_own_kernel: the channels-last forward and weight gradient); Winograd's
            # GEMM the same in petra_winograd_128x128_ms.
            options = [r for r in layers if len(r.get("petra_ms_by_tile", [])) == 6]
            if options:
                one, k32 = (sum(r["petra_ms_by_tile"][i] for r in options) for i in (3, 5))
                print(f"{math} {pass_:8} 128x128 / K step 32: {one:7.3f} / {k32:7.3f} ({len(options)} layers)")
                own = [r for r in options if r.get("two_blocks_own_kernel")]
                if own:
                    one, two = (sum(r["petra_ms_by_tile"][i] for r in own) for i in (3, 4))
                    print(f"{math} {pass_:8} 128x128 / two blocks per multiprocessor: {one:7.3f} / {two:7.3f} "
                          f"({len(own)} layers with a kernel of their own)")
            wide = [r["petra_winograd_128x128_ms"] for r in layers if len(r.get("petra_winograd_128x128_ms", [])) == 3]
            if wide:
                one, two, k32 = (sum(w[i] for w in wide) for i in (0, 1, 2))
                print(f"{math} {pass_:8} Winograd at 128x128 / two blocks per multiprocessor / K step 32: "
                      f"{one:7.3f} / {two:7.3f} / {k32:7.3f} ({len(wide)} layers)")

if __name__ == "__main__":
    main()
