"""Weights as data: canonical checksums and safetensors payloads (torch imported lazily)."""
