#!/usr/bin/env python3
"""scripts/conv_ptx_stats.py: what the convolution kernels' K loops execute, read from their PTX.

    python3 scripts/conv_ptx_stats.py [--build build] [--arch 90] [--against REV] [--sass]

The machine that builds petra has nvcc and ptxas but no cuobjdump/nvdisasm and no GPU, so a change
to kernels/cuda/conv2d.cu cannot be timed or disassembled here. This prints, per kernel
(implicit_gemm / implicit_gemm_tf32 x problem x tile; "tf32v": the TF32 kernels with 16-byte A
copies), what its PTX says about the main K loop: the loop's instructions (one step; an inner k8
loop, where a TF32 kernel keeps one, counted once), integer divisions and remainders (each a
~20-instruction subroutine in SASS), 64-bit comparisons, TF32 conversions (cvt.rna.tf32.f32:
three SASS instructions on sm_80 and sm_90), shared loads and stores, and tensor-core products;
and ptxas's registers and spills. PTX is not what the GPU runs (ptxas schedules, combines and
expands it), so compare two versions of the source with each other (--against REV: the same
kernels at a git revision, printed as old>new), never with a profile. --sass adds the SASS
instructions of one K step per kernel, from the machine code itself without a disassembler: each
kernel's .text size (16 bytes an instruction) with the main loop unrolled 4 times less unrolled
twice, halved (static counts; an inner k8 loop counted once). The main K loop is found as the
innermost backward branch whose body holds both the cp.async wait and the barrier.

It compiles with the build's own nvcc command for kernels/cuda/conv2d.cu (from the build's ninja
file), for one architecture (compute_ARCH PTX, sm_ARCH for ptxas); a revision is exported with
git archive and compiled with its own headers. docs/gpu-kernels.md (steps 12 to 14) quotes its
numbers.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nvcc_command(build):
    """The build's nvcc command line for kernels/cuda/conv2d.cu, as a list, and its directory."""
    out = subprocess.run(["ninja", "-C", build, "-t", "commands"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("nvcc ") and "kernels/cuda/conv2d.cu" in line:
            return shlex.split(line)
    sys.exit(f"conv_ptx_stats: no nvcc command for kernels/cuda/conv2d.cu in {build} (a build with CUDA?)")


def compile_source(build, base, tree, arch, mode, out):
    """nvcc with the build's flags on `tree`'s kernels/cuda/conv2d.cu (tree: the checkout, or a
    revision exported by export_tree), one architecture, -ptx or -cubin."""
    include_root = os.path.join(build, "include")
    args = []
    skip = False
    for a in base:
        if skip:
            skip = False
            continue
        if a == "-o" or a == "-c":
            skip = a == "-o"
            continue
        if a.startswith("-gencode") or a.startswith("arch=") or a.endswith(".cu"):
            continue
        if tree != ROOT and a.startswith("-I"):  # the source root and its petra/ links: the tree's
            path = os.path.normpath(os.path.join(build, a[2:]))
            if path == ROOT:
                a = "-I" + tree
            elif path == os.path.normpath(include_root):
                a = "-I" + os.path.join(tree, "build-include")
        args.append(a)
    source = os.path.join(tree, "kernels/cuda/conv2d.cu")
    if mode == "ptx":
        args += [f"-arch=compute_{arch}", "-ptx"]
    else:
        args += [f"-gencode=arch=compute_{arch},code=sm_{arch}", "-cubin", "-Xptxas=-v"]
    args += ["-o", out, os.path.abspath(source)]
    run = subprocess.run(args, cwd=build, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"conv_ptx_stats: nvcc failed on {source}:\n{run.stderr[-4000:]}")
    return run.stderr


def kernel_key(name):
    """(path, problem, tile) of a mangled kernel name: path fp32, tf32, or tf32v (the TF32 kernel
    with 16-byte A copies: its last template argument true, Lb1E); problem forward, data, weight,
    winograd (WinogradWeightProblem, the opt-in weight gradient's GEMM), or the channels-last
    problems fwd-cl, data-cl and weight-cl, each with /k for its split-K kernel
    (set_conv2d_split_k); tile M x N, with k32 for a K step of 32 and /2 for two blocks per
    multiprocessor (the options set_conv2d_tile(5) and (4))."""
    path = "fp32"
    if "implicit_gemm_tf32" in name:  # (the kernel's last template argument ends the name)
        path = "tf32v" if re.search(r"Lb1EEEvT_$", name) else "tf32"
    problem = re.search(r"\d+(Forward|Data|Weight|WinogradWeight|ChannelsLastForward|ChannelsLastData|ChannelsLastWeight)Problem", name).group(1).lower()
    problem = {"winogradweight": "winograd", "channelslastforward": "fwd-cl", "channelslastdata": "data-cl",
               "channelslastweight": "weight-cl"}.get(problem, problem)
    if "KSliced" in name:
        problem += "/k"  # the forward's or backward data's split-K kernel (set_conv2d_split_k)
    m, n, k = re.search(r"TileShapeILi(\d+)ELi(\d+)ELi(\d+)", name).groups()
    tile = f"{m}x{n}"
    if k != "16":
        tile += f"k{k}"  # the TF32 option with a K step of 32 (set_conv2d_tile(5))
    if "TwoBlocksPerSm" in name:
        tile += "/2"  # the TF32 option at two blocks per multiprocessor (set_conv2d_tile(4))
    return (path, problem, tile)


def is_instruction(line):
    return bool(line) and not line.startswith((".", "//", "$", "{", "}", ")"))


def loop_stats(ptx_text):
    stats = {}
    for m in re.finditer(r"\.entry (\S+)\((.*?)\n\}\n", ptx_text, re.S):
        name = m.group(1)
        if "implicit_gemm" not in name:
            continue
        lines = [l.strip() for l in m.group(0).split("\n")]
        labels = {l[:-1]: i for i, l in enumerate(lines) if re.match(r"\$L__\w+:$", l)}
        best = None
        for i, l in enumerate(lines):
            b = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", l)
            if not b or b.group(1) not in labels or labels[b.group(1)] >= i:
                continue
            body = lines[labels[b.group(1)]:i + 1]
            if not (any("cp.async.wait_group" in x for x in body) and any("bar.sync" in x for x in body)):
                continue
            if best is None or len(body) < len(best):
                best = body
        if best is None:
            continue
        ins = [x for x in best if is_instruction(x)]
        count = lambda pattern: sum(1 for x in ins if re.search(pattern, x))
        stats[kernel_key(name)] = {
            "loop": len(ins),
            "div/rem": count(r"^(?:@%p\d+ )?(div|rem)\."),
            "setp.64": count(r"^(?:@%p\d+ )?setp\.\w+\.[su]64"),
            "cvt.rna": count(r"cvt\.rna\.tf32"),
            "ld.shared": count(r"ld\.shared"),
            "st.shared": count(r"st\.shared"),
            "mma": count(r"\bmma\.sync"),
        }
    return stats


def register_stats(ptxas_report):
    regs = {}
    name = None
    for line in ptxas_report.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            name = m.group(1) if "implicit_gemm" in m.group(1) else None
            continue
        if name is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            regs.setdefault(kernel_key(name), {})["spills"] = f"{m.group(1)}/{m.group(2)}"
        m = re.search(r"Used (\d+) registers", line)
        if m:
            regs.setdefault(kernel_key(name), {})["regs"] = int(m.group(1))
    return regs


def export_tree(rev, work):
    """The source tree at git revision `rev` in work/tree, with the petra/ include links the build
    makes (build/include/petra/{data,kernels,nn,pipeline} -> the source folders)."""
    tree = os.path.join(work, "tree")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    links = os.path.join(tree, "build-include", "petra")
    os.makedirs(links)
    for folder in ("data", "kernels", "nn", "pipeline"):
        os.symlink(os.path.join(tree, folder), os.path.join(links, folder))
    return tree


MAIN_LOOP = "  for (int step = 0; step < steps; ++step) {"


def text_sizes(cubin):
    """SASS instructions per convolution kernel in a cubin: its .text section's size / 16 bytes."""
    out = subprocess.run(["readelf", "-S", "-W", cubin], capture_output=True, text=True, check=True).stdout
    sizes = {}
    for line in out.splitlines():
        m = re.search(r"\]\s+(\.text\.\S+)\s+\S+\s+\S+\s+\S+\s+([0-9a-f]+)", line)
        if m and "implicit_gemm" in m.group(1):
            sizes[kernel_key(m.group(1))] = int(m.group(2), 16) // 16
    return sizes


def sass_per_step(build, base, tree, arch, work):
    """SASS instructions of one step of each kernel's main K loop, static: the kernel compiled with
    that loop unrolled 4 and 2 times (a pragma put into a copy of conv2d.cu), the text sizes'
    difference halved. (Unrolled 2 against 1 would count the remainder iteration nvcc adds too.)"""
    source = os.path.join(tree, "kernels/cuda/conv2d.cu")
    text = open(source).read()
    if MAIN_LOOP not in text:
        return {}
    sizes = {}
    try:
        for unroll in (2, 4):
            with open(source, "w") as f:
                f.write(text.replace(MAIN_LOOP, f'  _Pragma("unroll {unroll}")\n' + MAIN_LOOP, 1))
            cubin = os.path.join(work, f"k{unroll}.cubin")
            compile_source(build, base, tree, arch, "cubin", cubin)
            sizes[unroll] = text_sizes(cubin)
    finally:
        with open(source, "w") as f:
            f.write(text)
    return {key: (sizes[4][key] - sizes[2][key]) // 2 for key in sizes[4] if key in sizes[2]}


def measure(build, base, rev, arch, sass):
    with tempfile.TemporaryDirectory() as work:
        # the working tree itself, but a copy of it where conv2d.cu is rewritten (--sass)
        tree = export_tree(rev or working_tree_commit(), work) if (rev or sass) else ROOT
        ptx = os.path.join(work, "k.ptx")
        compile_source(build, base, tree, arch, "ptx", ptx)
        stats = loop_stats(open(ptx).read())
        report = compile_source(build, base, tree, arch, "cubin", os.path.join(work, "k.cubin"))
        steps = sass_per_step(build, base, tree, arch, work) if sass else {}
    for key, value in register_stats(report).items():
        stats.setdefault(key, {}).update(value)
    for key, value in steps.items():
        stats.setdefault(key, {})["sass/step"] = value
    return stats


def working_tree_commit():
    """A commit of the working tree as it is, uncommitted changes included (git stash create; the
    HEAD commit where nothing changed), to export like a revision."""
    out = subprocess.run(["git", "-C", ROOT, "stash", "create"], capture_output=True, text=True, check=True).stdout
    return out.strip() or "HEAD"


COLUMNS = ["loop", "div/rem", "setp.64", "cvt.rna", "ld.shared", "st.shared", "mma", "regs", "spills", "sass/step"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--arch", default="90")
    parser.add_argument("--against", metavar="REV", help="a git revision to compare with, printed as old>new")
    parser.add_argument("--sass", action="store_true",
                        help="also the SASS instructions of one K step (static, from the cubins' text sizes; "
                             "two more compilations per revision)")
    a = parser.parse_args()
    build = os.path.abspath(a.build)
    base = nvcc_command(build)
    new = measure(build, base, None, a.arch, a.sass)
    old = measure(build, base, a.against, a.arch, a.sass) if a.against else None
    print("path problem tile    " + " ".join(f"{c:>11}" for c in COLUMNS))
    for key in sorted(new):
        cells = []
        for c in COLUMNS:
            v = new[key].get(c, "-")
            if old is not None:  # a revision before the 16-byte A copies: its TF32 kernel for both
                before = old.get(key) or old.get(("tf32",) + key[1:] if key[0] == "tf32v" else key, {})
                v = f"{before.get(c, '-')}>{v}"
            cells.append(f"{v!s:>11}")
        print(f"{key[0]} {key[1]:<7} {key[2]:<8}" + " ".join(cells))


if __name__ == "__main__":
    main()
