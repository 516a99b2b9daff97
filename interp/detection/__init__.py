"""High-norm token detection, below the studies and the SAE line that both use it: what counts as a high-norm
token (:mod:`~interp.detection.thresholds`: fixed, percentile and automatic two-mode thresholds over
:mod:`~interp.detection.norm_split` and :mod:`~interp.detection.mixture`; :mod:`~interp.detection.presets`:
published settings) and the one detection every study shares (:mod:`~interp.detection.detection`:
``Detection``, ``DetectionSpec``, ``detect``). Nothing is imported here, so the torch-free configs can read the
presets without torch."""
