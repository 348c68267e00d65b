"""Launch gguf-trainer from a checkout: `python app.py [args]` is `gguf-trainer [args]`.

Without a command it serves the GUI on http://127.0.0.1:8655/ and opens the browser
(`--no-browser`, `--port N`, `--host`, `--share`, `--auth user:pass`, `--root DIR`).
"""

import sys

from gguf_trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
