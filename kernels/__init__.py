"""Shipped kernel plug-ins by target: a plug-in folder found by path, never imported by name."""
