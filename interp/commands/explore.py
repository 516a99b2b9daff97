"""``interp explore [MODEL]``: serve a live page over one model's artifacts on 127.0.0.1, behind a random
access token (the printed URL carries it); every edit on the page re-runs the edited forward.

Without MODEL it explores the synthetic ``planted_vit`` on the bundled sample photos, as ``interp report`` does.
"""
from __future__ import annotations

from ..console import add_output_args
from .common import (NEURONS_SYNTAX, add_classifier_arg, add_model_args, model_from_args, parse_neurons)
from ..studies.sae.configs import SaeFeaturesConfig
from ..values import existing_path, port_number, positive_float, positive_int, threshold_arg, threshold_value

# the explorer's request limits, said in --help (interp.explore.requests, .server, .connections hold them;
# importing those here would import the web stack and torch before the arguments are checked)
LIMITS = ("Requests are bounded: at most 16 interventions each (the page sends at most 2), neuron indices that "
          "are JSON integers, a finite threshold > 0, a body of at most 16 MiB, and --max-seconds of model work "
          "(413 beyond); idle connections close after 5 s, and a Host header other than the listening address "
          "or localhost is refused (DNS-rebinding defence).")
MAX_SECONDS = 600


def register(sub) -> None:
    p = sub.add_parser(
        "explore", help="serve an interactive page: ablate neurons and watch the artifacts move",
        description="Serve a local page over MODEL and the images: per-block patch norms, the norm and CLS "
                    "attention maps, the register neurons, and edits (ablation, test-time register, relocation, "
                    "SelectiveCLS) that re-run the forward. Listens on 127.0.0.1 and prints the URL with its "
                    "access token. Without MODEL: the synthetic planted_vit on the bundled sample photos.",
        epilog=LIMITS)
    add_model_args(p, model_optional=True)
    p.add_argument("--images", default=None, type=existing_path, help="image directory, list file or image (default: bundled samples)")
    p.add_argument("--neurons", default=None, metavar="FILE|L:N,...",
                   help=f"register neurons to list: {NEURONS_SYNTAX} (default: ranked by the neurons study on start)")
    p.add_argument("--threshold", default="auto", type=threshold_arg, help="outlier threshold: a norm, pNN or auto (default)")
    p.add_argument("--detect-layer", type=int, default=None, help="block whose output decides outliers (default: last)")
    p.add_argument("--top-k", type=positive_int, default=10, help="register neurons ranked on start (default 10)")
    p.add_argument("--sae", default=None, type=existing_path, metavar="DIR",
                   help="a trained SAE's folder (interp sae train): list its artifact features with their maps "
                        "and toggle their ablation")
    add_classifier_arg(p)  # the studies' behaviour readout and label rule (interp.studies.core.behaviour)
    p.add_argument("--port", type=port_number, default=0, help="port to listen on (default 0: any free port)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; another one exposes the model to the network)")
    p.add_argument("--no-open", action="store_true", help="do not open a browser")
    p.add_argument("--max-images", type=positive_int, default=64,
                   help="refuse more images than this (they are held in memory and re-run for each edit's readout)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per forward pass (default 16)")
    p.add_argument("--max-seconds", type=positive_float, default=MAX_SECONDS,
                   help=f"stop a request's model work after this many seconds and answer 413 (default "
                        f"{MAX_SECONDS}: a toggle takes well under a second on planted_vit; raise it for a large "
                        "model on many images on a CPU)")
    add_output_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import sys
    import warnings

    from ..errors import InterpError
    from ..explore.server import LOCAL_HOSTS, ExploreServer, require_extra
    from ..explore.session import ExploreOptions, ExploreSession

    require_extra()  # before the model is built
    threshold = threshold_value(args.threshold)
    neurons = parse_neurons(args.neurons) if args.neurons is not None else None
    if args.model is None:
        if args.weights:
            raise InterpError("--weights needs a MODEL name (the default planted_vit is built by construction)")
        args.model = "planted_vit"
    if args.images is None:
        from ..models.samples import sample_image_paths

        args.images = sample_image_paths()
    if args.host not in LOCAL_HOSTS:
        warnings.warn(f"--host {args.host}: the explorer is reachable from other machines; anyone who has the "
                      "token can run the model. Use 127.0.0.1 unless you mean it")
    if args.sae is not None:
        SaeFeaturesConfig(sae=args.sae)  # a folder without sae.json fails here, before the model
    model = model_from_args(args)
    options = ExploreOptions(threshold=threshold, detect_layer=args.detect_layer, top_k=args.top_k,
                             neurons=neurons, batch_size=args.batch_size, classifier=args.classifier,
                             max_images=args.max_images,
                             max_seconds=args.max_seconds, sae=args.sae)
    # status lines go to stderr, as interp report's stage lines do (stdout stays free); --quiet drops them
    if args.progress_requested:
        print(f"interp explore: preparing {args.model} (unedited runs, detection, neuron ranking)...",
              file=sys.stderr, flush=True)
    session = ExploreSession(model, args.images, options, progress=args.progress)
    for text in session.warnings:
        warnings.warn(text, stacklevel=1)  # one line on stderr: "interp: warning: ..."
    server = ExploreServer(session, host=args.host, port=args.port)
    try:
        # the URL goes to stderr too, as Jupyter's does, and also under --quiet (it is what the command gives)
        print(f"interp explore: {len(session.source)} images; serving on {server.host}:{server.port} (Ctrl-C "
              f"stops)\n    {server.url}", file=sys.stderr, flush=True)
        if not args.no_open:
            import webbrowser

            webbrowser.open(server.url)
        server.serve()
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then re-raises it
        pass
    finally:
        server.stop()  # the socket, also when something above failed before serving
    print("interp explore: stopped", file=sys.stderr)
    return 0
