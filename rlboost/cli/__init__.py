"""The `rlboost` command line."""
