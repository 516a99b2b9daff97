"""The explorer's model side: one model over a fixed set of images. The unedited results, the detection and
the register-neuron ranking are computed once; each request re-runs only the edited forward of one image
(and, once per distinct edit, the readout over all images). Results are cached by (image, edit).

>>> from interp.explore.session import ExploreSession
>>> s = ExploreSession(model, photos)           # planted_vit on the sample photos
>>> out = s.run(0, [{"kind": "NeuronAblation", "neurons": {"2": [17, 101, 402, 655]}}])
>>> out["outlier_count"], out["baseline"]["outlier_count"] > 0, len(out["norms"]), len(out["norms"][0])
(0, True, 6, 196)
"""
from __future__ import annotations

import io
import threading
import time
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..errors import InterpError
from ..hooks.names import RESID_STAGES as STAGES
from ..interventions import interventions_from_spec, masks
from ..models.planted import planted_truth
from ..models.inputs.preprocessing import list_images
from ..studies.artifacts.neurons import neurons_study
from ..studies.core.behaviour import BehaviourReadout, ClassifierLike, behaviour_readout
from ..runtime.forward import run_hooks
from ..detection.detection import RunOptions, detect
from ..detection.spec import DetectionSpec
from ..runtime.open import open_source
from .controls import refused_controls
from .display import curves, edit_key, lru, rounded
from .readout import compare_outputs
from .sae_panel import SaePanel, is_sae_entry
from .requests import MAX_SECONDS, RequestTooLarge, check_spec, check_threshold, describe_edits

MAX_NEURON_MAPS = 32  # neuron activation maps per response (the ranked ones first, then edited ones)


@dataclass
class ExploreOptions:
    """Settings fixed for a session.

    Attributes:
        detection: what counts as a high-norm token (threshold, block, preset), resolved once on the unedited
            model over all images, as the studies do (:func:`~interp.detection.detection.detect`). Its threshold
            is the page's default; a request may count outliers above another (``run(threshold=)``, a display
            threshold that changes nothing else).
        neurons: the register neurons to list ({layer: [neuron]}); None ranks them with the neurons study.
        classifier: a classifier file (path, dict or :func:`interp.load_classifier`) whose class logits the
            readout reads, as the studies' ``--classifier``; None: the model's own head. The readout and its label
            rule are the studies' (:mod:`interp.studies.core.behaviour`).
        max_images: more images than this are refused (they are held in memory and re-run for each readout).
        max_seconds: a request's model work (calibration, edited forward, readout) stops after this many
            seconds with :class:`~interp.explore.requests.RequestTooLarge` (HTTP 413).
        sae: a trained SAE's folder: the page lists its artifact features and toggles their ablation
            (:mod:`interp.explore.sae_panel`).
    """

    detection: DetectionSpec = field(default_factory=DetectionSpec)
    top_k: int = 10
    neurons: Optional[Dict[int, List[int]]] = None
    batch_size: int = 16
    classifier: ClassifierLike = None
    max_images: int = 64
    max_seconds: float = MAX_SECONDS
    sae: Optional[str] = None


