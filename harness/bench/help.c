/* seldp-bench and seldp-bench-mpi: the --help texts (bench.h). */
#include <stdbool.h>
#include <stdio.h>

#include "bench.h"

void bench_usage(FILE *f, bool mpi)
{
    if (mpi) {
        fputs(
            "usage: mpirun -np P seldp-bench-mpi [options]\n"
            "Open MPI's MPI_Allreduce (F32 SUM), MPI_Bcast, MPI_Reduce_scatter_block (F32 SUM)\n"
            "or MPI_Allgather over P processes, timed and\n"
            "validated like seldp-bench (which launches it with --compare mpi).\n\n"
            "  -b, --minbytes SIZE   smallest size per rank (default 1M)\n"
            "  -e, --maxbytes SIZE   largest size per rank (default 64M)\n"
            "  -f, --stepfactor F    size factor from one row to the next (default 2)\n"
            "  -n, --iters N         timed samples per size, reported as their median "
            "(default 10)\n"
            "  -w, --warmup N        untimed iterations first (default 2)\n"
            "  -o, --op OP           allreduce | broadcast | reduce_scatter | allgather (default\n"
            "                        allreduce)\n"
            "      --json            one JSON object per line instead of the table\n"
            "  -h, --help            this text\n",
            f);
        return;
    }
    fputs(
        "usage: seldp-bench [options]\n"
        "Times seldp's host-staged collectives (one thread per simulated rank) with nccl-tests\n"
        "conventions, validates every result, and sets them against the memory-bandwidth bound\n"
        "B, the machine's best copy bandwidth measured in the same run: every rank copies its own\n"
        "buffer of the same size at once, with non-temporal stores (the `stream` rows) and with\n"
        "memcpy (the `memcpy` rows: it reads each destination line before writing it, so it\n"
        "understates B), counted as bytes read + written per second; B = the better of the two.\n\n"
        "  -b, --minbytes SIZE   smallest size per rank (default 1M; reduce: 512M)\n"
        "  -e, --maxbytes SIZE   largest size per rank (default 64M; reduce: 512M)\n"
        "  -f, --stepfactor F    size factor from one row to the next (default 2)\n"
        "  -n, --iters N         timed samples per size, reported as their median (default 10)\n"
        "  -w, --warmup N        untimed iterations before the samples (default 2)\n"
        "  -o, --op OP           allreduce | broadcast | reduce_scatter | allgather | reduce |\n"
        "                        overlap (default allreduce)\n"
        "                        reduce_scatter: seldp_comm_reduce_scatter of SIZE bytes per\n"
        "                        rank, each rank receiving its SIZE/P; allgather:\n"
        "                        seldp_comm_allgather_counts of SIZE/P per rank into SIZE\n"
        "                        (--compare mpi: MPI_Reduce_scatter_block, MPI_Allgather)\n"
        "                        reduce: seldp_session_reduce of a selection of --tensors\n"
        "                        tensors totalling SIZE bytes per rank, beside one raw F32\n"
        "                        allreduce of the same bytes; peak RSS reported\n"
        "                        overlap: a backward of SIZE/bucket layers, each --compute-us\n"
        "                        of sleep before its gradient is marked ready, overlapped with\n"
        "                        seldp_session_reduce_start/finish, beside compute alone,\n"
        "                        communication alone and both in series (default 16M, 1M\n"
        "                        buckets)\n"
        "      --compute-us US   overlap: the backward of one layer (default 1000)\n"
        "      --compute-ratio LIST  overlap, instead of --compute-us: the whole backward\n"
        "                        R times the communication alone (measured first: the median\n"
        "                        of 3 runs of the default session), for each R in the list\n"
        "                        (0.5,1,2)\n",
        f);
    fputs("  -r, --ranks LIST      simulated ranks: 2, or 2,4, or 1-16 (default 2)\n"
          "  -d, --dtype DTYPE     allreduce: f32; reduce: mixed | f32 | bf16 | f16 (default\n"
          "                        mixed: half the tensors BF16, half F32)\n"
          "      --bucket LIST     reduce: session bucket sizes, e.g. 25M or 1M-256M (doubling);\n"
          "                        a list sweeps, each with a bucketed raw allreduce beside it\n"
          "                        (default 25M)\n"
          "      --tensors N       reduce: tensors in the selection (default 10000)\n"
          "      --compare LIST    mpi, gloo or mpi,gloo (all): beside seldp, in the same run,\n"
          "                        mpi: seldp-bench-mpi under mpirun (--oversubscribe; as root\n"
          "                        --allow-run-as-root); gloo: torch.distributed's gloo backend\n"
          "                        (seldp-bench-gloo.py, P processes), skipped with a note when\n"
          "                        python3 cannot import torch; same ranks, sizes and timing rule\n"
          "      --mpirun PATH     the MPI launcher (default mpirun)\n"
          "      --python PATH     the interpreter for --compare gloo (default: python3, then\n"
          "                        /usr/bin/python3, the first that imports torch with gloo)\n"
          "      --gloo-script PATH  the gloo program (default seldp-bench-gloo.py beside this\n"
          "                        executable)\n"
          "      --staged-commit   reduce: the sessions set cfg.staged_commit (the rows say\n"
          "                        \"staged\"): run with and without to measure what it costs\n"
          "      --no-bound        no copy rows and no bound fractions\n"
          "      --gpu             the GPU rows: NCCL (raw ncclAllReduce, seldp's allreduce and\n"
          "                        reduce) and host-staged with device buffers; says so and skips\n"
          "                        when there is no GPU\n"
          "      --json            one JSON object per line instead of the table\n"
          "      --out PREFIX      also write PREFIX.jsonl and PREFIX.csv\n"
          "  -h, --help            this text\n\n",
          f);
    fputs(
        "SIZE takes K, M and G (powers of 1024). A sample is one operation from 1 MiB up and a\n"
        "batch of up to 1000 below (1 MiB / size); time is the median sample per operation.\n"
        "Columns: size, time, algbw = size / time, busbw (allreduce and reduce: algbw * 2(n-1)/n;\n"
        "reduce_scatter and allgather: algbw * (n-1)/n; broadcast: algbw; copy rows: their copy\n"
        "bandwidth 2*n*size / time), bound % = bound time / time where the bound time is\n"
        "2*n*size / B for an allreduce, n*size / B for a broadcast and (n+1)*size / B for a\n"
        "reduce_scatter (every input read once, every rank's size/n written once) and an\n"
        "allgather (every size/n block read once, written into n outputs), B(GB/s) = the B it\n"
        "is against, #wrong = elements that differ from the expected result on any rank. Sizes\n"
        "of reduce_scatter and allgather rows are rounded down to whole elements of every rank.\n"
        "JSON keys: op, impl (seldp-host, seldp-nccl, nccl, mpi,\n"
        "gloo, memcpy, stream), ranks, bytes, time_us, algbw_GBps, busbw_GBps, bound_fraction,\n"
        "wrong, bound_GBps, memcpy_GBps and stream_GBps (rows with a bound), and for reduce rows\n"
        "dtype, bucket_bytes, tensors, raw_time_us, peak_rss, rss_extra_per_rank,\n"
        "rss_budget_per_rank.\n"
        "With SELDP_DEBUG_COLLECTIVES=1 in the environment every seldp collective first agrees\n"
        "on its fingerprint (the debug mode of seldp/comm.h), and the seldp rows say \"debug\":\n"
        "run twice, with and without, to measure what the mode costs.\n",
        f);
}
