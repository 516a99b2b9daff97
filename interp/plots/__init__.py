"""Matplotlib figures drawn from study results only (no plot recomputes a study).

Every function returns a ``matplotlib.figure.Figure`` built without pyplot, so no GUI backend is
touched and figures are freed with their last reference.
"""
