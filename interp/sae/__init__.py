"""Sparse autoencoders on one hook of a ViT, trained with overcomplete's modules (``pip install 'interp[sae]'``).

Example (not run as a doctest: it needs a trained SAE)::

    result = interp.sae.train(model, "blocks.3.hook_resid_post", "runs/sae", cache="acts.h5", steps=300)
    sae = interp.sae.load("runs/sae", model=model)
    codes = sae.encode(acts)          # [..., d] hook units -> [..., n_features]
    report = interp.sae.sae_features(sae, model, cache="acts.h5")   # which features are artifacts

Training is :mod:`.train` (streaming :mod:`.data`, run set-up :mod:`.setup`), files and loading :mod:`.model`,
the artifact-feature computation :mod:`.features` (rule: :mod:`.artifact_rule`), loss recovered :mod:`.evaluate`;
the feature ablation is
``interp.interventions.SAEFeatureAblation``. See docs/sae.md.
"""
from .features import sae_features
from .model import SAE, load
from .train import TrainSettings, train

__all__ = ["SAE", "load", "train", "TrainSettings", "sae_features"]
