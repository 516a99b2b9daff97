"""The contract every study shares: outlier detection (``detection``, ``outliers``, ``norm_split``), results
(``result``), published settings (``presets``), overlap scores (``metrics``) and the study descriptors (``descriptors``)."""
