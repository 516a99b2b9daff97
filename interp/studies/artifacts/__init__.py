"""High-norm tokens and register neurons (docs/methods.md sections 1-2): ``norms``, ``emergence``, ``neurons``
(with its score kernel ``register_scores``), and the causal studies ``ablate``, ``relocate``, ``registers``."""
