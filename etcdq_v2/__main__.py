"""``python -m etcdq_v2``: the ``etcdq`` command, for when the script is not on PATH."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
