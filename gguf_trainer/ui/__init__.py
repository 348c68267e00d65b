"""The Gradio GUI: one module per tab, a thin client of runner.supervisor (style.md §9).

Not built yet: the GUI issue adds it. Nothing here may import torch.
"""
