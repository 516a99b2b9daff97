"""Emptied: ``interp study probes|lost|segment`` are generated from their declarations
(:mod:`interp.studies.probes.configs`, :mod:`interp.studies.objects.configs`) by :mod:`interp.commands.study`."""
