"""One rank of the two-process torch.distributed (gloo) test: each rank streams its own batches."""

import sys

import torch
import torch.distributed as dist
from distributed import Client

import gear_flow as gf
from gear_flow.distributed import DistributedTable

if __name__ == "__main__":
    addr, name, rank, world, store = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    with Client(addr) as client:
        table = DistributedTable.attach(name, client=client)
        keys = []
        total = torch.zeros(1)
        for b in gf.Stream(table, 16, 4, num_batches=5, seed=123):  # rank taken from torch.distributed
            keys += b.keys.tolist()
            total += b["t"].float().sum()
        dist.all_reduce(total)
        print("RESULT", int(total.item()), ",".join(map(str, keys[:40])), flush=True)
    dist.destroy_process_group()
