seldp-harness --sweep results/bugs/sweeps/edp1.json --dtype f32 --global-batch 255 --steps 3 --seed 1234 --inject edp1-skip
