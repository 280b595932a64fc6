"""Statistics helpers shared by the study and the MTP tools: confidence intervals (intervals.py) and acceptance
against entropy in bins (entropy_bins.py). Below both: nothing here imports a training or study module."""
