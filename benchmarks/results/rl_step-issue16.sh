#!/bin/bash
cd /work/main/benchmarks
M=/work/main/runs/demo-v2/heads/e2e_tv
ARGS="--model $M --steps 4 --k 3 --batch-prompts 8 --group-size 8"
for pass in 1 2 3; do
  echo "# pass $pass after" ; /work/main/.venv/bin/python rl_step.py $ARGS --runs "sync:rs" 2>/dev/null | sed "s/^/after /"
  echo "# pass $pass before"; PYTHONPATH=/tmp/bebop-before-066a930/src /work/main/.venv/bin/python rl_step.py $ARGS --runs "sync:rs" 2>/dev/null | sed "s/^/before /"
  echo "# pass $pass bf16"; /work/main/.venv/bin/python rl_step.py $ARGS --runs "sync:rs+bfloat16" 2>/dev/null | sed "s/^/bf16 /"
done
echo done
