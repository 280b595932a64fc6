import sys

from bebop.cli import main

sys.exit(main())
