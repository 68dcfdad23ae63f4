"""The fleet example (README.md); a package so that mypy tells its modules apart."""
