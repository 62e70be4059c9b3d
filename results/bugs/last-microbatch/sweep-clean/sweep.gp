# gnuplot sweep.gp (in this folder) draws sweep.png from sweep.dat
set terminal pngcairo size 1100,900 noenhanced
set output 'sweep.png'
set multiplot layout 2,1 title 'sweep ep: free-running loss per step of every run (information), and the lockstep verdict'
set xlabel 'step'
set ylabel 'loss'
set xtics 1
set key outside right
plot 'sweep.dat' using 1:3 with linespoints dashtype 1 title 'w8-ep1-ep-dp-f32', \
     'sweep.dat' using 1:4 with linespoints dashtype 2 title 'w8-ep2-ep-dp-f32', \
     'sweep.dat' using 1:5 with linespoints dashtype 3 title 'w8-ep2-dp-ep-f32', \
     'sweep.dat' using 1:6 with linespoints dashtype 4 title 'w8-ep4-ep-dp-f32', \
     'sweep.dat' using 1:7 with linespoints dashtype 5 title 'w8-ep4-dp-ep-f32', \
     'sweep.dat' using 1:8 with linespoints dashtype 1 title 'w8-ep8-ep-dp-f32'
set logscale y
set format y '%.0e'
set ylabel 'ratio / deviation'
plot 'sweep.dat' using 1:9 with linespoints lw 2 title 'largest lockstep ratio to its bound (verdict)', 1 with lines lw 2 title 'bound', 'sweep.dat' using 1:2 with linespoints dashtype 3 title 'largest free-running loss deviation (information)', 1e-05 with lines dashtype 2 title 'f32 relative limit'
unset multiplot
