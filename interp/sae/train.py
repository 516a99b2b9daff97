"""``interp.sae.train``: train an overcomplete SAE on one hook's activations, streamed from a cache or the model.

The loop is interp's own, around overcomplete's modules and the architectures' losses (:mod:`.modules`: per-token
MSE, L1 / L0 / AuxK / Matryoshka terms): overcomplete's ``train_sae`` iterates a dataloader for whole epochs and
keeps no state to resume from (no checkpoint of the optimiser, the step or the data position) and calls
``model.get_dictionary()`` on the module it is given, which a DDP wrapper hides. Each step is the same arithmetic
as ``train_sae`` given the architecture's loss (forward, loss, backward, gradient clipping at ``clip_grad``, Adam
step), tested step for step against it. AuxK's dead features (no firing for ``dead_window`` steps) come from the
loop's firing record, all-reduced across processes.

Example (not run as a doctest: it needs a trained SAE)::

    result = interp.sae.train(model, "blocks.3.hook_resid_post", "runs/sae", cache="acts.h5", steps=300)
    result["metrics"]["held_out"]["explained_variance"] > 0.5

"""
from __future__ import annotations

import io
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

from .._progress import tqdm
from ..cache.lock import LockHeld, WriterLock
from ..errors import InterpError, UsageError
from . import modules as sae_modules
from ..sae_settings import SAE_CHECKPOINT, SAE_CONFIG, SAE_CURVE, TrainSettings, check_sae_size
from .data import TokenStream
from .files import write_atomic
from .evaluate import held_out_loss_recovered
from .model import SAE, save
from .setup import RunData, describe_detection, prepare_data, same_data, stats_over, world
from ..interventions.sae_features import SparseCodes

CURVE_KEYS = ("step", "loss", "explained_variance", "l0", "dead_fraction")


def _state_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _all_mean(values: torch.Tensor, n_ranks: int) -> torch.Tensor:
    if n_ranks > 1:
        torch.distributed.all_reduce(values)
        values /= n_ranks
    return values


def train(model, hook: str, out, *, cache=None, images=None, resume: bool = False, overwrite: bool = False,
          checkpoint_every: int = 100, progress: bool = True, image_batch: int = 32, **settings) -> Dict[str, Any]:
    """Train an SAE on ``hook`` of ``model`` and write ``out/sae.safetensors``, ``out/sae.json``, the
    training-curve figure ``out/training_curve.png`` and, every ``checkpoint_every`` steps, ``out/checkpoint.pt``.

    Args:
        model: the ``HookedViT`` (its fingerprint goes into ``sae.json``; a cache of another model is refused).
        hook: e.g. ``"blocks.3.hook_resid_post"``.
        cache / images: an HDF5 cache holding ``hook`` (``interp cache``), or images run live through the model.
        resume: continue from ``out/checkpoint.pt`` (same settings; ``steps`` may grow).
        overwrite: replace an existing run in ``out``.
        settings: :class:`TrainSettings` fields (arch, expansion, k, tokens, high_norm, steps, tokens_per_step, ...).

    Returns:
        the ``sae.json`` content (rank 0 writes the files under ``torchrun``).
    """
    unknown = set(settings) - {f.name for f in fields(TrainSettings)}
    if unknown:
        raise InterpError(f"unknown SAE setting(s) {sorted(unknown)}; known: {[f.name for f in fields(TrainSettings)]}")
    cfg = TrainSettings(**settings)
    cfg.check()
    sae_modules.overcomplete()  # the one-line install hint before any data is read
    out = Path(out)
    device = next(model.parameters()).device  # the SAE trains where the model runs
    rank, n_ranks = world(device)
    if cfg.data_shards % n_ranks:
        raise InterpError(f"--data-shards {cfg.data_shards} must be a multiple of the {n_ranks} processes")
    ckpt_path = out / SAE_CHECKPOINT
    if not resume and not overwrite and ((out / SAE_CONFIG).exists() or ckpt_path.exists()):
        raise InterpError(f"{str(out)!r} already holds an SAE run; pass --resume to continue it or --overwrite to "
                          "replace it")
    lock = _lock_run(out) if rank == 0 else None
    try:
        return _train_locked(model, hook, out, cfg, cache, images, resume, checkpoint_every, progress, image_batch,
                             device, rank, n_ranks)
    finally:
        if lock is not None:
            lock.release()


