"""Sub-commands of the ``interp`` CLI; each module has ``register(subparsers)``."""
