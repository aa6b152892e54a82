"""Generation engines behind one interface (base.Engine): `torch` now, `sglang` later."""
