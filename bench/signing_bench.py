"""Authentic-weights figures: the trainer's cost to describe and sign one version's payload (every byte hashed as
the weight-server chunks it, then one Ed25519 signature) and a worker's cost to verify its manifest.

    .venv/bin/python bench/signing_bench.py                      # the default tiny model's 0.74 MB snapshot and 1000 MB, best of 3
    .venv/bin/python bench/signing_bench.py --mb 17 --chunk-bytes 4194304 --repeat 5

Prints one JSON line per payload size: seconds to describe (hash), to sign, to verify, and the manifest's chunks.
Verifying is independent of the payload's size but for the chunk list; the chunks' sha256s are checked while the
bytes arrive, as they were before signing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def _best(fn, repeat: int) -> float:
    return min(timeit.repeat(fn, number=1, repeat=repeat))


def bench(mb: float, chunk_bytes: int, repeat: int) -> dict[str, object]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from rlboost.weights.signing import ManifestSigner, ManifestVerifier, describe_payload

    key = Ed25519PrivateKey.generate()
    signer, verifier = ManifestSigner(key, chunk_bytes), ManifestVerifier(key.public_key())
    payload = os.urandom(int(mb * 1_000_000))
    fields = {"version": 1, "kind": "full", "base_version": None, "fmt": "safetensors", "checksum": "c" * 64}
    describe = _best(lambda: describe_payload(payload, chunk_bytes=chunk_bytes, **fields), repeat)
    manifest = describe_payload(payload, chunk_bytes=chunk_bytes, **fields)
    sign = _best(lambda: signer.sign(manifest), repeat)
    signed = manifest.model_copy(update={"signature": signer.sign(manifest)})
    verify = _best(lambda: verifier.check(signed), repeat)
    return {
        "mb": mb,
        "chunk_bytes": chunk_bytes,
        "chunks": len(manifest.chunks),
        "describe_s": round(describe, 5),
        "describe_gb_s": round(len(payload) / describe / 1e9, 2),
        "sign_s": round(sign, 6),
        "verify_s": round(verify, 6),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[0.74, 1000.0], help="payload sizes in MB")
    parser.add_argument("--chunk-bytes", type=int, default=4 << 20, help="weightSync.chunkBytes (default 4 MiB)")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()
    for mb in args.mb:
        print(json.dumps(bench(mb, args.chunk_bytes, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
