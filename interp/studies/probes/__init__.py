"""Linear probes (docs/methods.md section 4): ``probes`` (the probes study: position, pixels, label per
token group), ``scores`` (the per-group scores and the minimums), ``tokens`` (high-norm patches and the token
sample), ``image_sets`` (train / test / validation images) and ``linear_probe`` (the probe kernel it fits).
"""
