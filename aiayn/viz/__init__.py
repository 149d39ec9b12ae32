"""Plots: attention heat-maps (``attention.py``). Uses matplotlib's Agg backend (no display)."""
