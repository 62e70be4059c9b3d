seldp-harness --sweep results/bugs/sweeps/tp.json --dtype f32 --global-batch 255 --steps 3 --seed 1234 --inject router-tp
