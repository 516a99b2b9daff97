"""The contract every study shares: activation sources (``source``), outlier detection (``detection``,
``outliers``, ``norm_split``), results (``result``), the forward primitive (``forward``), published settings
(``presets``), overlap scores (``metrics``) and the study descriptors (``descriptors``)."""
