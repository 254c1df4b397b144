"""Shipped pattern library: a plug-in folder found by path (``*.pdl.mlir`` and ``*.yaml``)."""
