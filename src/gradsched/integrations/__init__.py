"""Trainers: ``gradsched.integrations.lightning`` (a Lightning strategy),
``gradsched.integrations.accelerate`` (an Accelerate ``Accelerator`` with gradsched) and
``gradsched.integrations.transformers`` (the Hugging Face ``Trainer`` with gradsched). Each is
imported on its own, and needs its extra: ``pip install 'gradsched[lightning]'`` or
``'gradsched[accelerate]'`` (Accelerate and transformers)."""
