seldp-harness --sweep results/bugs/sweeps/cp.json --dtype f32 --aux-loss-coeff 0.1 --z-loss-coeff 0.01 --global-batch 255 --steps 3 --seed 1234 --inject aux-cp