def _lock_run(out: Path):
    """Take ``out``'s writer lock (``out/sae.json.lock``, the cache's flock): one training run per folder at a
    time; a second is refused in one line. The kernel drops the lock when its process dies (kill -9)."""

    try:
        out.mkdir(parents=True, exist_ok=True)
        return WriterLock(out / SAE_CONFIG).acquire()
    except LockHeld as e:
        raise InterpError(f"--out {str(out)!r} is being trained into by another interp run ({e.holder}); wait for "
                          "it to finish or choose another --out") from None
    except OSError as e:
        raise InterpError(f"--out {str(out)!r}: cannot create the folder or its lock file ({e.strerror or e}); "
                          "choose a writable folder on an ordinary disk") from None


def _refuse_finished_run(out: Path, cfg: "TrainSettings") -> None:
    """``--resume`` into a folder that holds a finished SAE and no checkpoint: there is nothing to continue, and
    training would silently replace that SAE (perhaps trained with other settings)."""
    import json

    try:
        saved = json.loads((out / SAE_CONFIG).read_text(encoding="utf-8")).get("training") or {}
    except (OSError, ValueError, AttributeError, RecursionError):
        saved = {}
    now = asdict(cfg)
    differ = [k for k in now if isinstance(saved, dict) and k in saved and saved[k] != now[k]]
    what = (f"trained with other settings ({', '.join(f'{k}={saved[k]!r}' for k in differ[:6])})" if differ
            else "finished")
    raise InterpError(f"{str(out)!r} holds an SAE {what} and no {SAE_CHECKPOINT} to continue: --resume has nothing "
                      "to do; pass --overwrite to replace that SAE, or choose another --out")


def _train_locked(model, hook, out, cfg, cache, images, resume, checkpoint_every, progress, image_batch, device,
                  rank, n_ranks):
    ckpt_path = out / SAE_CHECKPOINT
    if resume and not ckpt_path.exists() and (out / SAE_CONFIG).exists():
        _refuse_finished_run(out, cfg)
    state = _read_checkpoint(ckpt_path, cfg) if resume and ckpt_path.exists() else None
    out.mkdir(parents=True, exist_ok=True)

    data = prepare_data(model, hook, cfg, cache=cache, images=images, rank=rank, n_ranks=n_ranks,
                        image_batch=image_batch)
    if state is not None and not same_data(state["data"], data.signature):
        raise InterpError(f"{str(ckpt_path)!r} was trained on other data ({state['data']}); resume with the "
                          "same cache/images, or start again with --overwrite")
    per_rank = cfg.data_shards // n_ranks
    stream = TokenStream(data.train, data.counts[data.train], data.read_tokens, cfg.seed, cfg.window_images,
                         cfg.tokens_per_step, cfg.data_shards, range(rank * per_rank, (rank + 1) * per_rank))
    norm = data.norm
    torch.manual_seed(cfg.seed)
    n_features = cfg.expansion * data.rows.d
    check_sizes(cfg, n_features, int(data.counts[data.train].sum()))
    arch = sae_modules.architecture(cfg.arch)(cfg)
    module = arch.build(data.rows.d, n_features, cfg.tokens_per_step // n_ranks,
                        data.points).to(device)  # built on the CPU: the same weights on any device
    net = module
    if n_ranks > 1:
        net = torch.nn.parallel.DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None)
    optimiser = torch.optim.Adam(module.parameters(), lr=cfg.lr)
    curve = {key: [] for key in CURVE_KEYS}
    last_fired = torch.zeros(n_features, dtype=torch.int64)
    start = 0
    if state is not None:
        module.load_state_dict(state["module"])
        if state.get("running_threshold") is not None:
            module.running_threshold = state["running_threshold"].reshape(()).to(device)
        optimiser.load_state_dict(state["optimiser"])
        curve, last_fired, start = state["curve"], state["last_fired"], state["step"]
        torch.set_rng_state(state["rng"])

    module.train()
    bar = tqdm(total=cfg.steps, initial=start, disable=not progress or rank != 0, desc=f"SAE {cfg.arch} @ {hook}",
               unit="step", leave=False)
    try:
        for step in range(start, cfg.steps):
            x = norm.apply(stream.batch(step)).to(device)
            optimiser.zero_grad()
            pre_codes, codes, x_hat = net(x)
            # AuxK's dead features: no firing for dead_window steps, counted from the start
            dead_aux = ((step - last_fired) >= cfg.dead_window).to(device)
            loss, _ = arch.loss(x, pre_codes, codes, x_hat, module, module.get_dictionary(), dead_aux)
            loss.backward()
            if cfg.clip_grad:
                torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.clip_grad)
            optimiser.step()
            with torch.no_grad():
                sse = (x - x_hat).square().sum()
                sst = (x - x.mean(0)).square().sum()
                stats = _all_mean(torch.stack([loss.detach(), 1 - sse / sst, (codes > 0).sum(1).float().mean()]),
                                  n_ranks)
                fired = (codes > 0).any(0).to(torch.int64)
                if n_ranks > 1:
                    torch.distributed.all_reduce(fired, op=torch.distributed.ReduceOp.MAX)
                last_fired[fired.bool().cpu()] = step + 1
                dead = float(dead_mask(last_fired, step + 1, cfg.dead_window).float().mean())
            for key, value in zip(CURVE_KEYS, (step + 1, *stats.tolist(), dead)):
                curve[key].append(value)
            bar.update(1)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{curve['loss'][-1]:.4g}", ev=f"{curve['explained_variance'][-1]:.3f}",
                                l0=f"{curve['l0'][-1]:.1f}", dead=f"{dead:.2f}")
            if (step + 1) % checkpoint_every == 0 and step + 1 < cfg.steps:
                state = {"settings": asdict(cfg), "data": data.signature, "step": step + 1,
                         "module": module.state_dict(), "running_threshold": sae_modules.running_threshold(module),
                         "optimiser": optimiser.state_dict(), "curve": curve, "last_fired": last_fired,
                         "rng": torch.get_rng_state()}
                if rank == 0:
                    write_atomic(ckpt_path, _state_bytes(state), "SAE checkpoint")
                if n_ranks > 1:
                    torch.distributed.barrier()
    finally:
        bar.close()
    result = _finish(module, arch, cfg, data, curve, last_fired, out, rank, n_ranks, model)
    if n_ranks > 1:
        torch.distributed.barrier()
    return result


