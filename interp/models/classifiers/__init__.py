"""Classifier heads: what a model's head is (:mod:`.heads`) and classifier files (:mod:`.classifier`)."""