class ExploreSession:
    """What the explorer serves: ``info()`` once, ``run(image, interventions)`` per edit, ``export``.

    Args:
        model: a ``HookedViT``.
        images: what ``open_source`` takes (a folder, paths, a list file, or a preprocessed Tensor[N, 3, H, W]);
            only these images are ever read or shown.
    """

    def __init__(self, model, images, options: Optional[ExploreOptions] = None, progress: bool = False):
        self.model = model
        self.options = options or ExploreOptions()
        self.lock = threading.RLock()  # one forward at a time: hooks and edit state live on the model
        self.clock = time.monotonic  # what the per-request time limit reads (tests replace it)
        n = images.shape[0] if isinstance(images, torch.Tensor) else len(list_images(images))
        if n > self.options.max_images:
            raise InterpError(f"{n} images: the explorer holds its images in memory and re-runs all of them for "
                              f"the readout of each edit; give at most {self.options.max_images} (a smaller folder "
                              "or list file), or raise the limit (--max-images N)")
        source = open_source(model=model, images=images, batch_size=self.options.batch_size)
        if len(source) == 0:
            raise InterpError(f"no readable image in {images!r}; give a folder or list of images (--images)")
        # the behaviour readout first: a classifier that does not fit the model fails before any forward
        self.readout: BehaviourReadout = behaviour_readout(source, self.options.classifier)
        self.source = source.held()  # decoded once
        self.pixels = torch.cat([x for _, x in self.source.image_batches()])  # [N, 3, H, W] on the model's device
        self.display = self.source.display_images(limit=len(self.source))  # [N, 3, H, W] in 0..1
        self.layout = self.source.layout
        # every block's token grid: one for a ViT; a pyramid's (PVTv2, Swin-v2) stages run on coarser ones
        self.grids = [tuple(self.layout.for_block(l).grid) for l in range(model.n_layers)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.detection = detect(self.source, self.options.detection, RunOptions(progress=progress))
            self.neurons, self.neuron_note = self._rank_neurons(progress)
            listed = {}
            for n in self.neurons:
                listed.setdefault(int(n["layer"]), []).append(int(n["neuron"]))
            self.sae = None if self.options.sae is None else SaePanel(self.options.sae, self.source, listed,
                                                                       progress)
        self.warnings = sorted({str(w.message) for w in caught})
        self.grid = self.grids[self.detection.layer]  # the outliers', the ranked neurons' and the targets' grid
        self.default_threshold = float(self.detection.counting_threshold())
        self._runs: "OrderedDict[tuple, Dict]" = OrderedDict()
        self._readouts: "OrderedDict[str, Dict]" = OrderedDict()
        self._parsed: "OrderedDict[str, list]" = OrderedDict()
        self._thumbs: Dict[int, bytes] = {}
        self.baseline_outputs = self._outputs([])  # pooled vectors and logits of every image, unedited

    # ------------------------------------------------------------------ set-up
    def _rank_neurons(self, progress: bool):
        """([{"layer", "neuron", "score"}], note): given neurons (score None) or the neurons study's top_k."""
        if self.options.neurons:
            listed = [{"layer": int(l), "neuron": int(n), "score": None}
                      for l, idx in sorted(self.options.neurons.items()) for n in idx]
            return listed, "neurons given on the command line (--neurons); not ranked here"
        result = neurons_study(self.source, detection=self.detection, top_k=self.options.top_k,
                               progress=progress)
        note = result.message or result.warning or (
            f"ranked by the neurons study over {result.n_images_with_outliers} image(s) with outliers "
            f"(score: mean |activation| on the outlier tokens)")
        return list(result.neurons), note

    def info(self) -> Dict[str, Any]:
        """What the page needs once: model, images, sizes, threshold, neurons, readout kind, target presets."""
        truth = planted_truth(self.model)
        det = self.detection
        h, w = self.grid
        presets = {"smiley": masks.smiley(self.grid) if min(h, w) >= 5 else masks.box(self.grid, 0, 0, 1, 1),
                   "centre box": masks.box(self.grid, h // 3, w // 3, max(1, h // 3), max(1, w // 3)),
                   "top-left corner": masks.box(self.grid, 0, 0, max(1, h // 4), max(1, w // 4))}
        return {
            "model": self.model.model_name,
            "planted": None if truth is None else {"layer": truth.layer, "neurons": list(truth.neurons),
                                                   "note": truth.description},
            "images": [{"index": i, "id": image_id} for i, image_id in enumerate(self.source.ids)],
            "n_blocks": self.model.n_layers, "n_heads": self.model.n_heads, "d_mlp": self.model.d_mlp,
            "grid": list(self.grid), "grids": [list(g) for g in self.grids],
            "image_size": list(self.pixels.shape[-2:]),
            "has_cls": self.layout.cls_index is not None,
            "refused": refused_controls(self.model.family, self.layout),
            "detect_layer": det.layer,
            "threshold": {"value": self.default_threshold, "spec": det.spec, "method": det.method,
                          "label": self._threshold_label(),
                          "bimodal": det.threshold.bimodal, "artifacts_found": det.artifacts_found,
                          "note": None if det.artifacts_found else (
                              f"no artifacts: the patch norms at block {det.layer} have no separated high-norm "
                              "mode; the threshold shown is the one the studies count with (the 99th "
                              "percentile under 'auto'), so 'outliers' are ordinary high-norm tokens")},
            "neurons": {"list": self.neurons, "note": self.neuron_note},
            "readout": {"kind": "classifier" if self.readout.classes else "embedding", "why": self.readout.why,
                        "note": self.readout.note, "classifier": self.readout.record()},
            "targets": {name: m.int().tolist() for name, m in presets.items()},
            "warnings": self.warnings,
            "sae": None if self.sae is None else self.sae.info(),
        }

    def _threshold_label(self) -> str:
        """The threshold in words, e.g. ``"352 (auto: two-mode fit)"``."""
        det, value = self.detection, self.default_threshold
        if det.method == "auto":
            how = ("auto: two-mode fit" if det.threshold.bimodal else
                   "auto found no separate high-norm mode: 99th percentile of the patch norms")
        elif det.method == "percentile":
            how = f"{det.spec}: percentile of the patch norms"
        else:
            how = "fixed"
        return f"{value:.0f} ({how})" if abs(value) >= 100 else f"{value:.3g} ({how})"

    def thumbnail(self, index: int) -> bytes:
        """PNG of image ``index`` as the model sees it (resized, cropped)."""
        from PIL import Image

        self._check_image(index)
        if index not in self._thumbs:
            pixels = (self.display[index].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="PNG")
            self._thumbs[index] = buf.getvalue()
        return self._thumbs[index]

    # ------------------------------------------------------------------ edits
    def _check_image(self, index) -> int:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.source):
            raise InterpError(f"unknown image {index!r}: this explorer holds images 0..{len(self.source) - 1}")
        return index

    def interventions(self, spec: Sequence[Dict[str, Any]]) -> list:
        """The interventions of a patch-file spec list (calibrated on the loaded images when asked; cached)."""
        check_spec(spec)
        return lru(self._parsed, edit_key(spec), lambda: self._parse(spec))

    def _parse(self, spec: list) -> list:
        if self.sae is None and any(is_sae_entry(e) for e in spec):
            raise InterpError("SAEFeatureAblation needs an SAE: start the explorer with --sae DIR")
        plain = iter(interventions_from_spec([e for e in spec if not is_sae_entry(e)], model=self.model,
                                             calibration_images=self.pixels, batch_size=self.options.batch_size))
        ivs = [self.sae.ablation(e) if is_sae_entry(e) else next(plain) for e in spec]
        from ..interventions.export import plan_swaps

        plan_swaps(self.model.timm_model, ivs)  # layers, neuron indices and target shapes, before any run
        for iv in ivs:
            target = getattr(iv, "target", None)
            if target is not None and tuple(target.shape) != self.grid:
                raise InterpError(f"relocation target is {tuple(target.shape)}, the patch grid is {self.grid}")
        return ivs

    @torch.no_grad()
    def _forward(self, index: int, ivs: list) -> Dict[str, Any]:
        """The edited forward of one image: every block's patch norms (both stages), prefix-token norms, CLS
        attention per head, the listed neurons' activation maps, the output."""
        kept: Dict[str, torch.Tensor] = {}
        shown = self._shown_neurons(ivs)
        layers = sorted({n["layer"] for n in shown})
        with self.model.intervene(*ivs):
            lay = self.model.layout_for(tuple(self.pixels.shape[-2:]))
            patches, n_prefix = lay.patch_slice, lay.n_prefix
            L, names = self.model.n_layers, self.model.block_names
            block_patches = {names.mlp_post(l): lay.for_block(l).patch_slice for l in range(L)}

            def norms(t, hook):
                kept[hook.name] = t[0].float().norm(dim=-1).cpu()  # [t]

            def cls_row(t, hook):
                kept[hook.name] = t[0, :, lay.cls_index].float().cpu()  # [H, t]

            def neuron_cols(t, hook):
                kept[hook.name] = t[0, block_patches[hook.name]].float().cpu()  # [P_l, d_mlp] on the block's grid

            hooks = [(names.resid_mid(l), norms) for l in range(L)] + [(names.resid_post(l), norms) for l in range(L)]
            if lay.cls_index is not None:
                hooks += [(names.attn_pattern(l), cls_row) for l in range(L)]
            hooks += [(names.mlp_post(l), neuron_cols) for l in layers]
            out = self.model.run_with_hooks(self._shown_batch(index, ivs), fwd_hooks=hooks)[0].float().cpu()
        stage = {s: [kept[names.resid_stage(l, s)] for l in range(L)] for s in STAGES}  # L x [t_l]
        patch = {s: [v[lay.for_block(l).patch_slice] for l, v in enumerate(rows)] for s, rows in stage.items()}
        maps = [{**n, "map": rounded(kept[names.mlp_post(n["layer"])][:, n["neuron"]])} for n in shown]
        return {
            "patch_norms": patch["resid_post"],  # L x [P_l] float32 (P_l: block l's grid)
            "curves": curves(patch),
            "prefix_norms": [row[:n_prefix].tolist() for row in stage["resid_post"]],
            "prefix_labels": self._prefix_labels(lay),
            "cls_attention": None if lay.cls_index is None else
            [rounded(kept[names.attn_pattern(l)][:, patches]) for l in range(L)],  # [L][H][P]
            "cls_attention_prefix": None if lay.cls_index is None else
            [rounded(kept[names.attn_pattern(l)][:, :n_prefix]) for l in range(L)],  # [L][H][prefix]
            "neuron_maps": maps,
            "logits": out.tolist(),
        }

    def _shown_batch(self, index: int, ivs: list) -> torch.Tensor:
        """The shown image as a batch [1, 3, H, W]; under a resample edit [2, 3, H, W]: the shown image first, then
        the next loaded image, whose values the edit gives it (the derangement of two images is their swap; the
        hooks read row 0)."""
        if not any(getattr(iv, "mode", None) == "resample" for iv in ivs):
            return self.pixels[index:index + 1]
        if len(self.pixels) < 2:
            raise InterpError("resample takes another image's values: load at least two images")
        return self.pixels[[index, (index + 1) % len(self.pixels)]]

    def _prefix_labels(self, lay) -> List[str]:
        base = self.layout
        labels = []
        for i in range(lay.n_prefix):
            if i == lay.cls_index:
                labels.append("CLS")
            elif i < base.n_prefix:
                labels.append(f"register {i - (1 if base.cls_index is not None and base.cls_index < i else 0)}")
            else:
                labels.append(f"test-time register {i - base.n_prefix}")
        return labels

    def _shown_neurons(self, ivs: list) -> List[Dict[str, int]]:
        """The listed neurons, then those the edits name, at most MAX_NEURON_MAPS."""
        seen, out = set(), []
        edited = [{"layer": l, "neuron": n} for iv in ivs for l, idx in (getattr(iv, "neurons", None) or {}).items()
                  for n in idx]
        for entry in [*({"layer": e["layer"], "neuron": e["neuron"]} for e in self.neurons), *edited]:
            key = (int(entry["layer"]), int(entry["neuron"]))
            if key not in seen and len(out) < MAX_NEURON_MAPS:
                seen.add(key)
                out.append({"layer": key[0], "neuron": key[1]})
        return out

    @torch.no_grad()
    def _outputs(self, ivs: list) -> Dict[str, torch.Tensor]:
        """Pooled vectors [N, d'] and logits [N, C] (the classifier file's class logits when the readout has
        one) of every loaded image under ``ivs``."""
        with self.lock:
            runs = [run_hooks(self.model, x, logits=True, classifier=self.readout.classifier, interventions=ivs)
                    for x in self.pixels.split(self.options.batch_size)]
        return {"pooled": torch.cat([r.pooled for r in runs]).float(), "logits": torch.cat([r.logits for r in runs])}

    def _readout(self, key: str, ivs: list) -> Dict[str, Any]:
        def compare():
            edited = self.baseline_outputs if not ivs else self._outputs(ivs)
            return compare_outputs(self.readout, self.baseline_outputs, edited)

        return lru(self._readouts, key, compare)

    def run(self, index: int, spec: Sequence[Dict[str, Any]] = (), threshold: Optional[float] = None
            ) -> Dict[str, Any]:
        """The explorer's answer for image ``index`` under the interventions of ``spec`` (patch-file spec list).

        Returns (JSON-able): ``norms`` [blocks][patches] (``hook_resid_post`` patch-token norms), ``outlier_count``
        and ``outliers`` [patches] at ``detect_layer`` above ``threshold``, ``curves`` (per block max/median patch
        norm after attention and after MLP), ``cls_attention`` [blocks][heads][patches], ``neuron_maps``,
        ``prefix_norms``, ``logits``, ``readout`` (agreement or cosine over all loaded images), ``edits`` (the
        edits in words, or "none"), and ``baseline`` (the unedited ``norms``, ``curves``, ``outlier_count``).

        Raises (as InterpError): ``BadSpec`` for a spec or threshold that is not exact (see
        :mod:`interp.explore.requests`), ``RequestTooLarge`` over its limits (interventions, ``max_seconds``).
        """
        started = time.perf_counter()
        index = self._check_image(index)
        spec = list(spec) if isinstance(spec, tuple) else spec
        thr = self.default_threshold if threshold is None else check_threshold(threshold)
        with self.lock, self._time_limit():
            ivs = self.interventions(spec)
            key = edit_key(spec)
            edited, cached = self._cached_run(index, key, ivs)
            base, _ = self._cached_run(index, edit_key([]), [])
            readout = self._readout(key, ivs)
        det = self.detection.layer
        outliers = edited["patch_norms"][det] > thr
        return {
            "image": index, "id": self.source.ids[index], "n_blocks": self.model.n_layers, "grid": list(self.grid),
            "detect_layer": det, "threshold": float(thr), "default_threshold": self.default_threshold,
            "norms": [row.tolist() for row in edited["patch_norms"]], "outlier_count": int(outliers.sum()),
            "outliers": outliers.int().tolist(), "edits": describe_edits(spec),
            **{k: v for k, v in edited.items() if k != "patch_norms"},
            "readout": readout,
            "baseline": {"norms": [row.tolist() for row in base["patch_norms"]], "curves": base["curves"],
                         "outlier_count": int((base["patch_norms"][det] > thr).sum())},
            "cached": cached, "seconds": time.perf_counter() - started,
        }

    @contextmanager
    def _time_limit(self):
        """Stop the model work inside after ``options.max_seconds`` (checked at every block's output, so also
        in calibration and the readout): a request over the limit raises RequestTooLarge."""
        limit = self.options.max_seconds
        deadline = self.clock() + limit

        def check(t, hook):
            if self.clock() > deadline:
                raise RequestTooLarge(f"this request ran past the explorer's limit of {limit:g} s and was stopped; "
                                      "ask for fewer edits, or start the explorer with a larger --max-seconds")

        with self.model.hooks(fwd_hooks=[(h, check) for h in self.model.block_names.every("hook_resid_post")]):
            yield

    def _cached_run(self, index: int, key: str, ivs: list):
        cached = (index, key) in self._runs
        return lru(self._runs, (index, key), lambda: self._forward(index, ivs)), cached

    def export(self, spec: Sequence[Dict[str, Any]]) -> bytes:
        """The patch file (``interp patch export`` format) of these interventions, as bytes."""
        import tempfile
        from pathlib import Path

        from ..interventions import export as patch

        with self.lock, self._time_limit():  # save reads the model, which another request may be editing
            ivs = self.interventions(spec)
            if not ivs:
                raise InterpError("no edits to export: switch some on first")
            with tempfile.TemporaryDirectory() as tmp:
                path = patch.save(ivs, Path(tmp) / "explore.safetensors", self.model)
                return path.read_bytes()
