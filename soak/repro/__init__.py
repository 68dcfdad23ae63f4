"""Stand-alone reproductions of the streamjobs defects the soak found (soak/README.md).

Run from the repository root, e.g. ``.venv/bin/python -m soak.repro.stale_assignment``.
"""
