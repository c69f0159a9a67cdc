"""Cell entry points, one module per kind of measurement, each a small CLI.

Run as ``python -m lmperf.cells.<kind> --output results/<device>/<kind>/<cell>.json …``;
each writes exactly one record (see ``lmperf.record``).
"""
