"""Trainers: ``gradsched.integrations.lightning`` (a Lightning strategy) and
``gradsched.integrations.accelerate`` (Accelerate's ``prepare`` with gradsched). Each is
imported on its own, and needs its extra: ``pip install 'gradsched[lightning]'`` or
``'gradsched[accelerate]'``."""
