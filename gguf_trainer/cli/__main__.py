"""`python -m gguf_trainer.cli ARGS`: the same as the `gguf-trainer` console script."""

import sys

from gguf_trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
