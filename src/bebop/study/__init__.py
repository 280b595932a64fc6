"""The method's study: the loss table, the entropy-acceptance law, the RL speedup."""
