# gnuplot sweep.gp (in this folder) draws sweep.png from sweep.dat
set terminal pngcairo size 1100,900 noenhanced
set output 'sweep.png'
set multiplot layout 2,1 title 'sweep results/grid/layouts.json: loss per step of every run, and the largest deviation from the run compared with'
set xlabel 'step'
set ylabel 'loss'
set xtics 1
set key outside right
plot 'sweep.dat' using 1:3 with linespoints dashtype 1 title 'one-rank', \
     'sweep.dat' using 1:4 with linespoints dashtype 2 title 'megatron-16-tp2-pp2-ep2', \
     'sweep.dat' using 1:5 with linespoints dashtype 3 title 'megatron-8-tp2-cp2-etp1-ep4', \
     'sweep.dat' using 1:6 with linespoints dashtype 4 title 'megatron-0.9-8-tp2-pp2-ep2', \
     'sweep.dat' using 1:7 with linespoints dashtype 5 title 'deepspeed-16-tp2-pp2-ep4', \
     'sweep.dat' using 1:8 with linespoints dashtype 1 title 'torchtitan-16-tp2-pp2-ep4'
set logscale y
set format y '%.0e'
set ylabel 'relative deviation'
plot 'sweep.dat' using 1:2 with linespoints lw 2 title 'largest loss deviation', 1e-05 with lines dashtype 2 title 'limit (f32)'
unset multiplot
