"""The data plane: how gradients travel (see :mod:`gradsched.runtime.comm.exchange`)."""
