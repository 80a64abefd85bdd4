"""Planning: a training job lowered to kernels, and its memory plan."""
