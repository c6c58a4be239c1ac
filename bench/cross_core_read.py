"""How fast one core reads what the other core has just written, against a re-read from its own
cache: the rate that bounds the shm all_reduce, which reads each peer's data across cores.

    /usr/bin/python3 bench/cross_core_read.py [MiB]      (default 4; needs 2 cores)

A writer process pinned to core 1 fills a shared tensor; the reader, pinned to core 0, copies it
out twice (the first copy pulls the lines from the writer's cache, the second finds them in its
own), 200 times. Prints one JSON line.
"""
import json
import os
import sys
import time

import torch

torch.set_num_threads(1)
size = int(sys.argv[1] if len(sys.argv) > 1 else 4) << 20
shared = torch.zeros(size // 4).share_memory_()
source = torch.ones(size // 4)
sink = torch.empty(size // 4)
written_r, written_w = os.pipe()
read_r, read_w = os.pipe()
rounds = 200

pid = os.fork()
if pid == 0:
    os.sched_setaffinity(0, {1})
    for _ in range(rounds):
        shared.copy_(source)
        os.write(written_w, b"x")
        os.read(read_r, 1)
    os._exit(0)

os.sched_setaffinity(0, {0})
across = again = 0.0
for _ in range(rounds):
    os.read(written_r, 1)
    start = time.perf_counter()
    sink.copy_(shared)
    across += time.perf_counter() - start
    start = time.perf_counter()
    sink.copy_(shared)
    again += time.perf_counter() - start
    os.write(read_w, b"x")
os.waitpid(pid, 0)
print(json.dumps({"bytes": size, "other_core_gbps": round(size * rounds / across / 1e9, 1),
                  "own_cache_gbps": round(size * rounds / again / 1e9, 1)}))
