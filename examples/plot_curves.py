#!/usr/bin/env python3
"""Plots loss against epoch for several train_data_parallel --csv files, with gnuplot.

usage: plot_curves.py OUT.svg LABEL=curve.csv [LABEL=curve.csv ...]
e.g.   for c in none bf16 int8 topk:0.01; do
         build/examples/train_data_parallel --ranks 4 --compress $c --csv $c.csv; done
       examples/plot_curves.py curves.svg none=none.csv bf16=bf16.csv int8=int8.csv topk=topk:0.01.csv
"""
import subprocess
import sys

out, curves = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
if not curves:
    sys.exit(__doc__)
plots = ", ".join(
    f"'{path}' using 1:2 skip 1 with linespoints title '{label}'" for label, path in curves)
script = f"""set terminal svg size 720,420
set output '{out}'
set datafile separator ','
set logscale y
set xlabel 'epoch'
set ylabel 'training loss'
set key top right
plot {plots}
"""
subprocess.run(["gnuplot"], input=script, text=True, check=True)
print(f"wrote {out}")
