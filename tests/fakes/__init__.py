"""In-memory fakes for fast tests that need no Redis."""
