#!/usr/bin/env python3
"""seldp-bench --compare gloo: torch.distributed's gloo backend, timed and validated with
seldp-bench's rule (harness/bench/bench.h), for the gloo column beside seldp and Open MPI.

    python3 seldp-bench-gloo.py -o allreduce --ranks 2 -b 1048576 -e 67108864 -f 2 -n 10 -w 2

P processes (torch.multiprocessing, a file:// rendezvous in a temporary directory) each hold
the same input pattern as seldp-bench's ranks (bench_pattern: small integers, exact in F32)
and run dist.all_reduce (F32 SUM) or dist.broadcast from rank 0 on CPU tensors. Per size:
`warmup` untimed calls, then `iters` samples of k calls between barriers (k = 1 from 1 MiB
up, else min(1000, 1 MiB / size)), the sample being rank 0's time per call; the row's time
is the median. gloo's all_reduce works in place, so each sample starts from a fresh copy of
the input (the copy is not timed) and the result of the last call is checked against the
expected values on every rank; `wrong` counts the elements that differ, over all ranks.

Rank 0 prints one JSON object per size on stdout, the keys seldp-bench reads:
    {"op": "allreduce", "impl": "gloo", "ranks": 2, "bytes": 1048576, "time_us": 812.5,
     "wrong": 0}
Exit status: 0; 1 when a result was wrong or a rank failed; 2 on a usage error; 77 when torch
with the gloo backend cannot be imported (seldp-bench then leaves the column out, with this
program's last line as the reason). torch is never a dependency of seldp.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

SKIP = 77


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--op", choices=("allreduce", "broadcast"), default="allreduce")
    p.add_argument("-r", "--ranks", type=int, default=2)
    p.add_argument("-b", "--minbytes", type=int, default=1 << 20)
    p.add_argument("-e", "--maxbytes", type=int, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=float, default=2.0)
    p.add_argument("-n", "--iters", type=int, default=10)
    p.add_argument("-w", "--warmup", type=int, default=2)
    a = p.parse_args(argv)
    if a.ranks < 1 or a.minbytes < 4 or a.maxbytes < a.minbytes or a.stepfactor <= 1:
        p.error("expected ranks >= 1, 4 <= minbytes <= maxbytes and stepfactor > 1")
    if a.iters < 1 or a.warmup < 0:
        p.error("expected iters >= 1 and warmup >= 0")
    return a


def sizes(a):
    """seldp-bench's sizes: bench_next_size from minbytes to maxbytes."""
    b = a.minbytes
    while b <= a.maxbytes:
        yield b // 4 * 4
        nxt = int(b * a.stepfactor)
        b = nxt if nxt > b + 1 else b + 1


def batch(nbytes):
    """bench_batch: calls per sample."""
    k = (1 << 20) // max(nbytes, 1)
    return max(1, min(1000, k))


def pattern(torch, rank, n):
    """bench_pattern(rank, i) for i in [0, n) as F32: the hash seldp-bench uses."""
    i = torch.arange(n, dtype=torch.int64)
    h = ((i * 2654435761) & 0xFFFFFFFF) ^ (((rank + 1) * 40503) & 0xFFFFFFFF)
    h = h ^ (h >> 15)
    return ((h & 127) - 64).to(torch.float32)


def rank_main(rank, a, init):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=a.ranks)
    max_count = a.maxbytes // 4
    send = pattern(torch, rank, max_count)
    if a.op == "allreduce":
        expect = sum(pattern(torch, q, max_count) for q in range(a.ranks))
    else:
        expect = pattern(torch, 0, max_count)
    buf = torch.empty(max_count, dtype=torch.float32)
    any_wrong = 0
    for nbytes in sizes(a):
        count = nbytes // 4
        x = buf[:count]
        k = batch(nbytes)

        def call():
            if a.op == "allreduce":
                dist.all_reduce(x, op=dist.ReduceOp.SUM)
            else:
                dist.broadcast(x, src=0)

        for _ in range(a.warmup):
            x.copy_(send[:count])
            call()
        samples = []
        for _ in range(a.iters):
            x.copy_(send[:count])
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                call()
            dist.barrier()
            samples.append((time.perf_counter() - t0) / k)
        # the check: one call from the input
        x.copy_(send[:count] if (a.op == "allreduce" or rank == 0) else torch.full_like(x, float("nan")))
        call()
        wrong = torch.tensor([int((x.view(torch.int32) != expect[:count].view(torch.int32)).sum())],
                             dtype=torch.int64)
        dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
        any_wrong += int(wrong.item())
        if rank == 0:
            row = {"op": a.op, "impl": "gloo", "ranks": a.ranks, "bytes": count * 4,
                   "time_us": 1e6 * statistics.median(samples), "wrong": int(wrong.item()),
                   "dtype": "f32"}
            print(json.dumps(row), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if any_wrong:
        sys.exit(1)


def main(argv):
    a = parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except Exception as e:  # ImportError, or a broken install
        print(f"python3 cannot import torch ({type(e).__name__}: {e}); torch is optional",
              flush=True)
        return SKIP
    if not dist.is_available() or not dist.is_gloo_available():
        print(f"torch {torch.__version__} has no gloo backend (torch.distributed.is_gloo_available() "
              "is False)", flush=True)
        return SKIP
    with tempfile.TemporaryDirectory(prefix="seldp-bench-gloo-") as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        try:
            mp.spawn(rank_main, args=(a, init), nprocs=a.ranks, join=True)
        except Exception as e:  # a rank failed: torch names it and its exit code
            print(f"gloo ranks failed: {e}".replace("\n", " "), flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
