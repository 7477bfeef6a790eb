set terminal svg size 800,480 dynamic font 'sans,12'
set output 'ttft.svg'
set title 'Time to first token, 64 turns (reference engine, tp 2)'
set xlabel 'TTFT (ms, log scale)'
set ylabel 'fraction of turns'
set logscale x
set key bottom right
set grid
plot 'ttft.dat' index 0 with steps lw 2 title 'without offload', '' index 1 with steps lw 2 title 'with the host tier', '' index 2 with steps lw 2 dt 2 title 'host tier + encoder disaggregation'
