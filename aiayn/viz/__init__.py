"""Plots: attention heat-maps (``attention.py``) and training curves (``curves.py``); matplotlib Agg."""
