#!/bin/bash
cd /work/main/benchmarks
M=/work/main/runs/demo-v2/heads/e2e_tv
ARGS="--model $M --steps 4 --k 3 --batch-prompts 8 --group-size 8 --runs sync:rs"
for pass in 1 2; do
  for mb in 0 16 8 4; do
    echo "# pass $pass mb $mb"; /work/main/.venv/bin/python rl_step.py $ARGS --micro-batch-size $mb 2>/dev/null | grep -v machine | sed "s/^/mb$mb /"
  done
done
echo done
