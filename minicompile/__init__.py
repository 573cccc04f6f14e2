"""minicompile: a small deep-learning compiler for PyTorch programs."""
