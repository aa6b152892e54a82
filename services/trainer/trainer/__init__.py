"""trainer service."""
