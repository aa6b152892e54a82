"""weight_server service."""
