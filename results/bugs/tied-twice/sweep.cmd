seldp-harness --sweep worlds --ep 4 --dtype f32 --global-batch 255 --steps 3 --seed 1234 --inject tied-twice
