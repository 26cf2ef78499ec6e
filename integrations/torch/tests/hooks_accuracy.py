"""DDP with each cohort hook trains the digits MLP to within 1 point of uncompressed training.

    hooks_accuracy.py RUN_TORCHRUN TRAIN_DDP

Runs examples/torch/train_ddp.py at P=2 on the cohort backend (under torchrun, through
run_torchrun.py) without a hook and with fp16, bf16, int8 and top-k 1% (error feedback), and
compares their final test accuracies with the uncompressed run's. Exit 77 without torch.
"""
import re
import subprocess
import sys

run_torchrun, train_ddp = sys.argv[1:3]
accuracy = {}
for hook in ["none", "fp16", "bf16", "int8", "topk:0.01"]:
    out = subprocess.run([sys.executable, run_torchrun, "2", train_ddp, "--backend", "cohort",
                          "--hook", hook], capture_output=True, text=True, timeout=300)
    if out.returncode == 77:
        print(out.stdout + out.stderr)
        sys.exit(77)
    found = re.search(r"done: test accuracy ([0-9.]+)%", out.stdout)
    if out.returncode != 0 or not found:
        print(out.stdout + out.stderr)
        print(f"FAILED: hook {hook}: exit {out.returncode}")
        sys.exit(1)
    accuracy[hook] = float(found.group(1))
    print(f"hook {hook:10s} test accuracy {accuracy[hook]:.1f}%", flush=True)

base = accuracy.pop("none")
low = {h: a for h, a in accuracy.items() if a < base - 1.0}
if low:
    print(f"FAILED: more than 1 point below the uncompressed {base:.1f}%: {low}")
    sys.exit(1)
print(f"every hook within 1 point of the uncompressed {base:.1f}% (or above it)")
