"""Stand-alone reproductions of the streamjobs defects the soak found (tests/soak/README.md).

Run from the repository root, e.g. ``.venv/bin/python -m tests.soak.repro.stale_assignment``.
"""
