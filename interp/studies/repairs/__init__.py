"""The repairs theme: every training-free repair of the high-norm tokens on one table (:mod:`.repairs`), with
SINDER's weight-only direction (:mod:`.sinder`) and PH-Reg's test-time-augmentation views (:mod:`.tta`)."""
