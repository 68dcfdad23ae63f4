"""The shared_group example (README.md); a package so that mypy tells its modules apart."""
