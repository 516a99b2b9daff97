"""Lazy aggregation (docs/methods.md section 3): ``patch_score``, ``pib`` (with the reference protocol
``pib_protocol``), ``masking`` and ``selective_cls`` (the measured effect of the ``SelectiveCLS`` edit)."""
