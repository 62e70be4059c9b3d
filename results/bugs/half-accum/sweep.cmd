seldp-harness --sweep worlds --ep 2 --dtype bf16 --global-batch 255 --steps 3 --seed 1234 --inject half-accum
