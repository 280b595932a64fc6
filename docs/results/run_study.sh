#!/usr/bin/env bash
# The full study of docs/results, as one command: `bash docs/results/run_study.sh`.
# Every stage resumes or reuses what a previous run finished (policies, self-distilled samples, test
# sequences, trained heads and their measures, RL runs), so an interrupted run continues where it stopped.
#
#   1. the policies (docs/results/policies.md): math, code and pick (many correct answers, ~1 nat per token)
#   2. the demo: the loss table, the entropy law per temperature and per token, the draft-vs-target
#      diagnostics, GRPO with and without speculation and with online ce (docs/example-report)
#   3. the decisive loss study (issue 27, docs/results/loss-study.md) on pick: heads trained to convergence,
#      5 seeds, exact expected acceptance with paired intervals to ce; the head-size axis (full, quarter) at
#      T=1, then the temperature axis (0.7, 1.0, 1.3) with the quarter head
#   4. online MTP strategies over 40 RL steps (docs/results/online-mtp.md)
#   5. the entropy law across RL steps (issue 27): GRPO on pick with an entropy bonus that moves the
#      policy's entropy, per rule and head (TO + ce, RS + ce, RS + e2e_tv), frozen heads
#
# Stage times on 2 CPU cores (2026-12-01): the pick policy 10 minutes; a converged head with its measures
# 2-3.5 minutes, so one cell of 2 losses x 5 seeds 25-35 minutes (the four cells about 2 hours); an RL run
# of stage 5 about 2 minutes.
# STAGES="1 3 5" runs a subset; CELLS_T and CELLS_HEAD narrow the study's axes (defaults: all of them).
set -euo pipefail
B=${BEBOP:-bebop}
STAGES=${STAGES:-"1 2 3 4 5"}
CELLS_T=${CELLS_T:-"0.7,1.0,1.3"}
CELLS_HEAD=${CELLS_HEAD:-"full,quarter"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
resume_flag() { [ -f "$1/config.json" ] && echo --resume || true; }

if has 1; then
  [ -f runs/policies/math/sft_meta.json ] || $B sft --task math --out runs/policies/math --steps 600
  [ -f runs/policies/code/sft_meta.json ] || $B sft --task code --out runs/policies/code --steps 450
  [ -f runs/policies/pick/sft_meta.json ] || $B sft --task pick --out runs/policies/pick --steps 600
fi
has 2 && $B demo --out runs/demo-v2 --policy runs/policies/math
if has 3; then
  study() { $B mtp study --model runs/policies/pick --task pick --out runs/study27-pick --losses ce,e2e_tv \
      --seeds 0,1,2,3,4 --steps 400 --eval-every 25 --patience 4 --held-out 48 --num-samples 512 --n 64 --k 3 \
      --depths 5 --ce-warmup 0.25 "$@"; }
  study --temperatures 1.0 --head-sizes "$CELLS_HEAD"   # the head-size axis at T=1
  cp runs/study27-pick/loss_table.json docs/results/loss-pick-converged.json
  study --temperatures "$CELLS_T" --head-sizes quarter  # the temperature axis where the losses differ (T=1 reused)
  cp runs/study27-pick/loss_table.json docs/results/loss-pick-temperature.json
  study --temperatures 0.7 --head-sizes quarter --seeds 0,1,2,3,4,5,6,7  # T=0.7's 5-seed interval was +-3.6
  cp runs/study27-pick/loss_table.json docs/results/loss-pick-T0.7-8seeds.json
  $B report docs/results/loss-pick-converged.json docs/results/loss-pick-temperature.json \
      docs/results/loss-pick-T0.7-8seeds.json
fi
if has 4; then
  for u in none ce tv e2e_tv; do
    [ -f runs/online2-$u/model/config.json ] || $B rl --model runs/demo-v2/heads/e2e_tv --task math --steps 40 \
        --out runs/online2-$u --spec rs --k 3 --mtp-update $u --batch-prompts 8 --group-size 4 \
        --max-new-tokens 192 --save-every 20 $(resume_flag runs/online2-$u)
  done
fi
if has 5; then
  heads=runs/study27-pick/heads/T1-full
  for run in to:ce rs:ce rs:e2e_tv; do
    rule=${run%%:*} head=${run#*:} out=runs/rl27-${run/:/-}
    [ -f $out/model/config.json ] || $B rl --model $heads/$head-s0 --task pick --steps 100 --out $out \
        --spec $rule --k 3 --mtp-update none --batch-prompts 4 --group-size 4 --max-new-tokens 48 \
        --lr 5e-5 --entropy-coef 0.05 --save-every 20 --dump-rollouts off $(resume_flag $out)
  done
  $B report --entropy-law docs/results/rl-entropy-law.md "TO + ce=runs/rl27-to-ce" "RS + ce=runs/rl27-rs-ce" \
      "RS + e2e_tv=runs/rl27-rs-e2e_tv"
fi
