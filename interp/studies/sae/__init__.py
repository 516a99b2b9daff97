"""Studies of a sparse autoencoder trained with ``interp sae train`` (docs/sae.md): which of its features are
the high-norm artifacts. Declarations in :mod:`.configs` (torch-free), the study in :mod:`.sae_features`."""
