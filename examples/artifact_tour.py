"""Find high-norm tokens and register neurons on the planted demo model, then remove the artifacts with a
test-time register. Swap in a real model with interp.load("vit_large_patch14_reg4_dinov2", weights=...).

    python examples/artifact_tour.py
"""
import interp
from interp.hooks.names import resid_post
from interp.interventions import TestTimeRegister
from interp.models import planted_truth, sample_image_paths
from interp.studies import open_source
from interp.studies.artifacts.neurons import neurons_study
from interp.studies.artifacts.norms import norms_study
from interp.detection.detection import detect
from interp.detection.spec import DetectionSpec
from interp.detection.detection import RunOptions

model = interp.load("planted_vit")  # synthetic: register neurons planted by construction
source = open_source(model=model, images=sample_image_paths())

found = detect(source, DetectionSpec(threshold="auto"), RunOptions(progress=False))  # high-norm tokens, found once
norms = norms_study(source, detection=found, progress=False)
print(f"artifacts found: {norms.artifacts_found}; threshold {norms.threshold:.0f}; "
      f"outliers per image {norms.outlier_counts}; emergence {norms.emergence['layer']} ({norms.emergence['component']})")

neurons = neurons_study(source, detection=found, top_k=4, highest_layer=norms.emergence["layer"], progress=False)
print("register neurons:", [(n["layer"], n["neuron"], round(n["score"], 2)) for n in neurons.neurons])
truth = planted_truth(model)
print("planted:          ", truth.layer, truth.neurons)

x = interp.load_images(sample_image_paths(), model)
with model.intervene(TestTimeRegister(neurons.neuron_dict())):
    _, cache = model.run_with_cache(x, names_filter=resid_post(model.n_layers - 1))
    lay = model.layout
norms_after = cache[resid_post(model.n_layers - 1)].norm(dim=-1)
print(f"with a test-time register: max patch norm {norms_after[:, lay.patch_slice].max():.0f}, "
      f"register token norm {norms_after[:, lay.n_prefix - 1].max():.0f}")
