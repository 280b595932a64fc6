#!/usr/bin/env bash
# The full study of docs/results (issue 14), as one command: `bash docs/results/run_study.sh`.
# Every step resumes or reuses what a previous run finished; from the stage times measured on
# 2026-11-30 on 2 CPU cores, about 90 minutes from nothing and 65 with the policies trained (these
# shared machines vary up to 2x between days).
#
#   1. the policies (docs/results/policies.md)
#   2. the demo: the loss table, the entropy law per temperature and per token with intervals, the
#      draft-vs-target diagnostics, GRPO with and without speculation and with online ce
#      (docs/example-report)
#   3. the loss table over 3 seeds with 95% intervals, on math and on code, the highest-entropy task
#      (docs/results/loss-study.md; `bebop report OUT/loss_table.json` redraws it)
#   4. online MTP strategies over 40 RL steps (docs/results/online-mtp.md)
set -euo pipefail
B=${BEBOP:-bebop}
[ -f runs/policies/math/sft_meta.json ] || $B sft --task math --out runs/policies/math --steps 600
[ -f runs/policies/code/sft_meta.json ] || $B sft --task code --out runs/policies/code --steps 450
$B demo --out runs/demo-v2 --policy runs/policies/math
for pair in math:runs/study-seeds-v2 code:runs/study-seeds-code-v2; do
  $B mtp study --model runs/policies/${pair%%:*} --task ${pair%%:*} --out ${pair#*:} --losses ce,e2e_tv \
      --steps 100 --depths 5 --k 3 --n 32 --num-samples 192 --seeds 0,1,2 --ce-warmup 0.5
done
for u in none ce tv e2e_tv; do
  [ -f runs/online2-$u/model/config.json ] || $B rl --model runs/demo-v2/heads/e2e_tv --task math --steps 40 \
      --out runs/online2-$u --spec rs --k 3 --mtp-update $u --batch-prompts 8 --group-size 4 \
      --max-new-tokens 192 --save-every 20 $( [ -f runs/online2-$u/config.json ] && echo --resume )
done
