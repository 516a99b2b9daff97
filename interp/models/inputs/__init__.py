"""What goes into the model: images decoded and preprocessed (:mod:`.preprocessing`), where an original image's
pixels land in the input (:mod:`.geometry`), the bundled sample photos (:mod:`.samples`)."""
