"""The SimPy simulation of training steps, and its trace."""
