"""A job's identities: the credentials every service proves itself with (credentials.py)."""
