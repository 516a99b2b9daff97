"""Objects in the maps (docs/methods.md sections 3 and 5): ``lost`` (object discovery), ``segment`` (the coarse
segmentation), boxes on the patch grid (``boxes``) and the box and mask files they read (``box_files``);
``configs`` declares the two studies."""
