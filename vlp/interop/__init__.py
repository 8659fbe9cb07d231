"""Checkpoint interoperability with other code bases (official ALBEF: :mod:`vlp.interop.albef`)."""
