/* seldp-bench --gpu: the GPU rows (NCCL and host-staged with device buffers). */
#include <stdio.h>

#include "driver.h"

int bench_gpu_rows(const bench_opts *o, bench_rows *rows)
{
    (void)o;
    (void)rows;
    printf("# no GPU rows: this seldp-bench was built without CUDA and NCCL (configure with "
           "-DSELDP_WITH_CUDA=ON -DSELDP_WITH_NCCL=ON); skipped\n");
    return 0;
}
