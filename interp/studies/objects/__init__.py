"""Objects in the maps (docs/methods.md sections 3 and 5): ``lost`` (object discovery) and ``segment`` (the coarse
segmentation), declared in ``configs``; the box and mask files they read are :mod:`interp.formats`, their
patch-grid regions :mod:`interp.studies.core.regions`."""
