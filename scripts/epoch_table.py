#!/usr/bin/env python3
"""scripts/epoch_table.py: a markdown table of test accuracy per epoch from petra-train JSON logs.

One row per log (`petra-train --log-json F`), one column per epoch, then the final test accuracy,
the last epoch's training loss and its difference from the first log's final accuracy (list the
baseline first):

    scripts/epoch_table.py docs/runs/fmnist-backprop.jsonl docs/runs/fmnist-petra-k2.jsonl
"""
import json
import sys


def read_log(path):
    epochs, summary = [], {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if "summary" in record:
                summary = record["summary"]
            elif "epoch" in record:
                epochs.append(record)
    if not epochs:
        sys.exit(f"epoch_table: {path} holds no epoch records")
    return epochs, summary


def label(summary, path):
    c = summary.get("configuration", {})
    if not c:
        return path
    parts = [c["method"], f"k = {c['accumulation']}", f"lr {float(c['lr']):g}", f"seed {c['seed']}"]
    momentum = float(c.get("momentum", 0.9))
    if momentum != 0.9 or c.get("nesterov", "true") != "true":  # the configuration of section 2 is Nesterov 0.9
        parts.append(f"momentum {momentum:g}" + (" Nesterov" if c.get("nesterov") == "true" else ""))
    if float(c.get("warmup_epochs", 1)) != 1:
        parts.append(f"warm-up {float(c['warmup_epochs']):g} epochs")
    if c.get("stage_sizes"):  # empty: one block per stage (J = 10 for RevNet18)
        sizes = c["stage_sizes"].split(",")
        parts.append(f"J = {len(sizes)} ({c['stage_sizes']})")
    if c.get("delay_compensation") == "true":
        parts.append("delay comp.")
    if c.get("weight_prediction", "none") != "none":
        horizon = float(c.get("prediction_horizon", 1))
        parts.append("weight pred." + (f" h {horizon:g}" if horizon != 1 else ""))
    if int(c.get("delay_lr_warmup", 0)) > 0:
        parts.append(f"PipeMare lr warm-up {c['delay_lr_warmup']}")
    return ", ".join(parts)


def main(paths):
    logs = [(path, *read_log(path)) for path in paths]
    width = max(len(epochs) for _, epochs, _ in logs)
    header = ["run"] + [str(e + 1) for e in range(width)] + ["final", "train loss", "vs first"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    baseline = None
    for path, epochs, summary in logs:
        accuracies = [f"{100 * e['test_accuracy']:.2f}" for e in epochs]
        accuracies += ["–"] * (width - len(epochs))
        final = 100 * epochs[-1]["test_accuracy"]
        baseline = final if baseline is None else baseline
        row = [label(summary, path)] + accuracies
        row += [f"**{final:.2f}**", f"{epochs[-1]['train_loss']:.3f}", f"{final - baseline:+.2f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
