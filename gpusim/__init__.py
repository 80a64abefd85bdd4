"""gpusim: predict deep-learning training time and cost on hardware you may not own."""
