"""``interp explore [MODEL]``: serve a live page over one model's artifacts on 127.0.0.1, behind a random
access token (the printed URL carries it); every edit on the page re-runs the edited forward.

Without MODEL it explores the synthetic ``planted_vit`` on the bundled sample photos, as ``interp report`` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..detection.spec import DetectionSpec
from ..errors import InterpWarning
from ..options import Options, group, option
from ..studies.core.options import ClassifierFile
from ..studies.sae.configs import SaeFeaturesConfig
from ..values import NEURONS_SYNTAX, port_number, positive_float, positive_int
from ..paths import existing_path
from .common import load_model, parse_neurons
from .groups import DemoModelOptions, Images, OutputOptions, SeedOption, batch_size_option
from .inputs import RunInputs, command

PLANTED = "planted_vit"  # MODEL when none is given: the synthetic demo
# the explorer's request limits, said in --help (interp.explore.requests, .server, .connections hold them;
# importing those here would import the web stack and torch before the arguments are checked)
LIMITS = ("Requests are bounded: at most 16 interventions each (the page sends at most 2), neuron indices that "
          "are JSON integers, a finite threshold > 0, a body of at most 16 MiB, and --max-seconds of model work "
          "(413 beyond); idle connections close after 5 s, and a Host header other than the listening address "
          "or localhost is refused (DNS-rebinding defence).")
MAX_SECONDS = 600


@dataclass(frozen=True, kw_only=True)
class ExploreOptions(Options):
    """The options of ``interp explore``."""

    model: DemoModelOptions = group(DemoModelOptions)
    seed: SeedOption = group(SeedOption)
    source: Images = group(Images)
    neurons: Optional[str] = option(None, f"register neurons to list: {NEURONS_SYNTAX} (default: ranked by the "
                                          "neurons study on start)", metavar="FILE|L:N,...")
    detection: DetectionSpec = group(DetectionSpec)
    top_k: int = option(10, "register neurons ranked on start (default 10)", parse=positive_int)
    sae: Optional[str] = option(None, "a trained SAE's folder (interp sae train): list its artifact features with "
                                      "their maps and toggle their ablation", parse=existing_path, metavar="DIR")
    classifier: ClassifierFile = group(ClassifierFile)
    port: int = option(0, "port to listen on (default 0: any free port)", parse=port_number)
    host: str = option("127.0.0.1", "address to listen on (default 127.0.0.1; another one exposes the model to "
                                    "the network)")
    no_open: bool = option(False, "do not open a browser")
    max_images: int = option(64, "refuse more images than this (they are held in memory and re-run for each "
                                 "edit's readout)", parse=positive_int)
    batch_size: int = batch_size_option(16)
    max_seconds: float = option(
        MAX_SECONDS, f"stop a request's model work after this many seconds and answer 413 (default {MAX_SECONDS}: "
                     "a toggle takes well under a second on planted_vit; raise it for a large model on many "
                     "images on a CPU)", parse=positive_float)
    output: OutputOptions = group(OutputOptions)


HELP = {"images": "image directory, list file or image (default: bundled samples)"}


def register(sub) -> None:
    command(sub, "explore", ExploreOptions, run, option_help=HELP,
            help="serve an interactive page: ablate neurons and watch the artifacts move",
            description="Serve a local page over MODEL and the images: per-block patch norms, the norm and CLS "
                        "attention maps, the register neurons, and edits (ablation, test-time register, relocation, "
                        "SelectiveCLS) that re-run the forward. Listens on 127.0.0.1 and prints the URL with its "
                        "access token. Without MODEL: the synthetic planted_vit on the bundled sample photos.",
            epilog=LIMITS)


def run(options: ExploreOptions, inputs: RunInputs) -> int:
    import sys
    import warnings

    from ..errors import InterpError
    from ..explore.server import LOCAL_HOSTS, ExploreServer, require_extra
    from ..explore.session import ExploreOptions as SessionOptions, ExploreSession

    o = options
    require_extra()  # before the model is built
    neurons = parse_neurons(o.neurons) if o.neurons is not None else None
    spec = inputs.model.named(PLANTED, error=InterpError)
    images = o.source.images
    if images is None:
        from ..models.inputs.samples import sample_image_paths

        images = sample_image_paths()
    if o.host not in LOCAL_HOSTS:
        warnings.warn(f"--host {o.host}: the explorer is reachable from other machines; anyone who has the "
                      "token can run the model. Use 127.0.0.1 unless you mean it", InterpWarning)
    if o.sae is not None:
        SaeFeaturesConfig(sae=o.sae)  # a folder without sae.json fails here, before the model
    o.detection.resolved()  # an unknown --preset: refused before the model
    model = load_model(inputs, (o,), spec=spec)
    session_options = SessionOptions(detection=o.detection, top_k=o.top_k, neurons=neurons,
                                     batch_size=o.batch_size, classifier=o.classifier.classifier,
                                     max_images=o.max_images, max_seconds=o.max_seconds, sae=o.sae)
    # status lines go to stderr, as interp report's stage lines do (stdout stays free); --quiet drops them
    if inputs.stage_lines:
        print(f"interp explore: preparing {spec.name} (unedited runs, detection, neuron ranking)...",
              file=sys.stderr, flush=True)
    session = ExploreSession(model, images, session_options, progress=inputs.stage_lines)
    for text in session.warnings:
        warnings.warn(text, InterpWarning, stacklevel=1)  # one line on stderr: "interp: warning: ..."
    server = ExploreServer(session, host=o.host, port=o.port)
    try:
        # the URL goes to stderr too, as Jupyter's does, and also under --quiet (it is what the command gives)
        print(f"interp explore: {len(session.source)} images; serving on {server.host}:{server.port} (Ctrl-C "
              f"stops)\n    {server.url}", file=sys.stderr, flush=True)
        if not o.no_open:
            import webbrowser

            webbrowser.open(server.url)
        server.serve()
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then re-raises it
        pass
    finally:
        server.stop()  # the socket, also when something above failed before serving
    print("interp explore: stopped", file=sys.stderr)
    return 0
