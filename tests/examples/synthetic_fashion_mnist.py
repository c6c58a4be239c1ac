"""Writes a small Fashion-MNIST look-alike into DIR (default: data): 256 training and 64 test
images of 28x28 with labels 0..9, as the gzip-compressed IDX files of the real set. The pixels
depend on the label, so that a model can learn something in a few steps."""
import gzip
import os
import random
import struct
import sys

folder = sys.argv[1] if len(sys.argv) > 1 else "data"
random.seed(0)
os.makedirs(folder, exist_ok=True)
for split, count in (("train", 256), ("t10k", 64)):
    labels = [random.randrange(10) for _ in range(count)]
    pixels = bytes(random.randrange(256) if random.random() < 0.3 + 0.05 * labels[i // 784] else 0
                   for i in range(count * 784))
    with gzip.open(f"{folder}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, count, 28, 28) + pixels)
    with gzip.open(f"{folder}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 0x801, count) + bytes(labels))
