"""File formats of the data the studies read, below the models layer (no torch): image arguments
(``image_files``: a folder, a list file, image paths), box files (``box_files``: CSV / JSON / COCO; ``voc_xml``:
Pascal VOC XML; ``box_types``: the box types and the checks every reader applies) and mask files (``masks``)."""
