"""solfleet operators: numba.cuda kernels with float64 numpy references, and the node-side commands
`python -m kernels info | verify | bench | health`."""

__version__ = "0.1.0"
