"""The causal toolkit (docs/causal.md): logit lens and direct logit attribution, activation patching, attribution
patching."""
