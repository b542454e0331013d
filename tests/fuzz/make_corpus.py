#!/usr/bin/env python3
"""tests/fuzz/make_corpus.py PETRA_TRAIN: writes the seed corpus of the fuzz targets into
tests/fuzz/corpus/<target>/: for each reader a few valid files and a few broken ones, small, made
with Python's standard library only (struct, zlib, gzip, zipfile). The checkpoint seeds are real
checkpoints, written by PETRA_TRAIN (build/petra-train) with the run tests/fuzz/fuzz_checkpoint.cpp
builds. Inputs that a fuzzing run found are added by hand next to these (named finding-*), and this
script leaves them alone. The layout of an input with several files: tests/fuzz/fuzz_files.hpp."""
import gzip
import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def npy(descr, shape, data, version=1, fortran=False):
    shape_text = str(tuple(shape))  # numpy's spelling: (4,), (4, 2, 2, 3), ()
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shape_text)
    prefix = 10 if version == 1 else 12
    pad = (64 - (prefix + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + data


def sections(**files):
    """An input of several files: '@@ NAME\\n' then the bytes, per file (tests/fuzz/fuzz_files.hpp)."""
    out = b""
    for name, data in files.items():
        name = name.replace("__", ".")
        assert b"\n@@ " not in data, name
        out += (b"\n" if out else b"") + b"@@ " + name.encode() + b"\n" + data
    return out


def write(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data)


def i64(values):
    return struct.pack(f"<{len(values)}q", *values)


def npy_corpus():
    pixels = bytes(range(48))  # 4 images 2x2x3, channels last
    labels = npy("<i8", (4,), i64([0, 1, 2, 1]))
    good = dict(images__npy=npy("|u1", (4, 2, 2, 3), pixels), labels__npy=labels, classes__txt=b"cat\ndog\nbird\n",
                test_images__npy=npy("|u1", (1, 2, 2, 3), pixels[:12]), test_labels__npy=npy("<i8", (1,), i64([2])))
    write("npy", "valid-uint8-channels-last", sections(**good))
    floats = struct.pack("<8f", *[0.5 * i for i in range(8)])
    write("npy", "valid-float32-nchw-no-classes", sections(images__npy=npy("<f4", (2, 1, 2, 2), floats),
                                                           labels__npy=npy("<i4", (2,), struct.pack("<2i", 3, 9))))
    write("npy", "valid-gray-version2", sections(images__npy=npy("|u1", (2, 2, 2), bytes(8), version=2),
                                                 labels__npy=npy("|u1", (2,), b"\x00\x01")))
    write("npy", "broken-zero-images-huge-channels",  # once an endless normalisation loop
          sections(images__npy=npy("<f4", (0, 1 << 40, 1, 1), b""), labels__npy=npy("<i8", (0,), b"")))
    write("npy", "broken-label-out-of-range", sections(**dict(good, labels__npy=npy("<i8", (4,), i64([0, 1, 2, 999999])))))
    write("npy", "broken-dims-overflow", sections(images__npy=npy("|u1", (1 << 32, 1 << 32, 1, 1), pixels)))
    write("npy", "broken-truncated-data", sections(images__npy=npy("|u1", (4, 2, 2, 3), pixels[:20]), labels__npy=labels))
    write("npy", "broken-big-endian-fortran", sections(images__npy=npy(">f4", (1, 1, 1, 1), b"\0\0\0\0"),
                                                       labels__npy=npy("<i8", (1,), i64([0]), fortran=True)))
    write("npy", "broken-header-length", b"\x93NUMPY\x01\x00\xff\xff{'descr': '|u1'")


def be32(*values):
    return struct.pack(f">{len(values)}I", *values)


def idx_corpus():
    images = b"\0\0\x08\x03" + be32(2, 2, 2) + bytes([0, 64, 128, 255, 1, 2, 3, 4])
    labels = b"\0\0\x08\x01" + be32(2) + b"\x03\x07"
    write("idx", "valid-raw", sections(**{"train-images-idx3-ubyte": images, "train-labels-idx1-ubyte": labels}))
    write("idx", "valid-gzip", sections(**{"train-images-idx3-ubyte.gz": gzip.compress(images, mtime=0),
                                           "train-labels-idx1-ubyte.gz": gzip.compress(labels, mtime=0)}))
    write("idx", "broken-dims-wrap-2-64",  # 65536 images of 2^24 x 2^24 in a 16-byte file
          sections(**{"train-images-idx3-ubyte": b"\0\0\x08\x03" + be32(65536, 1 << 24, 1 << 24),
                      "train-labels-idx1-ubyte": b"\0\0\x08\x01" + be32(65536) + bytes(64)}))
    write("idx", "broken-no-images", sections(**{"train-images-idx3-ubyte": b"\0\0\x08\x03" + be32(0, 28, 28),
                                                 "train-labels-idx1-ubyte": b"\0\0\x08\x01" + be32(0)}))
    write("idx", "broken-label-11", sections(**{"train-images-idx3-ubyte": images,
                                                "train-labels-idx1-ubyte": labels[:-1] + b"\x0b"}))
    corrupt = bytearray(gzip.compress(images, mtime=0))
    corrupt[14] ^= 0xFF  # the deflate stream
    write("idx", "broken-gzip-deflate", sections(**{"train-images-idx3-ubyte.gz": bytes(corrupt),
                                                    "train-labels-idx1-ubyte": labels}))
    corrupt = bytearray(gzip.compress(labels, mtime=0))
    corrupt[-6] ^= 0xFF  # the member's CRC-32
    write("idx", "broken-gzip-crc", sections(**{"train-images-idx3-ubyte": images,
                                                "train-labels-idx1-ubyte.gz": bytes(corrupt)}))
    write("idx", "broken-truncated", images[:9])


def cifar_corpus():
    record10 = b"\x07" + bytes(i % 256 for i in range(3072))
    record100 = b"\x02\x63" + bytes((7 * i) % 256 for i in range(3072))
    write("cifar", "valid-cifar10-two-batches", sections(**{"data_batch_1__bin": record10, "data_batch_2__bin": record10 * 2}))
    write("cifar", "valid-cifar100", sections(**{"train__bin": record100}))
    write("cifar", "broken-truncated-record", record10[:3000])
    write("cifar", "broken-label-200", b"\xc8" + record10[1:])
    write("cifar", "broken-empty", b"")


def npz(entries, method=zipfile.ZIP_STORED, force_zip64=False):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as z:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            with z.open(info, "w", force_zip64=force_zip64) as f:
                f.write(data)
    return buffer.getvalue()


def zip_corpus():
    side = 16  # the 16x16 variant: rows of 3 x 16 x 16 bytes
    data = npy("|u1", (2, 3 * side * side), bytes((i * 13) % 256 for i in range(2 * 3 * side * side)))
    labels = npy("<i8", (2,), i64([1, 1000]))
    entries = {"data.npy": data, "labels.npy": labels}
    write("zip", "valid-stored", npz(entries))
    write("zip", "valid-deflated-zip64", npz(entries, zipfile.ZIP_DEFLATED, force_zip64=True))
    write("zip", "broken-label-0", npz({"data.npy": data, "labels.npy": npy("<i8", (2,), i64([0, 5]))}))
    write("zip", "broken-no-labels", npz({"data.npy": data}, zipfile.ZIP_DEFLATED))
    stored = bytearray(npz(entries))
    stored[200] ^= 0x55  # inside data.npy: the CRC-32 no longer matches
    write("zip", "broken-crc", bytes(stored))
    # A deflated entry that claims 4 GB (the central directory's uncompressed size).
    claim = bytearray(npz(entries, zipfile.ZIP_DEFLATED))
    central = claim.rfind(b"PK\x01\x02", 0, claim.rfind(b"labels.npy"))
    struct.pack_into("<I", claim, central + 24, 0xFFFFFFF0)
    write("zip", "broken-declared-4gb", bytes(claim))
    write("zip", "broken-truncated-end", npz(entries)[:-10])


def checkpoint_corpus(petra_train):
    work = tempfile.mkdtemp(prefix="petra-corpus-")
    try:
        ckpt = os.path.join(work, "ck")
        # The run fuzz_checkpoint.cpp builds: PETRA, RevNet18 width 1, synthetic 2 images, batch 1, 2 epochs.
        subprocess.run([petra_train, "--dataset", "synthetic", "--synthetic-size", "2", "--batch-size", "1",
                        "--width", "1", "--epochs", "2", "--method", "petra", "--stages", "blocks", "--devices", "cpu:0",
                        "--threads", "1",
                        "--checkpoint-dir", ckpt], check=True, stdout=subprocess.DEVNULL)
        for epoch in (1, 2):
            name = f"epoch-{epoch:06d}"
            files = {"latest": (name + "\n").encode()}
            base = os.path.join(ckpt, name)
            for root, _, names in sorted(os.walk(base)):
                for n in sorted(names):
                    path = os.path.join(root, n)
                    with open(path, "rb") as f:
                        files[os.path.relpath(path, ckpt)] = f.read()
            out = b""
            for rel, data in files.items():
                assert b"\n@@ " not in data, rel
                out += (b"\n" if out else b"") + b"@@ " + rel.encode() + b"\n" + data
            label = "valid-in-flight" if epoch == 1 else "valid-finished"
            write("checkpoint", f"{label}-{name}", out)
            if epoch == 1:
                text = out.decode("latin-1")
                start = text.index("@@ epoch-000001/trainer.txt\n")
                end = text.index("\n@@ ", start + 1)
                meta = text[start:end].replace("next_epoch = 1", "next_epoch = x1").replace("global_step = 2", "global_step = 99")
                write("checkpoint", "broken-trainer-counters", (text[:start] + meta + text[end:]).encode("latin-1"))
                write("checkpoint", "broken-manifest-escapes",
                      b"@@ latest\nepoch-000001\n@@ epoch-000001/MANIFEST\npetra-checkpoint 1\n../../../../dev/zero 1 2\n"
                      b"@@ epoch-000001/trainer.txt\nformat = 2\n")
    finally:
        shutil.rmtree(work)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for target in ("npy", "idx", "cifar", "zip", "checkpoint"):
        directory = os.path.join(CORPUS, target)
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                if not name.startswith("finding-"):
                    os.remove(os.path.join(directory, name))
    npy_corpus()
    idx_corpus()
    cifar_corpus()
    zip_corpus()
    checkpoint_corpus(sys.argv[1])


if __name__ == "__main__":
    main()
