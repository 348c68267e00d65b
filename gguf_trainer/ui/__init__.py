"""The Gradio GUI (`gguf-trainer ui`, app.py): one module per tab (setup, train, output,
hardware, logs) over the runner's control API; it never runs heavy work itself (style.md §9).
Nothing here may import torch at module level.
"""
