seldp-harness --sweep ep --world 8 --dtype f32 --micro-batches 5 --global-batch 255 --steps 3 --seed 1234 --inject last-microbatch
