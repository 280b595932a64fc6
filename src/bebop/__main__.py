import os
import sys

from bebop.cli import main

code = main()
if "WORLD_SIZE" in os.environ:  # a rank of a learner command (torchrun, or --nproc's launcher)
    from bebop.distributed.launch import exit_rank

    exit_rank(code)
sys.exit(code)
