"""The contract every study shares: outlier detection (``detection``, ``outliers``, ``thresholds``,
``norm_split``, ``mixture``), results (``result``), published settings (``presets``), the options several studies
take (``options``, torch-free), statistics (``stats``), regions on the patch grid (``regions``), Patch Score maps
(``score_maps``) and the behaviour readout (``behaviour``)."""
