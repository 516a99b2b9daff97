"""The contract every study shares beyond the detection of high-norm tokens (:mod:`interp.detection`): results
(``result``), the options several studies take (``options``, torch-free), statistics (``stats``), regions on the
patch grid (``regions``), Patch Score maps (``score_maps``) and the behaviour readout (``behaviour``)."""
