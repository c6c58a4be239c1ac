"""PyTorch's side of bench/zero_bench: the same transformer, steps, timing and memory, in Python.

Run one process per rank with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), as bench/run_zero_bench.sh does:

    python3 bench/zero_peer.py --mode zero      # DDP + torch.distributed.optim.ZeroRedundancyOptimizer(Adam)
    python3 bench/zero_peer.py --mode ddp       # DDP + torch.optim.Adam
    python3 bench/zero_peer.py --mode fsdp      # fully_shard (each block, the embeddings, norm and head) + Adam

The model is the peers' TinyGPT (../shared/peers/reference_models.py, PEERS_DIR) at vocabulary
8192, d_model 768, 12 blocks, 12 heads, MLP 3072, sequence 64, built as zero_bench builds it;
2 random sequences per rank; Adam lr 1e-3; gloo; one thread. Rank 0 prints one JSON line with
zero_bench's fields (exchange_ms is 0: PyTorch has no public call for the exchange alone).
"""
import argparse
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("PEERS_DIR", os.path.join(HERE, "..", "..", "shared", "peers")))
import reference_models  # noqa: E402

# nn.TransformerEncoder says that norm_first layers take no nested tensors: true, and beside the point.
warnings.filterwarnings("ignore", message="enable_nested_tensor")


def memory_status():
    """VmHWM, VmRSS and RssShmem of this process, in bytes."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS", "RssShmem"):
                fields[name] = float(value.split()[0]) * 1024
    return fields


def max_over_ranks(value):
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("ddp", "zero", "fsdp"), default="zero")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = reference_models.TinyGPT(8192, 768, 12, 12, 3072, 64)
    parameters = sum(p.numel() for p in net.parameters())
    if args.mode == "fsdp":
        # As zero_bench shards it: each block a unit, the embeddings, final norm and head units of
        # their own (the root then holds no parameter of its own).
        from torch.distributed.fsdp import fully_shard
        for layer in net.blocks.layers:
            fully_shard(layer)
        for name in ("tok", "pos", "norm", "head"):
            fully_shard(getattr(net, name))
        fully_shard(net)
        model = net
    else:
        model = DistributedDataParallel(net)
    if args.mode == "zero":
        optimizer = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    after_init = memory_status()

    def one_step():
        optimizer.zero_grad()
        tokens = torch.randint(0, 8192, (2, 65))
        logits = model(tokens[:, :64])
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
        optimizer.step()

    for _ in range(args.warmup):
        one_step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    step_ms = max_over_ranks((time.perf_counter() - start) * 1000 / args.steps)
    after_steps = memory_status()
    shared_growth = after_steps["RssShmem"] - after_init["RssShmem"]
    peak_growth = max_over_ranks(after_steps["VmHWM"] - after_init["VmRSS"] - shared_growth)
    shared_memory = max_over_ranks(after_steps["RssShmem"])
    local_optimizer = optimizer.optim if args.mode == "zero" else optimizer
    def local(t):  # fully_shard's state tensors are DTensors: this rank's shard
        return t.to_local() if hasattr(t, "to_local") else t
    state_bytes = sum(local(t).numel() * local(t).element_size()
                      for state in local_optimizer.state.values()
                      for name, t in state.items() if torch.is_tensor(t) and name != "step")
    most_state = max_over_ranks(float(state_bytes))
    if dist.get_rank() == 0:
        print(json.dumps({
            "impl": "pytorch " + torch.__version__, "model": "transformer", "backend": "gloo",
            "mode": args.mode, "world_size": dist.get_world_size(),
            "parameters": parameters, "step_ms": round(step_ms, 2),
            "exchange_ms": 0, "state_bytes_per_rank": most_state,
            "peak_growth_bytes": peak_growth, "shared_memory_bytes": shared_memory}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
