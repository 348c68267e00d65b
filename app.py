"""Launch gguf-trainer from a checkout: `python app.py [args]` is `gguf-trainer [args]`.

The Gradio GUI is the default command once it lands (gguf_trainer/ui/); until then a bare
call prints the command help.
"""

import sys

from gguf_trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
