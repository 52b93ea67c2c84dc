#!/usr/bin/env bash
# `make bench`: every vla-bench figure side by side with its peer, then docs/benchmarks.md rebuilt
# from the results. Run it on an otherwise idle machine: the figures are ratios measured in one run,
# but a busy neighbour still shifts them.
set -euo pipefail
cd "$(dirname "$0")/.."
export MUJOCO_GL="${MUJOCO_GL:-egl}"
OUT=runs/bench
DATA="${DATA:-data/demo.hdf5}"
CKPT="${CKPT:-runs/demo}"
mkdir -p "$OUT"
# Sections measured by longer runs (the delay sweep) sit below this marker; a rebuild keeps them.
KEEP="<!-- below: longer runs, kept by make bench -->"
kept="$(sed -n "/^$KEEP\$/,\$p" docs/benchmarks.md 2>/dev/null || true)"

vla-bench latency --config configs/demo.yaml --json "$OUT/latency.json"
vla-bench latency --window 8 --json "$OUT/latency_k8.json"
vla-bench train --config configs/demo.yaml --json "$OUT/train.json"
vla-bench data --config configs/demo.yaml --data "$DATA" --json "$OUT/data.json"
vla-bench collect --json "$OUT/collect.json"
vla-bench latency --threads 1 --json "$OUT/latency_backends.json"
vla-bench plan --hz 20 --budget-ms 10 --threads 1 --json "$OUT/plan_10ms.json"
vla-bench plan --hz 20 --budget-ms 50 --threads 1 --json "$OUT/plan_50ms.json"
# serving needs a checkpoint (the demo's) and, for onnxruntime, its export
[ -f "$CKPT/export/manifest.json" ] || vla-export --checkpoint "$CKPT" --parity-steps 0
vla-bench serve --checkpoint "$CKPT" --backend onnxruntime --json "$OUT/serve_onnx.json"
vla-bench serve --checkpoint "$CKPT" --backend torch --json "$OUT/serve_torch.json"

{
  echo "# Benchmarks"
  echo
  echo "Latest figures from \`make bench\` (\`scripts/bench.sh\`), $(date -u +%Y-%m-%d), on $(nproc) CPU cores"
  echo "($(lscpu | sed -n 's/^Model name: *//p' | head -1)), torch $(python -c 'import torch; print(torch.__version__)')."
  echo "Each table compares against its peer in the same run; read the ratios, not the absolute times."
  echo
  echo "## Control-step latency, demo model (\`vla-bench latency --config configs/demo.yaml\`)"
  echo; cat "$OUT/latency.md"; echo
  echo "## Control-step latency at an 8-step window (\`vla-bench latency --window 8\`)"
  echo; cat "$OUT/latency_k8.md"; echo
  echo "## Training throughput and MFU (\`vla-bench train --config configs/demo.yaml\`)"
  echo; cat "$OUT/train.md"; echo
  echo "## Data loader vs trainer (\`vla-bench data --data $DATA\`)"
  echo; cat "$OUT/data.md"; echo
  echo "## Collection (\`vla-bench collect\`)"
  echo; cat "$OUT/collect.md"; echo
  echo "## Streaming step by backend and its FLOP limit (\`vla-bench latency --threads 1\`)"
  echo; cat "$OUT/latency_backends.md"; echo
  echo "## Latency-budget planner (\`vla-bench plan --hz 20 --budget-ms 10|50 --threads 1\`)"
  echo; cat "$OUT/plan_10ms.md"; echo; cat "$OUT/plan_50ms.md"; echo
  echo "## Serving on loopback, $CKPT (\`vla-bench serve --backend onnxruntime|torch\`)"
  echo; cat "$OUT/serve_onnx.md"; echo; cat "$OUT/serve_torch.md"
  echo; if [ -n "$kept" ]; then echo "$kept"; else echo "$KEEP"; fi
} > docs/benchmarks.md
echo "wrote docs/benchmarks.md"