def check_sizes(cfg: TrainSettings, n_features: int, n_tokens: int) -> None:
    """Settings that only the data can bound: ``k`` within the SAE's features, a step's batch within the training
    tokens, the SAE's size within :data:`~interp.values.MAX_SAE_WEIGHTS` (one-line UsageError naming the most that
    fits)."""
    check_sae_size(cfg.expansion, n_features // cfg.expansion)
    if sae_modules.architecture(cfg.arch).uses_k and cfg.k > n_features:
        raise UsageError(f"--k {cfg.k} is more than the SAE's {n_features} features (--expansion {cfg.expansion} x "
                         f"width {n_features // cfg.expansion}); give --k <= {n_features} (SAEs use 8-64)")
    if cfg.tokens_per_step > n_tokens:
        raise UsageError(f"--tokens-per-step {cfg.tokens_per_step} is more than the {n_tokens} training tokens of this "
                         f"data (a step would repeat tokens); give --tokens-per-step <= {n_tokens}, or more images")


def _read_checkpoint(path: Path, cfg: TrainSettings) -> Dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        saved = dict(state["settings"])
        if "batch_size" in saved and "tokens_per_step" not in saved:  # written before the setting had its own name
            saved["tokens_per_step"] = saved.pop("batch_size")
        step = int(state["step"])
    except Exception as e:  # a damaged checkpoint: say so in one line
        raise InterpError(f"cannot read the checkpoint {str(path)!r} ({type(e).__name__}); delete it and start "
                          "again with --overwrite") from None
    now = asdict(cfg)
    differ = [k for k in now if k != "steps" and saved.get(k) != now[k]]
    if differ:
        raise InterpError(f"{str(path)!r} was trained with other settings ({', '.join(f'{k}={saved.get(k)!r}' for k in differ)}); "
                          "resume with the same settings or start again with --overwrite")
    if step > cfg.steps:
        raise InterpError(f"{str(path)!r} is at step {step}, past --steps {cfg.steps}; give --steps >= {step}")
    return state


def dead_mask(last_fired: torch.Tensor, steps: int, window: int) -> torch.Tensor:
    """Bool [n]: features dead after ``steps`` steps: never fired (``last_fired`` 0), or not in the last
    ``window`` steps (``last_fired``: the step count when each last fired)."""
    return (last_fired == 0) | ((steps - last_fired) >= window)


MIN_EXPLAINED_VARIANCE = 0.5  # below it the SAE's features describe too little of the hook to be read
MAX_DEAD_FRACTION = 0.5  # above it most of the dictionary is wasted


def quality_warnings(stats: Dict[str, Any], dead_fraction: float, where: str) -> List[str]:
    """One sentence per failed check of a trained SAE: explained variance below ``MIN_EXPLAINED_VARIANCE`` on
    ``where`` tokens, or more than ``MAX_DEAD_FRACTION`` of the features dead at the end of training."""
    out = []
    ev = stats.get("explained_variance")
    if ev is None or ev < MIN_EXPLAINED_VARIANCE:
        shown = "undefined" if ev is None else f"{ev:.3f}"
        out.append(f"{where} explained variance {shown} < {MIN_EXPLAINED_VARIANCE}: the SAE reconstructs too little "
                   "of the hook; train longer (--steps), or lower the sparsity penalty / raise --k")
    if dead_fraction > MAX_DEAD_FRACTION:
        out.append(f"{dead_fraction:.0%} of the features are dead at the end of training (> "
                   f"{MAX_DEAD_FRACTION:.0%}): lower --expansion or the learning rate, or train longer")
    return out


def _finish(module, arch, cfg: TrainSettings, data: RunData, curve, last_fired, out: Path, rank: int,
            n_ranks: int, model=None) -> Dict[str, Any]:
    """Held-out metrics, feature means, and (rank 0) the SAE files and the curve figure (``n_ranks``: the
    processes that trained it, recorded); rank 0 also measures the loss recovered on the held-out images of
    ``model`` (``metrics.held_out.loss_recovered``; :func:`~interp.sae.evaluate.held_out_loss_recovered`)."""
    from . import curve as curve_figure

    tensors = {k: v.cpu() for k, v in sae_modules.encoder_tensors(module, arch).items()}
    tensors.update({"mean": data.norm.mean, "scale": torch.tensor([data.norm.scale])})
    codes = SparseCodes(arch.codes, tensors, arch.k)
    train_stats = stats_over(codes, tensors["dictionary"], data, data.norm_images)
    tensors["feature_means"] = train_stats["feature_means"]
    held = stats_over(codes, tensors["dictionary"], data, data.holdout) if len(data.holdout) else None
    window = max(1, min(len(curve["step"]), 20))
    config = {
        "arch": cfg.arch, "codes": arch.codes, "k": arch.k,
        "n_features": codes.n_features, "d": codes.d, "hook": data.hook, "model": data.model,
        "tokens": cfg.tokens, "high_norm": cfg.high_norm,
        "layout": {"cls_index": data.rows.layout.cls_index, "n_registers": data.rows.layout.n_registers}, "detection": describe_detection(data.detection),
        "normalisation": data.norm.to_dict(), "data": data.signature, "training": asdict(cfg), "processes": n_ranks,
        "metrics": {
            "final": {key: float(np.mean(curve[key][-window:])) for key in CURVE_KEYS[1:]} if curve["step"] else {},
            "dead_fraction_window_steps": cfg.dead_window,
            "dead_features": int(dead_mask(last_fired, len(curve["step"]), cfg.dead_window).sum()),
            "train_sample": {k: v for k, v in train_stats.items() if k != "feature_means"},
            "held_out": None if held is None else {k: v for k, v in held.items() if k != "feature_means"},
        },
        "warnings": quality_warnings(held or train_stats, float(dead_mask(last_fired, len(curve["step"]),
                                                                           cfg.dead_window).float().mean()),
                                     "held-out" if held is not None else "training-sample"),
        "curve": curve,
    }
    if rank == 0 and held is not None and model is not None:
        config["metrics"]["held_out"]["loss_recovered"] = held_out_loss_recovered(SAE(config, tensors), model,
                                                                                  data.rows, data.holdout)
    if rank == 0:
        save(out, config, tensors)
        if curve["step"]:
            curve_figure.draw(curve, out / SAE_CURVE, f"{cfg.arch} SAE, {data.hook}, "
                              f"{codes.n_features} features", auxk_from=cfg.dead_window if arch.auxk else None)
    return config

