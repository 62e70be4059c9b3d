seldp-harness --sweep worlds --ep 4 --dtype f32 --aux-loss-coeff 0.01 --global-batch 255 --steps 3 --seed 1234 --inject local-aux
