"""Training and evaluating the MTP draft head before RL (the head itself is bebop.model.mtp).

    chain.py     teacher-forced MTP chains with exactly the attention pattern of cached drafting
    data.py      training sequences: self-distilled rollouts of the policy, or task demonstrations
    train.py     `bebop mtp train`: the draft losses (ce, kl, rkl, tv, e2e_tv) over chains, resumable
    evaluate.py  `bebop mtp eval`: acceptance under RS and TO from real speculative generation
"""
